#pragma once
// CPU kernels of the pointwise transformer ops: GELU (tanh form; f32, f64) and where (f32, f64, i32).
#include <cstdint>

#include "kernels/cpu/strided.h"
#include "nax/core/dtype.h"

namespace nax::cpu {

// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) over n contiguous elements.
void gelu_forward(DType dtype, std::int64_t n, const void* x, void* y);
// dx = dy * gelu'(x), recomputed from x.
void gelu_backward(DType dtype, std::int64_t n, const void* x, const void* dy, void* dx);

// out = cond != 0 ? a : b; cond, a and b (all of `dtype`) read with strides[0..2] of the layout,
// out written with strides[3].
void where(DType dtype, const void* cond, const void* a, const void* b, void* out, const Layout<4>& layout);

}  // namespace nax::cpu
