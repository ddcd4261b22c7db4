// The MPI runtime under mpirun -np 2 and -np 4: every collective gives what the thread runtime
// gives on the same mesh (1-D and 2-D meshes, groups over one and two mesh axes, inner tensor
// axes, partial permutations, f64/f32/bf16/i32), stats are recorded alike, gather works across
// processes, and misuse (mismatched collectives, a device that skips one, a timeout, a failing
// device) raises an error on every process instead of hanging. Every check runs on all processes;
// expectations are checked inside the run (NAX_EXPECT), so that a failure on one device fails the
// run, and so the test, on every process.
#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "core/shared_host_memory.h"
#include "helpers.h"

using namespace nax;
using nax::testing::groups_of;
using Catch::Matchers::Contains;

namespace {

int world_size() { return process_count(); }

// Meshes with one device per process: 1-D and 2-D, axes of size 1 included.
std::vector<std::string> meshes() {
  switch (world_size()) {
    case 2: return {"mp=2", "dp=1,mp=2", "dp=2,mp=1"};
    case 4: return {"mp=4", "dp=2,mp=2", "mp=2,dp=2", "dp=4,mp=1"};
    default: return {fmt::format("mp={}", world_size())};
  }
}

Tensor input_of(int device, const Shape& shape, DType dtype) {
  Tensor x = random_normal(shape, 17, fmt::format("x{}", device), 1.0, DType::f64);
  return dtype == DType::i32 ? cast(x * 10.0, DType::i32) : cast(x, dtype);
}

// The device's own value, Varying over every mesh axis.
Tensor varying_input(Shard& s, const Shape& shape, DType dtype = DType::f64) {
  return pvary(s.shard(input_of(s.device(), shape, dtype), {}), s.mesh().axis_names());
}

double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  return nax::testing::max_rel_error(got, want);  // NaN-safe (comparison.h); no Catch2 macro, so usable on any thread
}

// The thread runtime and the MPI runtime on one mesh.
struct Both {
  explicit Both(const std::string& spec) : mesh(Mesh::parse(spec)), threads(Runtime::local(mesh)), mpi(Runtime::mpi(mesh)) {}
  Mesh mesh;
  Runtime threads, mpi;

  // Runs `collective` on both; this process's device must get what the same device gets on threads.
  template <typename F>
  void check(const std::string& what, F collective, double tol) {
    auto want = threads.run([&](Shard& s) { return collective(s).template to_vector<double>(); });
    REQUIRE_NOTHROW(mpi.run([&](Shard& s) {
      const double error = relative_error(collective(s).template to_vector<double>(), want[static_cast<std::size_t>(s.device())]);
      if (!(error <= tol))
        throw std::runtime_error(fmt::format("{} on mesh {}: device {} differs from the thread runtime by {:g} (tolerance {:g})", what,
                                             mesh.str(), s.device(), error, tol));
    }));
  }
};

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64: return 1e-12;
    case DType::f32: return 1e-6;
    case DType::bf16: return 1e-2;  // pairwise bf16 rounding, possibly in another order
    default: return 0;
  }
}

}  // namespace

TEST_CASE("mpi: reductions match the thread runtime", "[mpi][collectives]") {
  for (const auto& spec : meshes()) {
    Both both(spec);
    for (const auto& axes : groups_of(both.mesh)) {
      const std::string group = Names(axes).str();
      for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::i32}) {
        const std::string where = fmt::format("over {} in {}", group, dtype_name(dtype));
        const Shape shape{{"a", 3}, {"b", 5}};
        both.check("psum " + where, [&](Shard& s) { return psum(varying_input(s, shape, dtype), axes); }, tolerance(dtype));
        both.check("pmax " + where, [&](Shard& s) { return pmax(varying_input(s, shape, dtype), axes); }, 0);
        both.check("pmin " + where, [&](Shard& s) { return pmin(varying_input(s, shape, dtype), axes); }, 0);
      }
      both.check("pmean over " + group, [&](Shard& s) { return pmean(varying_input(s, Shape{{"i", 7}}), axes); }, 1e-12);
      both.check("psum of 100k f32 over " + group, [&](Shard& s) { return psum(varying_input(s, Shape{{"i", 100000}}, DType::f32), axes); },
                 1e-6);
    }
  }
}

