// GPT-J on CUDA devices (label cuda): the tensor ops through CudaKernels, several mesh devices
// sharing one GPU (virtual devices, the device transport) or a GPU each (NCCL). Each check runs
// the same steps on the CPU backend and compares: CUDA f32 within 1e-3 of the CPU (different
// summation orders, no TF32), bf16 within bf16's precision; hand = auto; mesh independence; a
// short bf16 run whose loss falls. Exits 77 (skipped) without a GPU; listing needs no GPU.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <nax/nax.h>

#include <cmath>
#include <cstdio>

#include "../examples/gptj/config.h"
#include "../examples/gptj/learner.h"
#include "../examples/gptj/model.h"
#include "gptj_helpers.h"
#include "runtime/cuda_devices.h"

using namespace nax;

namespace {

struct Run {
  std::vector<double> losses, grad_norms;
};

RuntimeOptions on(Backend backend, Transport transport = Transport::automatic) {
  RuntimeOptions options;
  options.backend = backend;
  options.transport = transport;
  return options;
}

// `steps` Learner steps of `config` on a fixed batch; every device returns the same values.
Run train(const std::string& config_name, const gptj::TrainOptions& options, RuntimeOptions runtime, int steps) {
  Runtime rt = Runtime::local(Mesh::parse(options.mesh), std::move(runtime));
  const gptj::Config config = gptj::padded_for(gptj::config_by_name(config_name), rt.mesh());
  auto runs = rt.run([&](Shard& s) {
    const AxisRules rules = gptj::axis_rules(s.mesh());
    gptj::Learner learner(s, config, rules, options);
    std::vector<std::int32_t> tokens;
    for (std::int64_t i = 0; i < options.batch * (options.seq + 1); ++i)
      tokens.push_back(static_cast<std::int32_t>((i * 7919 + i / 5 + 13) % config.vocab));
    const Tensor all = s.shard(from_vector(Shape{{"batch", options.batch}, {"seq", options.seq + 1}}, tokens, DType::i32), rules);
    const Tensor ids = slice(all, "seq", 0, options.seq), targets = slice(all, "seq", 1, options.seq + 1);
    Run run;
    for (int step = 0; step < steps; ++step) {
      const auto stats = learner.step(ids, targets, options.lr);
      run.losses.push_back(stats.loss);
      run.grad_norms.push_back(stats.grad_norm);
    }
    return run;
  });
  return runs[0];
}

void require_close(const std::vector<double>& got, const std::vector<double>& want, double tolerance) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("value " << i << ": got " << got[i] << ", want " << want[i]);
    REQUIRE(std::isfinite(got[i]));
    REQUIRE(std::abs(got[i] - want[i]) <= tolerance * std::max(1.0, std::abs(want[i])));
  }
}

gptj::TrainOptions small_options(const std::string& mesh, const std::string& sharding, DType dtype) {
  gptj::TrainOptions o = nax::testing::tiny(mesh, 3, sharding);
  o.batch = 8, o.seq = 64, o.dtype = dtype;
  return o;
}

}  // namespace

TEST_CASE("CUDA f32 training steps equal the CPU's", "[cuda][gptj]") {
  for (const char* mesh : {"dp=1,mp=1", "dp=2,mp=2"}) {
    INFO("mesh " << mesh);
    const auto options = small_options(mesh, "hand", DType::f32);
    const Run cpu = train("small", options, on(Backend::cpu), 3);
    const Run gpu = train("small", options, on(Backend::cuda), 3);
    require_close(gpu.losses, cpu.losses, 1e-3);
    require_close(gpu.grad_norms, cpu.grad_norms, 1e-3);
  }
}

TEST_CASE("CUDA: virtual devices on one GPU, hand = auto and mesh independence", "[cuda][gptj]") {
  const Run one = train("small", small_options("dp=1,mp=1", "hand", DType::f32), on(Backend::cuda), 3);
  const Run hand = train("small", small_options("dp=2,mp=4", "hand", DType::f32), on(Backend::cuda, Transport::device), 3);
  const Run automatic = train("small", small_options("dp=2,mp=4", "auto", DType::f32), on(Backend::cuda, Transport::device), 3);
  require_close(hand.losses, one.losses, 1e-4);
  require_close(automatic.losses, hand.losses, 1e-4);
  require_close(automatic.grad_norms, hand.grad_norms, 1e-3);
}

TEST_CASE("CUDA bf16 training tracks f32 and its loss falls", "[cuda][gptj]") {
  auto options = small_options("dp=2,mp=2", "hand", DType::bf16);
  const Run f32 = train("small", small_options("dp=2,mp=2", "hand", DType::f32), on(Backend::cuda), 3);
  const Run bf16 = train("small", options, on(Backend::cuda), 3);
  require_close(bf16.losses, f32.losses, 2e-2);
  options.steps = 30;
  const Run longer = train("small", options, on(Backend::cuda), 30);
  REQUIRE(longer.losses.back() < 0.8 * longer.losses.front());
}

int main(int argc, char** argv) {
  if (nax::detail::cuda_gpu_count() == 0) {
    std::puts("no CUDA device: skipping the GPT-J cuda tests");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
