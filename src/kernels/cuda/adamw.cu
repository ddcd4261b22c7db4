// The fused AdamW step: one pass reads p, m, v and g and writes p, m, v (and a bf16 copy of p),
// in place or into other buffers.
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

struct Buffers {  // the outputs may alias the inputs (in place)
  const float *param, *m, *v, *grad;
  float *param_out, *m_out, *v_out;
  __nv_bfloat16* param_bf16;
};

__global__ void adamw_kernel(std::size_t n, Coefficients c, Buffers b) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = b.grad[i], p = b.param[i];
    const float mi = c.beta1 * b.m[i] + (1.0f - c.beta1) * g;
    const float vi = c.beta2 * b.v[i] + (1.0f - c.beta2) * g * g;
    const float direction = (mi * c.inv_correction1) / (sqrtf(vi * c.inv_correction2) + c.eps) + c.weight_decay * p;
    const float updated = p - c.lr * direction;
    b.m_out[i] = mi;
    b.v_out[i] = vi;
    b.param_out[i] = updated;
    if (b.param_bf16 != nullptr) b.param_bf16[i] = __float2bfloat16_rn(updated);
  }
}

void launch(cudaStream_t stream, std::size_t n, const Coefficients& c, const Buffers& b) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  adamw_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(n, c, b);
  NAX_CUDA_CHECK_LAUNCH();
}

}  // namespace

void adamw_step(cudaStream_t stream, float* param, float* m, float* v, const float* grad, bf16_t* param_bf16, std::size_t n,
                const AdamWConfig& config) {
  if (config.step < 1) fail("adamw_step", "step counts from 1 (the bias corrections divide by 1 - beta^step), got {}", config.step);
  const double step = static_cast<double>(config.step);
  Coefficients c{static_cast<float>(config.lr),
                 static_cast<float>(config.beta1),
                 static_cast<float>(config.beta2),
                 static_cast<float>(config.eps),
                 static_cast<float>(config.weight_decay),
                 static_cast<float>(1.0 / (1.0 - std::pow(config.beta1, step))),
                 static_cast<float>(1.0 / (1.0 - std::pow(config.beta2, step)))};
  launch(stream, n, c, Buffers{param, m, v, grad, param, m, v, param_bf16});
}

void adamw_step(cudaStream_t stream, std::size_t n, const float* param, const float* m, const float* v, const float* grad, float* param_out,
                float* m_out, float* v_out, const kernels::AdamWStep& step) {
  Coefficients c{static_cast<float>(step.lr),
                 static_cast<float>(step.beta1),
                 static_cast<float>(step.beta2),
                 static_cast<float>(step.eps),
                 static_cast<float>(step.weight_decay),
                 static_cast<float>(1.0 / step.correction1),
                 static_cast<float>(1.0 / step.correction2)};
  launch(stream, n, c, Buffers{param, m, v, grad, param_out, m_out, v_out, nullptr});
}

}  // namespace nax::cuda
