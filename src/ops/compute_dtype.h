#pragma once
// The dtype an op computes in (compute_dtype.cpp).
#include "nax/core/dtype.h"
#include "nax/tensor/tensor.h"

namespace nax::detail {

// Whether x's device computes x's dtype only after widening it to f32 (bf16 on the CPU).
bool needs_widening(const Tensor& x);
// x as f32 when its device needs that (see needs_widening), else x itself; and back.
Tensor widen(const Tensor& x);
Tensor narrow_to(const Tensor& x, DType dtype);

}  // namespace nax::detail
