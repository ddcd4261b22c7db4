// gelu (tanh form): one fused loop forward, and one backward recomputing tanh from the saved input.
#include "ops/tape.h"
#include "nax/ops/transformer_ops.h"
#include "ops/row_ops.h"

namespace nax {

namespace {

Tensor gelu_forward(const Tensor& x) {
  const Tensor v = detail::compute_values(x);
  Tensor y = detail::make_result(v.shape(), v.dtype(), x.vary(), x.device_ptr());
  detail::kernels_of(y).gelu_forward(v.dtype(), v.numel(), v.raw(), y.raw_mutable());
  return detail::narrow_to(y, x.dtype());
}

Tensor gelu_backward(const Tensor& g, const Tensor& x) {
  const Tensor v = detail::compute_values(x), dy = detail::widen(g);
  Tensor dx = detail::make_result(v.shape(), v.dtype(), detail::merge_vary("gelu", {&dy, &v}), x.device_ptr());
  detail::kernels_of(dx).gelu_backward(v.dtype(), v.numel(), v.raw(), dy.raw(), dx.raw_mutable());
  return dx;
}

}  // namespace

Tensor gelu(const Tensor& x) {
  const auto op_span = detail::enter_op("gelu", {&x});
  detail::check_floating("gelu", x);
  Tensor out = gelu_forward(x);
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record("gelu", out, {x},
                          [x = stop_gradient(x)](const Tensor& g) { return std::vector<Tensor>{gelu_backward(g, x)}; });
}

}  // namespace nax
