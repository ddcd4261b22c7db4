// The fused AdamW step: one pass reads p, m, v and g and writes p, m, v (and a bf16 copy of p).
#include <cmath>

#include "kernels/cuda/kernels.h"
#include "kernels/cuda/map.cuh"
#include "nax/core/error.h"

namespace nax::cuda {

namespace {

struct Coefficients {
  float lr, beta1, beta2, eps, weight_decay;
  float inv_correction1, inv_correction2;  // 1 / (1 - beta^step)
};

__global__ void adamw_kernel(std::size_t n, Coefficients c, float* __restrict__ param, float* __restrict__ m, float* __restrict__ v,
                             const float* __restrict__ grad, __nv_bfloat16* __restrict__ param_bf16) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = grad[i], p = param[i];
    const float mi = c.beta1 * m[i] + (1.0f - c.beta1) * g;
    const float vi = c.beta2 * v[i] + (1.0f - c.beta2) * g * g;
    const float direction = (mi * c.inv_correction1) / (sqrtf(vi * c.inv_correction2) + c.eps) + c.weight_decay * p;
    const float updated = p - c.lr * direction;
    m[i] = mi;
    v[i] = vi;
    param[i] = updated;
    if (param_bf16 != nullptr) param_bf16[i] = __float2bfloat16_rn(updated);
  }
}

}  // namespace

void adamw_step(cudaStream_t stream, float* param, float* m, float* v, const float* grad, bf16_t* param_bf16, std::size_t n,
                const AdamWConfig& config) {
  if (config.step < 1) fail("adamw_step", "step counts from 1 (the bias corrections divide by 1 - beta^step), got {}", config.step);
  if (n == 0) return;
  const double step = static_cast<double>(config.step);
  Coefficients c{static_cast<float>(config.lr),
                 static_cast<float>(config.beta1),
                 static_cast<float>(config.beta2),
                 static_cast<float>(config.eps),
                 static_cast<float>(config.weight_decay),
                 static_cast<float>(1.0 / (1.0 - std::pow(config.beta1, step))),
                 static_cast<float>(1.0 / (1.0 - std::pow(config.beta2, step)))};
  constexpr int kThreads = 256;
  adamw_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(n, c, param, m, v, grad, param_bf16);
  NAX_CUDA_CHECK_LAUNCH();
}

}  // namespace nax::cuda