TEST_CASE("mpi: all_gather, psum_scatter and all_to_all match the thread runtime on leading and inner axes", "[mpi][collectives]") {
  for (const auto& spec : meshes()) {
    Both both(spec);
    for (const auto& axes : groups_of(both.mesh)) {
      const int n = both.mesh.group_size(axes);
      const std::string group = Names(axes).str();
      const Shape shape{{"a", 2 * n}, {"b", 3 * n}, {"c", 2}};
      for (DType dtype : {DType::f64, DType::bf16}) {
        for (const std::string axis : {"a", "b"}) {
          const std::string where = fmt::format("over {} along {} in {}", group, axis, dtype_name(dtype));
          both.check("all_gather " + where, [&](Shard& s) { return all_gather(varying_input(s, shape, dtype), axes, axis); }, 0);
          both.check("all_gather_invariant " + where,
                     [&](Shard& s) { return all_gather_invariant(varying_input(s, shape, dtype), axes, axis); }, 0);
          both.check("psum_scatter " + where, [&](Shard& s) { return psum_scatter(varying_input(s, shape, dtype), axes, axis); },
                     tolerance(dtype));
        }
      }
      both.check("all_gather onto a new axis over " + group, [&](Shard& s) { return all_gather_stacked(varying_input(s, shape), axes, "stack"); }, 0);
      for (auto [split, concat_axis] : {std::pair<std::string, std::string>{"b", "a"}, {"b", "c"}, {"a", "b"}}) {
        both.check(fmt::format("all_to_all split {} concat {} over {}", split, concat_axis, group),
                   [&](Shard& s) { return all_to_all(varying_input(s, shape), axes, split, concat_axis); }, 0);
      }
    }
  }
}

TEST_CASE("mpi: large reductions and gathers read the peers' buffers on one host and give the thread runtime's bits",
          "[mpi][collectives]") {
  // 131101 elements: above the single-copy size in every dtype and not a multiple of any group
  // size, so the members' blocks differ in length. The sums add the ranks in the thread runtime's
  // order, so even f32 and bf16 must match it bit for bit.
  const std::int64_t n_elements = 131101;
  for (const auto& spec : meshes()) {
    Both both(spec);
    both.mpi.run([&](Shard& s) {
      for (const auto& axes : groups_of(s.mesh()))
        if (s.mesh().group_size(axes) > 1 && s.comm(axes).describe().find("single copy") == std::string::npos)
          throw std::runtime_error("the MPI communicator of " + Names(axes).str() + " did not take the single-copy path on one host");
    });
    for (const auto& axes : groups_of(both.mesh)) {
      const int n = both.mesh.group_size(axes);
      const std::string group = Names(axes).str();
      for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::i32}) {
        const std::string where = fmt::format("of {} {} over {}", n_elements, dtype_name(dtype), group);
        const Shape shape{{"i", n_elements}};
        both.check("psum " + where, [&](Shard& s) { return psum(varying_input(s, shape, dtype), axes); }, 0);
        both.check("pmax " + where, [&](Shard& s) { return pmax(varying_input(s, shape, dtype), axes); }, 0);
        both.check("pmin " + where, [&](Shard& s) { return pmin(varying_input(s, shape, dtype), axes); }, 0);
      }
      const Shape cut{{"a", 2 * n}, {"i", 40000}};
      both.check("psum_scatter of 80000 f32 rows over " + group,
                 [&](Shard& s) { return psum_scatter(varying_input(s, cut, DType::f32), axes, "a"); }, 0);
      both.check("all_gather along an inner axis over " + group,
                 [&](Shard& s) { return all_gather(varying_input(s, Shape{{"a", 3}, {"i", 30000}}, DType::f32), axes, "i"); }, 0);
    }
  }
}

