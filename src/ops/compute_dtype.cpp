// The dtype an op computes in on its device: bf16 widened to f32 where the kernels lack it.
#include "ops/compute_dtype.h"

#include "nax/ops/ops.h"
#include "ops/op_entry.h"
#include "tensor/copies.h"

namespace nax::detail {

bool needs_widening(const Tensor& x) { return x.dtype() == DType::bf16 && !kernels_of(x).computes(DType::bf16); }
Tensor widen(const Tensor& x) { return needs_widening(x) ? cast(x, DType::f32) : x; }
// The op's own rounding of its result to the dtype it computes in, not a user's cast: it records
// nothing and is not subject to the partial-value rules (a bf16 dot's partial sum is bf16).
Tensor narrow_to(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return x.requires_grad() ? cast(x, dtype) : trace::made(converted(x, dtype));
}

}  // namespace nax::detail
