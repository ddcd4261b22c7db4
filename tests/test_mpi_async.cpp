// Start/wait collectives on the MPI runtime under mpirun -np 2 and -np 4: every start form, several
// in flight, and gradients through them give what the thread runtime gives on the same mesh; a
// mismatched start and a Pending never waited for are errors on every process, and the runtime
// goes on. Expectations run inside the run (one failing device fails it on every process).
#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "helpers.h"

using namespace nax;
using nax::testing::groups_of;
using Catch::Matchers::Contains;

namespace {

int world_size() { return process_count(); }

std::vector<std::string> meshes() {
  switch (world_size()) {
    case 2: return {"mp=2", "dp=2,mp=1"};
    case 4: return {"mp=4", "dp=2,mp=2"};
    default: return {fmt::format("mp={}", world_size())};
  }
}

Tensor varying_input(Shard& s, const Shape& shape) {
  return pvary(s.shard(random_normal(shape, 29, fmt::format("x{}", s.device()), 1.0, DType::f64), {}), s.mesh().axis_names());
}

std::vector<std::pair<int, int>> ring(int n) {
  std::vector<std::pair<int, int>> pairs;
  for (int r = 0; r < n; ++r) pairs.push_back({r, (r + 1) % n});
  return pairs;
}

// A program of started collectives over `axes`: its results, laid end to end.
std::vector<double> started_program(Shard& s, const std::vector<std::string>& axes) {
  const Shape shape{{"a", 4}, {"b", 3}};
  const int n = axis_size(axes);
  const Tensor x = varying_input(s, shape);
  Pending<Tensor> summed = start_psum(x, axes);
  Pending<Tensor> gathered = start_all_gather(x, axes, "b");
  Pending<Tensor> shifted = start_ppermute(x, axes, ring(n));
  Pending<Tensor> scattered = start_psum_scatter(x, axes, "a");
  std::vector<double> out;
  for (Pending<Tensor>* p : {&shifted, &scattered, &summed, &gathered}) {
    const auto v = p->wait().to_vector<double>();
    out.insert(out.end(), v.begin(), v.end());
  }
  // A gradient through started collectives.
  auto [loss, grads] = value_and_grad(
      [&](const std::vector<Tensor>& p) {
        const Tensor gathered_sum = sum(start_all_gather(p[0], axes, "a").wait() * 2.0, {"a", "b"});
        const Tensor shifted_dot = sum(start_ppermute(p[0] * p[0], axes, ring(n)).wait() * p[0], {"a", "b"});
        const Tensor total = start_psum(gathered_sum + shifted_dot, axes).wait();
        std::vector<std::string> others;  // x varies over every mesh axis: the loss is summed over all
        for (const auto& m : s.mesh().axis_names())
          if (std::find(axes.begin(), axes.end(), m) == axes.end()) others.push_back(m);
        return others.empty() ? total : psum(total, others);
      },
      {x}, {.allow_varying_loss = true});  // summed over `axes` only: still per-device over the others
  const auto g = grads[0].to_vector<double>();
  out.insert(out.end(), g.begin(), g.end());
  out.push_back(loss.item());
  return out;
}

}  // namespace

TEST_CASE("mpi: start forms, several in flight and their gradients match the thread runtime", "[mpi][async]") {
  for (const auto& spec : meshes()) {
    const Mesh mesh = Mesh::parse(spec);
    Runtime threads = Runtime::local(mesh), mpi = Runtime::mpi(mesh);
    for (const auto& axes : groups_of(mesh)) {
      auto want = threads.run([&](Shard& s) { return started_program(s, axes); });
      REQUIRE_NOTHROW(mpi.run([&](Shard& s) {
        const auto got = started_program(s, axes);
        const double error = nax::testing::max_rel_error(got, want[static_cast<std::size_t>(s.device())]);
        if (!(error <= 1e-12))
          throw std::runtime_error(fmt::format("mesh {} over {}: device {} differs from the thread runtime by {:g}", spec,
                                               Names(axes).str(), s.device(), error));
      }));
    }
  }
}

TEST_CASE("mpi: a mismatched start or an unwaited Pending is an error on every process, and the runtime goes on", "[mpi][async][errors]") {
  Runtime rt = Runtime::mpi(Mesh::parse(meshes().front()));
  REQUIRE_THROWS_WITH(rt.run([](Shard& s) {
                        Pending<Tensor> p = start_psum(pvary(ones(Shape{{"i", 4 + s.device() % 2}}), "mp"), "mp");
                        static_cast<void>(p.wait());
                      }),
                      Contains("collective mismatch in group (mp) of devices") && Contains("but device 1 called start_psum(f32[i=5]") &&
                          Contains("all_reduce(sum, f32 x 5)"));
  REQUIRE_THROWS_WITH(rt.run([](Shard&) { Pending<Tensor> p = start_ppermute(pvary(ones(Shape{{"i", 4}}), "mp"), "mp", ring(axis_size("mp"))); }),
                      Contains("destroyed without wait()") && Contains("test_mpi_async.cpp"));
  auto sums = rt.run([](Shard&) { return start_psum(pvary(ones(Shape{{"i", 2}}), "mp"), "mp").wait().to_vector<float>(); });
  REQUIRE(sums[static_cast<std::size_t>(process_index())] == std::vector<float>(2, static_cast<float>(world_size())));
}

// An unwaited start found after the program returned must not abort the others while they still
// wait for the same collective (MPI cannot cancel what they would leave pending): they finish,
// then fail with its reason, and the runtime stays usable. The others are slowed down so that the
// failing device ends first, which used to release their waits and leave the runtime unusable.
TEST_CASE("mpi: a device failing after its program returned lets the others finish, then fails them", "[mpi][async][errors]") {
  Runtime rt = Runtime::mpi(Mesh::parse(meshes().front()));
  auto failing_run = [&] {
    rt.run([](Shard& s) {
      // Large enough for MPI's rendezvous: a send completes only with its receiver.
      Pending<Tensor> p = start_ppermute(pvary(ones(Shape{{"i", 1 << 22}}), "mp"), "mp", ring(axis_size("mp")));
      if (s.device() == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      static_cast<void>(p.wait());
    });
  };
  // Device 0 reports its own error; the others, device 0's.
  if (process_index() == 0) REQUIRE_THROWS_WITH(failing_run(), Contains("destroyed without wait()"));
  else REQUIRE_THROWS_WITH(failing_run(), Contains("device 0 failed") && Contains("destroyed without wait()"));
  auto sums = rt.run([](Shard&) { return start_psum(pvary(ones(Shape{{"i", 2}}), "mp"), "mp").wait().to_vector<float>(); });
  REQUIRE(sums[static_cast<std::size_t>(process_index())] == std::vector<float>(2, static_cast<float>(world_size())));
}