TEST_CASE("mpi: single-copy all_reduce in place, through the Communicator", "[mpi][collectives]") {
  for (const auto& spec : meshes()) {
    Both both(spec);
    for (const auto& axes : groups_of(both.mesh)) {
      const auto count = std::int64_t{100003};
      both.check(fmt::format("in-place all_reduce of {} f32 over {}", count, Names(axes).str()), [&](Shard& s) {
        std::vector<float> data = input_of(s.device(), Shape{{"i", count}}, DType::f32).to_vector<float>();
        s.comm(axes).all_reduce(data.data(), data.data(), data.size(), DType::f32, ReduceOp::sum, Call{"test all_reduce"});
        return from_vector(Shape{{"i", count}}, std::vector<double>(data.begin(), data.end()));
      }, 0);
    }
  }
}

TEST_CASE("mpi: large tensors live in shared blocks the peers read in place, and a block freed and made again is read anew",
          "[mpi][collectives]") {
  const Mesh mesh = Mesh::parse(fmt::format("mp={}", world_size()));
  Runtime mpi = Runtime::mpi(mesh);
  const auto n = static_cast<std::size_t>(world_size());
  REQUIRE_NOTHROW(mpi.run([&](Shard& s) {
    const Tensor x = varying_input(s, Shape{{"i", 131101}}, DType::f32);
    NAX_EXPECT(shared_host_memory::segment_of(x.raw(), x.nbytes()).has_value());
    // Each round makes a new block (its own allocator), likely under the fd number of the block
    // the round before freed: a peer reading a mapping made for the old block would add stale
    // values. More rounds than a communicator keeps mappings, so old ones are dropped on the way.
    const std::size_t count = shared_host_memory::kMinBytes / sizeof(float) + 4099;
    Communicator& comm = s.comm("mp");
    for (int round = 0; round < 300; ++round) {
      const auto allocator = make_caching_host_allocator();
      auto* data = static_cast<float*>(allocator->allocate(count * sizeof(float)));
      NAX_EXPECT(shared_host_memory::segment_of(data, count * sizeof(float)).has_value());
      for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<float>(round * 16 + s.device() + (i % 7));
      comm.all_reduce(data, data, count, DType::f32, ReduceOp::sum, Call{"test all_reduce"});
      for (std::size_t i = 0; i < count; i += 997) {
        const double want = static_cast<double>(n) * (round * 16 + static_cast<double>(i % 7)) + static_cast<double>(n * (n - 1) / 2);
        if (data[i] != want)
          throw std::runtime_error(fmt::format("round {}: element {} is {}, not {}", round, i, data[i], want));
      }
      allocator->deallocate(data, count * sizeof(float));
    }
  }));
}

TEST_CASE("mpi: large collectives with the signature check off, and with NAX_MPI_SINGLE_COPY=0 (Open MPI's own)", "[mpi][collectives]") {
  const Mesh mesh = Mesh::parse(meshes().front());
  const Shape shape{{"i", 131101}};
  auto program = [&](Shard& s) {
    const Tensor x = varying_input(s, shape, DType::f32);
    std::vector<double> all;
    for (const Tensor& y : {psum(x, "mp"), psum_scatter(slice(x, "i", 0, 131100), "mp", "i"), all_gather(x, "mp", "i")}) {
      const auto values = y.to_vector<double>();
      all.insert(all.end(), values.begin(), values.end());
    }
    return all;
  };
  const auto want = Runtime::local(mesh).run(program);
  const auto mine = static_cast<std::size_t>(process_index());
  {
    Runtime unchecked = Runtime::mpi(mesh, {.check_collectives = false});
    REQUIRE(relative_error(unchecked.run(program)[mine], want[mine]) == 0);
  }
  ::setenv("NAX_MPI_SINGLE_COPY", "0", 1);  // every process, while its runtime makes the communicators
  Runtime plain = Runtime::mpi(mesh);
  const auto got = plain.run([&](Shard& s) {
    NAX_EXPECT(s.comm("mp").describe().find("single copy") == std::string::npos);
    return program(s);
  });
  ::unsetenv("NAX_MPI_SINGLE_COPY");
  REQUIRE(relative_error(got[mine], want[mine]) <= 1e-6);
}

