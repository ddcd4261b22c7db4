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

#include "gptj_helpers.h"
#include "runtime/cuda_devices.h"

using namespace nax;

namespace {

using nax::testing::StepValues;

RuntimeOptions on(Backend backend, Transport transport = Transport::automatic) {
  RuntimeOptions options;
  options.backend = backend;
  options.transport = transport;
  return options;
}

StepValues train(const gptj::TrainOptions& options, RuntimeOptions runtime, int steps) {
  return nax::testing::learner_steps(Runtime::local(Mesh::parse(options.mesh), std::move(runtime)), options, steps);
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
  o.config = "small", o.batch = 8, o.seq = 64, o.dtype = dtype;
  return o;
}

}  // namespace

TEST_CASE("CUDA f32 training steps equal the CPU's", "[cuda][gptj]") {
  for (const char* mesh : {"dp=1,mp=1", "dp=2,mp=2"}) {
    INFO("mesh " << mesh);
    const auto options = small_options(mesh, "hand", DType::f32);
    const StepValues cpu = train(options, on(Backend::cpu), 3);
    const StepValues gpu = train(options, on(Backend::cuda), 3);
    require_close(gpu.losses, cpu.losses, 1e-3);
    require_close(gpu.grad_norms, cpu.grad_norms, 1e-3);
  }
}

TEST_CASE("CUDA: virtual devices on one GPU, hand = auto and mesh independence", "[cuda][gptj]") {
  const StepValues one = train(small_options("dp=1,mp=1", "hand", DType::f32), on(Backend::cuda), 3);
  const StepValues hand = train(small_options("dp=2,mp=4", "hand", DType::f32), on(Backend::cuda, Transport::device), 3);
  const StepValues automatic = train(small_options("dp=2,mp=4", "auto", DType::f32), on(Backend::cuda, Transport::device), 3);
  require_close(hand.losses, one.losses, 1e-4);
  require_close(automatic.losses, hand.losses, 1e-4);
  require_close(automatic.grad_norms, hand.grad_norms, 1e-3);
}

TEST_CASE("CUDA bf16 training tracks f32 and its loss falls", "[cuda][gptj]") {
  auto options = small_options("dp=2,mp=2", "hand", DType::bf16);
  const StepValues f32 = train(small_options("dp=2,mp=2", "hand", DType::f32), on(Backend::cuda), 3);
  const StepValues bf16 = train(options, on(Backend::cuda), 3);
  require_close(bf16.losses, f32.losses, 2e-2);
  options.steps = 30;
  const StepValues longer = train(options, on(Backend::cuda), 30);
  REQUIRE(longer.losses.back() < 0.8 * longer.losses.front());
}

int main(int argc, char** argv) {
  if (nax::detail::cuda_gpu_count() == 0) {
    std::puts("no CUDA device: skipping the GPT-J cuda tests");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
