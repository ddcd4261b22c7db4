// softmax and log_softmax over one axis: a stable fused forward per row (max, exponentials, sum),
// and a backward from the saved output alone. The axis must be whole on this device; over a vocab
// cut across devices the loss uses the vocab-parallel pieces instead (cross_entropy).
#include "ops/tape.h"
#include "nax/ops/transformer_ops.h"
#include "ops/row_ops.h"

namespace nax {

namespace {

constexpr std::string_view kCutAxisHint =
    "for a vocab cut over mesh axes, use the vocab-parallel pieces: cross_entropy(logits, targets, vocab, mesh_axes), "
    "or pmax of the local max and psum of the local sum of exponentials; else all_gather the axis first";

std::string_view op_name(bool log) { return log ? "log_softmax" : "softmax"; }

// The output in rows order (axis last, compute dtype): what the backward needs.
Tensor softmax_rows(const Tensor& x, const std::string& axis, bool log) {
  const Tensor rows = detail::permute_to(detail::compute_values(x), detail::order_with_last(x.shape(), axis));
  Tensor y = detail::make_result(rows.shape(), rows.dtype(), x.vary(), x.device_ptr());
  const std::int64_t n = x.size(axis);
  detail::kernels_of(y).softmax_forward(rows.dtype(), n == 0 ? 0 : rows.numel() / n, n, rows.raw(), y.raw_mutable(), log);
  return y;
}

// dx in rows order (the autodiff permutes it back to x's order).
Tensor softmax_backward(const Tensor& g, const Tensor& y, const std::string& axis, bool log) {
  const Tensor dy = detail::permute_to(detail::widen(g), y.shape().names());
  Tensor dx = detail::make_result(y.shape(), y.dtype(), detail::merge_vary(op_name(log), {&dy, &y}), y.device_ptr());
  const std::int64_t n = y.size(axis);
  detail::kernels_of(dx).softmax_backward(y.dtype(), n == 0 ? 0 : y.numel() / n, n, y.raw(), dy.raw(), dx.raw_mutable(), log);
  return dx;
}

Tensor softmax_like(const Tensor& x, const std::string& axis, bool log) {
  const std::string_view name = op_name(log);
  const auto op_span = detail::enter_op(name, {&x});
  detail::check_floating(name, x);
  x.shape().require(axis, name);
  detail::check_axis_whole(name, x, axis, kCutAxisHint);
  const Tensor y = softmax_rows(x, axis, log);
  Tensor out = detail::narrow_to(detail::permute_to(y, x.shape().names()), x.dtype());
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record(std::string(name), out, {x}, [y, axis, log](const Tensor& g) {
    return std::vector<Tensor>{softmax_backward(g, y, axis, log)};
  });
}

}  // namespace

Tensor softmax(const Tensor& x, const std::string& axis) { return softmax_like(x, axis, false); }
Tensor log_softmax(const Tensor& x, const std::string& axis) { return softmax_like(x, axis, true); }

}  // namespace nax