TEST_CASE("mpi: ppermute rings, shifts and partial permutations match the thread runtime", "[mpi][collectives]") {
  for (const auto& spec : meshes()) {
    Both both(spec);
    for (const auto& axes : groups_of(both.mesh)) {
      const int n = both.mesh.group_size(axes);
      std::vector<std::vector<std::pair<int, int>>> perms(5);
      for (int r = 0; r < n; ++r) perms[0].push_back({r, (r + 1) % n});      // ring forward
      for (int r = 0; r < n; ++r) perms[1].push_back({r, (r + n - 1) % n});  // ring backward
      for (int r = 0; r + 1 < n; r += 2) perms[2].push_back({r + 1, r});     // partial: odd ranks to even
      perms[3].push_back({0, n - 1});                                        // one pair (a self-pair when n = 1)
      for (int r = 0; r < n; ++r) perms[4].push_back({r, r});                // identity
      for (const auto& pairs : perms) {
        std::vector<std::string> text;
        for (auto [src, dst] : pairs) text.push_back(fmt::format("{}->{}", src, dst));
        both.check(fmt::format("ppermute [{}] over {}", fmt::join(text, " "), Names(axes).str()),
                   [&](Shard& s) { return ppermute(varying_input(s, Shape{{"a", 2}, {"b", 3}}), axes, pairs); }, 0);
      }
    }
  }
}

TEST_CASE("mpi: broadcast and barrier through the Communicator match the thread runtime", "[mpi][collectives]") {
  for (const auto& spec : meshes()) {
    Both both(spec);
    for (const auto& axes : groups_of(both.mesh)) {
      const int n = both.mesh.group_size(axes);
      for (int root : {0, n - 1}) {
        both.check(fmt::format("broadcast from {} over {}", root, Names(axes).str()), [&](Shard& s) {
          Communicator& c = s.comm(axes);
          const Call call{"test broadcast"};
          c.barrier(call);
          std::vector<double> send = input_of(s.device(), Shape{{"i", 9}}, DType::f64).to_vector<double>(), recv(9, -1.0);
          c.broadcast(send.data(), recv.data(), recv.size(), DType::f64, root, call);
          c.broadcast(send.data(), send.data(), send.size(), DType::f64, root, call);  // in place
          NAX_EXPECT(send == recv);
          return from_vector(Shape{{"i", 9}}, recv);
        }, 0);
      }
    }
  }
}

TEST_CASE("mpi: communicators record calls and bytes as the thread runtime's do", "[mpi][runtime]") {
  for (const auto& spec : meshes()) {
    Both both(spec);
    auto program = [&](Shard& s) {
      Tensor x = varying_input(s, Shape{{"i", 4 * s.mesh().size()}});
      for (const auto& axes : groups_of(s.mesh())) {
        psum(x, axes);
        all_gather(x, axes, "i");
        psum_scatter(x, axes, "i");
        all_to_all(x, axes, "i", "i");
        ppermute(x, axes, {{0, axis_size(axes) - 1}});
        s.comm(axes).barrier();
      }
    };
    both.threads.run(program);
    REQUIRE_NOTHROW(both.mpi.run(program));
    const int d = both.mpi.local_devices().front();
    const auto want = both.threads.comm_stats_by_axes(d), got = both.mpi.comm_stats_by_axes(d);
    REQUIRE(got.size() == want.size());
    for (const auto& [axes, stats] : want) {
      INFO("mesh " << spec << " group " << axes);
      REQUIRE(got.at(axes).calls == stats.calls);
      REQUIRE(got.at(axes).bytes == stats.bytes);
    }
  }
}

