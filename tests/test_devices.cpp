// Devices whose memory the host cannot read (as a GPU's), tested on the CPU with the remote
// double of tests/remote_device.h: every op must go through the device's kernels (a stray host
// read faults), results must equal the CPU backend's bit for bit, and the device transport (what
// virtual GPUs use) must give the same collectives as the host one.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>

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
    const Tensor partial = sum(x, "cols") * (1.0 + s.coord("mp"));  // a partial sum over mp
    std::vector<double> out;
    auto append = [&](const Tensor& t) {
      for (double v : t.to_vector<double>()) out.push_back(v);
    };
    append(psum(partial, "mp"));
    append(pmax(as_varying(x, "mp"), "mp"));
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

TEST_CASE("deterministic mode on remote devices (the device transport, as on GPUs) gives the CPU's 1x1 bits on any mesh",
          "[devices][deterministic]") {
  const std::string sharding = GENERATE("hand", "auto");
  RuntimeOptions cpu;
  cpu.deterministic = true;
  RuntimeOptions remote = remote_options();
  remote.deterministic = true;
  const gptj::TrainOptions one = testing::tiny("dp=1,mp=1", 2, sharding);
  const auto on_cpu = testing::learner_steps(Runtime::local(Mesh::parse(one.mesh), cpu), one, 2);
  for (const std::string mesh : {"dp=2,mp=2", "dp=1,mp=4"}) {
    INFO("mesh " << mesh);
    const gptj::TrainOptions o = testing::tiny(mesh, 2, sharding);
    CHECK(testing::learner_steps(Runtime::local(Mesh::parse(mesh), remote), o, 2) == on_cpu);
  }
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

namespace {
// Remote kernels that count the copies from device memory to the host: each is a host
// synchronisation on a GPU.
class CountingReads final : public testing::RemoteKernels {
 public:
  explicit CountingReads(std::atomic<int>& reads) : reads_(reads) {}
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    ++reads_;
    RemoteKernels::copy_to_host(dst, src, bytes);
  }

 private:
  std::atomic<int>& reads_;
};
}  // namespace

TEST_CASE("a training step reads device memory on the host only for the logged loss", "[devices]") {
  std::array<std::atomic<int>, 2> reads{};
  RuntimeOptions options = remote_options();
  options.device_factory = [&](int d) {
    return std::make_shared<Device>(d, Backend::cpu, std::make_shared<testing::RemoteAllocator>(),
                                    std::make_shared<CountingReads>(reads[static_cast<std::size_t>(d)]));
  };
  const gptj::TrainOptions o = testing::tiny("dp=1,mp=2", 3);
  Runtime rt = Runtime::local(Mesh::parse(o.mesh), options);
  const gptj::Config config = gptj::padded_for(gptj::config_by_name(o.config), rt.mesh());
  const auto per_step = rt.run([&](Shard& s) {
    const AxisRules rules = gptj::axis_rules(s.mesh());
    gptj::Learner learner(s, config, rules, o);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(o.batch * (o.seq + 1)));
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>((i * 31 + 7) % 200);
    const Tensor all = s.shard(from_vector(Shape{{"batch", o.batch}, {"seq", o.seq + 1}}, tokens, DType::i32), rules);
    const Tensor ids = slice(all, "seq", 0, o.seq), targets = slice(all, "seq", 1, o.seq + 1);
    learner.step(ids, targets, o.lr);  // the first step builds caches
    const int before = reads[static_cast<std::size_t>(s.device())];
    learner.step(ids, targets, o.lr);
    return reads[static_cast<std::size_t>(s.device())] - before;
  });
  // The loss is read once, at the end of the step; right after it (the device is drained by then)
  // the count of ids and targets outside the vocabulary, checked on the device. The clipping norm
  // stays on the device.
  for (int n : per_step) REQUIRE(n == 2);
}

TEST_CASE("ids outside the vocabulary on a device are reported at the next host read, with the host's message", "[devices][errors]") {
  Runtime rt = Runtime::local(Mesh::parse("x=1"), remote_options());
  rt.run([](Shard& s) {
    const Tensor table = s.random_normal(Shape{{"vocab", 6}, {"d", 4}}, {}, 1, "table");
    const Tensor ids = s.shard(from_vector(Shape{{"batch", 2}, {"seq", 2}}, std::vector<std::int32_t>{0, 1, 6, 2}, DType::i32), {});
    const Tensor rows = embedding(table, ids, "vocab");  // no host read yet: the check waits on the device
    bool thrown = false;
    try {
      (void)sum(rows, {"batch", "seq", "d"}).item();
    } catch (const Error& e) {
      const std::string what = e.what();
      thrown = what.find("embedding") != std::string::npos && what.find("id 6 at [batch=1, seq=0]") != std::string::npos &&
               what.find("outside the vocabulary [0, 6)") != std::string::npos;
    }
    NAX_EXPECT(thrown);
    NAX_EXPECT(sum(rows, {"batch", "seq", "d"}).item() == sum(rows, {"batch", "seq", "d"}).item());  // reported once
  });
}
