// The fused AdamW step on the CPU: one pass over the four inputs, in f32 as the op-by-op form
// computes it; the loop vectorises.
#include <cmath>

#include "kernels/cpu/kernels.h"

namespace nax::cpu {

void adamw(std::int64_t n, const float* __restrict__ p, const float* __restrict__ m, const float* __restrict__ v,
           const float* __restrict__ g, float* __restrict__ p_out, float* __restrict__ m_out, float* __restrict__ v_out,
           const kernels::AdamWStep& step) {
  const auto b1 = static_cast<float>(step.beta1), b2 = static_cast<float>(step.beta2);
  const auto one_minus_b1 = static_cast<float>(1 - step.beta1), one_minus_b2 = static_cast<float>(1 - step.beta2);
  const auto c1 = static_cast<float>(step.correction1), c2 = static_cast<float>(step.correction2);
  const auto eps = static_cast<float>(step.eps), lr = static_cast<float>(step.lr), decay = static_cast<float>(step.weight_decay);
  for (std::int64_t i = 0; i < n; ++i) {
    const float mi = m[i] * b1 + g[i] * one_minus_b1;
    const float vi = v[i] * b2 + g[i] * g[i] * one_minus_b2;
    const float direction = (mi / c1) / (std::sqrt(vi / c2) + eps) + p[i] * decay;
    m_out[i] = mi;
    v_out[i] = vi;
    p_out[i] = p[i] - direction * lr;
  }
}

}  // namespace nax::cpu