TEST_CASE("mpi: one device per process; gather rebuilds the global tensor in every process", "[mpi][runtime]") {
  const Mesh mesh = Mesh::parse(meshes().back());
  Runtime rt = Runtime::mpi(mesh);
  REQUIRE(rt.local_devices() == std::vector<int>{process_index()});
  const Tensor global = random_normal(Shape{{"a", 2 * mesh.size()}, {"b", 3}}, 5, "g");
  const AxisRules rules{{"a", mesh.axis_names()}};
  auto results = rt.run([&](Shard& s) {
    NAX_EXPECT(Shard::current() == &s);
    NAX_EXPECT(s.device() == process_index());
    Tensor block = s.shard(global, rules);
    NAX_EXPECT(block.shape().size("a") == 2);
    return s.gather(block).to_vector<double>();
  });
  REQUIRE(results.size() == static_cast<std::size_t>(mesh.size()));
  for (int d = 0; d < mesh.size(); ++d) {
    if (d == process_index()) REQUIRE(results[static_cast<std::size_t>(d)] == global.to_vector<double>());
    else REQUIRE(results[static_cast<std::size_t>(d)].empty());  // another process's slot
  }
  const int other = (process_index() + 1) % mesh.size();
  REQUIRE_THROWS_WITH(rt.comm_stats(other), Contains("runs in another MPI process"));
  REQUIRE_THROWS_WITH(rt.memory(other), Contains("runs in another MPI process"));
}

TEST_CASE("mpi: a world size other than the mesh's is refused", "[mpi][errors]") {
  REQUIRE_THROWS_WITH(Runtime::mpi(Mesh::parse(fmt::format("x={}", world_size() + 1))),
                      Contains(fmt::format("has {} devices but mpirun started {} processes", world_size() + 1, world_size())));
}

TEST_CASE("mpi: processes that disagree on deterministic mode's options are refused on every process", "[mpi][errors]") {
  using Catch::Matchers::Contains;
  const Mesh mesh = Mesh::parse(meshes()[0]);
  const bool first = process_index() == 0;
  REQUIRE_THROWS_WITH(Runtime::mpi(mesh, {.deterministic = true, .deterministic_max_cut = first ? 8 : 16}),
                      Contains("max cut") && Contains("NAX_DETERMINISTIC_MAX_CUT") && Contains("from 8 to 16"));
  REQUIRE_THROWS_WITH(Runtime::mpi(mesh, {.deterministic = first}), Contains("deterministic is on in some processes"));
  Runtime agreed = Runtime::mpi(mesh, {.deterministic = true, .deterministic_max_cut = 16});  // and then it goes on
  REQUIRE(agreed.mesh().size() == world_size());
}

TEST_CASE("mpi: mismatched collectives raise the same error on every process, and the runtime goes on", "[mpi][errors]") {
  Runtime rt = Runtime::mpi(Mesh::parse(meshes().front()));
  REQUIRE_THROWS_WITH(rt.run([](Shard& s) { psum(pvary(ones(Shape{{"i", 4 + s.device() % 2}}), "mp"), "mp"); }),
                      Contains("collective mismatch in group (mp) of devices") && Contains("but device 1 called psum(f32[i=5]") &&
                          Contains("all_reduce(sum, f32 x 5)"));
  REQUIRE_THROWS_WITH(rt.run([](Shard& s) {
                        Tensor x = pvary(ones(Shape{{"i", 4}}), "mp");
                        if (s.device() == 0) psum(x, "mp");
                        else all_gather(x, "mp", "i");
                      }),
                      Contains("collective mismatch") && Contains("all_gather"));
  // Nothing was left pending: the same runtime runs again.
  auto sums = rt.run([](Shard&) { return psum(pvary(ones(Shape{{"i", 2}}), "mp"), "mp").to_vector<float>(); });
  REQUIRE(sums[static_cast<std::size_t>(process_index())] == std::vector<float>(2, static_cast<float>(world_size())));
}

