// Devices whose memory the host cannot read (as a GPU's), tested on the CPU with the remote
// double of tests/remote_device.h: every op must go through the device's kernels (a stray host
// read faults), results must equal the CPU backend's bit for bit, and the device transport (what
// virtual GPUs use) must give the same collectives as the host one.
#include <catch2/catch.hpp>

#include <nax/nax.h>

#include "gptj_helpers.h"
#include "helpers.h"
#include "remote_device.h"
#include "runtime/cuda_devices.h"

using namespace nax;
using Catch::Matchers::Contains;

namespace {

RuntimeOptions remote_options() {
  RuntimeOptions options;
  options.device_factory = testing::make_remote_device;
  options.transport = Transport::device;
  return options;
}

// Every collective's result on each device, as host values, for one runtime.
std::vector<std::vector<double>> collective_results(Runtime rt) {
  return rt.run([](Shard& s) {
    const AxisRules rules{{"rows", "dp"}, {"cols", "mp"}};
    const Tensor x = s.random_normal(Shape{{"rows", 4}, {"cols", 6}, {"k", 4}}, rules, 7, "x");
    const Tensor partial = sum(x, "cols") * (1.0 + s.coord("mp"));  // Varying over mp
    std::vector<double> out;
    auto append = [&](const Tensor& t) {
      for (double v : t.to_vector<double>()) out.push_back(v);
    };
    append(psum(partial, "mp"));
    append(pmax(partial, "mp"));
    append(all_gather(x, "mp", "cols"));
    append(psum_scatter(partial, "mp", "k"));
    append(all_to_all(x, "mp", "k", "cols"));
    append(ppermute(x, "mp", {{0, 1}, {1, 0}}));
    append(s.gather(x));
    return out;
  });
}

}  // namespace

TEST_CASE("the device transport gives the host transport's collectives, bit for bit", "[devices]") {
  const Mesh mesh = Mesh::parse("dp=2,mp=2");
  RuntimeOptions device_on_cpu;
  device_on_cpu.transport = Transport::device;
  const auto host = collective_results(Runtime::local(mesh));
  CHECK(collective_results(Runtime::local(mesh, device_on_cpu)) == host);
  CHECK(collective_results(Runtime::local(mesh, remote_options())) == host);
}

TEST_CASE("GPT-J trains on remote devices exactly as on the CPU (no host access to device memory)", "[devices]") {
  const std::string sharding = GENERATE("hand", "auto");
  const gptj::TrainOptions options = testing::tiny("dp=2,mp=2", 2, sharding);
  const auto on_cpu = testing::learner_steps(Runtime::local(Mesh::parse(options.mesh)), options, 2);
  const auto on_remote = testing::learner_steps(Runtime::local(Mesh::parse(options.mesh), remote_options()), options, 2);
  CHECK(on_remote == on_cpu);
}

TEST_CASE("runtime options that cannot work are refused with the reason", "[devices][errors]") {
  const Mesh mesh = Mesh::parse("dp=2");
  RuntimeOptions host_on_remote = remote_options();
  host_on_remote.transport = Transport::host;
  REQUIRE_THROWS_WITH(Runtime::local(mesh, host_on_remote), Contains("transport host reads peers' memory from host code"));
  RuntimeOptions nccl_on_cpu;
  nccl_on_cpu.transport = Transport::nccl;
  REQUIRE_THROWS_WITH(Runtime::local(mesh, nccl_on_cpu), Contains("transport nccl needs the cuda backend, not cpu"));
  RuntimeOptions cuda;
  cuda.backend = Backend::cuda;
  if (detail::cuda_gpu_count() == 0) REQUIRE_THROWS_WITH(Runtime::local(mesh, cuda), Contains("backend cuda for mesh dp=2"));
}

namespace {

// Remote kernels whose reductions fail: a device that breaks in the middle of a collective.
class BrokenReduction final : public testing::RemoteKernels {
 public:
  void accumulate(ReduceOp, DType, void*, const void*, std::size_t) override { fail("accumulate", "the device broke"); }
};

}  // namespace

TEST_CASE("a device failing inside a device-transport collective releases its peers with its error", "[devices][errors]") {
  RuntimeOptions options = remote_options();
  options.device_factory = [](int d) {
    if (d != 1) return testing::make_remote_device(d);
    return std::make_shared<Device>(d, Backend::cpu, std::make_shared<testing::RemoteAllocator>(), std::make_shared<BrokenReduction>());
  };
  Runtime rt = Runtime::local(Mesh::parse("dp=4"), options);
  // Device 1 fails after every device has joined the all-reduce; the others wait at its next step.
  REQUIRE_THROWS_WITH(rt.run([](Shard& s) { psum(pvary(s.full(Shape{{"x", 64}}, {}, 1.0), "dp") * (1.0 + s.device()), "dp"); }),
                      Contains("the device broke"));
  // The runtime stays usable (of a one-element value device 1 reduces no slice, so nothing breaks).
  rt.run([](Shard& s) { NAX_EXPECT(pmax(pvary(s.full(Shape{}, {}, 1.0), "dp") * (1.0 + s.device()), "dp").item() == 4.0); });
}

TEST_CASE("bf16 training on a device that computes bf16 itself matches the CPU's widened bf16", "[devices][bf16]") {
  // The op layer's bf16-native paths (CUDA's: no widening, f32 attention lse and layer_norm
  // statistics) against the CPU's: both round to bf16 at the same points, so only the order of
  // a few f32 sums may differ.
  const std::string sharding = GENERATE("hand", "auto");
  gptj::TrainOptions options = testing::tiny("dp=2,mp=2", 2, sharding);
  options.dtype = DType::bf16;
  RuntimeOptions native;
  native.device_factory = testing::make_bf16_remote_device;
  native.transport = Transport::device;
  const auto on_cpu = testing::learner_steps(Runtime::local(Mesh::parse(options.mesh)), options, 2);
  const auto native_bf16 = testing::learner_steps(Runtime::local(Mesh::parse(options.mesh), native), options, 2);
  INFO("cpu " << Catch::Detail::stringify(on_cpu.losses) << "\nnative " << Catch::Detail::stringify(native_bf16.losses));
  REQUIRE(nax::testing::max_rel_error(native_bf16.losses, on_cpu.losses) <= 1e-6);
  REQUIRE(nax::testing::max_rel_error(native_bf16.grad_norms, on_cpu.grad_norms) <= 1e-6);
}