TEST_CASE("mpi: a device that finishes without calling a collective fails the run on every process", "[mpi][errors]") {
  const Mesh mesh = Mesh::parse(meshes().front());
  Runtime rt = Runtime::mpi(mesh);
  auto skip_on_device_0 = [](Shard& s) {
    Tensor x = pvary(ones(Shape{{"i", 4}}), "mp");
    psum(x, "mp");  // the group exists everywhere
    if (s.device() != 0) psum(x, "mp");
  };
  if (process_index() == 0)
    REQUIRE_THROWS_WITH(rt.run(skip_on_device_0), Contains("failed: psum"));  // a peer's message
  else
    REQUIRE_THROWS_WITH(rt.run(skip_on_device_0), Contains("cannot complete: device 0 finished its program without calling it"));
  // Collectives were left pending: this runtime refuses to run again, a new one works.
  REQUIRE_THROWS_WITH(rt.run([](Shard&) {}), Contains("make a new Runtime::mpi"));
  Runtime fresh = Runtime::mpi(mesh);
  REQUIRE_NOTHROW(fresh.run([](Shard&) { psum(pvary(ones(Shape{{"i", 4}}), "mp"), "mp"); }));
}

TEST_CASE("mpi: a collective that waits past the timeout fails on every process", "[mpi][errors]") {
  const Mesh mesh = Mesh::parse(meshes().front());
  Runtime rt = Runtime::mpi(mesh, {.collective_timeout_s = 0.5});
  const auto start = std::chrono::steady_clock::now();
  auto late_device_1 = [](Shard& s) {
    Tensor x = pvary(ones(Shape{{"i", 4}}), "mp");
    psum(x, "mp");  // on time
    if (s.device() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    psum(x, "mp");
  };
  // The late device hears of the timeout from a peer ("the run is aborting"), or, on a loaded
  // machine, times out itself in the next collective: either way the message names the timeout.
  if (process_index() == 1)
    REQUIRE_THROWS_WITH(rt.run(late_device_1), Contains("timed out after 0.5 s"));
  else if (process_index() == 0)
    REQUIRE_THROWS_WITH(rt.run(late_device_1), Contains("psum(f32[i=4] varying{mp}, mp)") && Contains("timed out after 0.5 s") &&
                                                   Contains("NAX_COLLECTIVE_TIMEOUT_S"));
  else
    REQUIRE_THROWS_WITH(rt.run(late_device_1), Contains("timed out after 0.5 s"));
  REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE("mpi: an error on one device releases the others with its message", "[mpi][errors]") {
  Runtime rt = Runtime::mpi(Mesh::parse(meshes().front()));
  auto fail_on_last = [](Shard& s) {
    if (s.device() == s.mesh().size() - 1) fail("test", "device {} gives up", s.device());
    psum(pvary(ones(Shape{{"i", 4}}), "mp"), "mp");
  };
  REQUIRE_THROWS_WITH(rt.run(fail_on_last), Contains(fmt::format("test: device {} gives up", world_size() - 1)));
}

TEST_CASE("mpi: with the signature check off, matching collectives still work", "[mpi][collectives]") {
  const Mesh mesh = Mesh::parse(meshes().front());
  Runtime threads = Runtime::local(mesh);
  Runtime rt = Runtime::mpi(mesh, {.check_collectives = false});
  auto program = [](Shard& s) { return psum(varying_input(s, Shape{{"i", 16}}), "mp").to_vector<double>(); };
  const auto want = threads.run(program);
  const auto got = rt.run(program);
  REQUIRE(relative_error(got[static_cast<std::size_t>(process_index())], want[static_cast<std::size_t>(process_index())]) <= 1e-12);
}
