// layer_norm: fused forward (one pass for each row's mean and variance) that keeps only the mean
// and 1/std of each row, and a fused backward giving dx, dscale and dbias. Rows along a non-innermost
// axis are made contiguous by one permutation; the result keeps x's axis order.
#include "deterministic/deterministic.h"
#include "ops/tape.h"
#include "nax/ops/transformer_ops.h"
#include "ops/row_ops.h"

namespace nax {

namespace {

void check_layer_norm(const Tensor& x, const std::string& axis, const Tensor& scale, const Tensor& bias) {
  detail::check_floating("layer_norm", x);
  detail::check_same_dtype("layer_norm", x, scale);
  detail::check_same_dtype("layer_norm", x, bias);
  const int i = x.shape().require(axis, "layer_norm");
  if (x.shape()[i].size == 0) fail("layer_norm", "cannot normalise over the empty axis '{}' of {}", axis, x.str());
  detail::check_axis_whole("layer_norm", x, axis, "all_gather it first, or normalise over an axis that is whole");
  const Shape expected{x.shape()[i]};
  for (const Tensor* p : {&scale, &bias})
    if (p->shape() != expected)
      fail("layer_norm", "{} must have exactly the normalised axis {}, got {} (x: {})", p == &scale ? "scale" : "bias",
           expected.str(), p->str(), x.str());
  detail::check_axis_whole("layer_norm", scale, axis, "scale must be whole on every device");
  detail::check_axis_whole("layer_norm", bias, axis, "bias must be whole on every device");
}

struct Statistics {
  Tensor mean, rstd;  // one per row, in the compute dtype (f32 for bf16)
};

Tensor layer_norm_forward(const Tensor& x, const std::string& axis, const Tensor& scale, const Tensor& bias, double eps,
                          Statistics& stats) {
  const VaryType vary = detail::merge_vary("layer_norm", {&x, &scale, &bias});
  const Tensor rows = detail::permute_to(detail::compute_values(x), detail::order_with_last(x.shape(), axis));
  const Tensor s = detail::compute_values(scale), b = detail::compute_values(bias);
  const DType dtype = rows.dtype();
  const Shape row_shape = detail::shape_without(rows.shape(), axis);
  Tensor y = detail::make_result(rows.shape(), dtype, vary, x.device_ptr());
  const DType stats_dtype = dtype == DType::bf16 ? DType::f32 : dtype;
  stats.mean = Tensor::empty(row_shape, stats_dtype, x.device_ptr());
  stats.rstd = Tensor::empty(row_shape, stats_dtype, x.device_ptr());
  detail::kernels_of(y).layer_norm_forward(dtype, row_shape.numel(), x.size(axis), rows.raw(), s.raw(), b.raw(), eps, y.raw_mutable(),
                          stats.mean.raw_mutable(), stats.rstd.raw_mutable());
  return detail::narrow_to(detail::permute_to(y, x.shape().names()), x.dtype());
}

// dx in the rows' axis order (the autodiff permutes it back); dscale and dbias summed over the
// rows, so partial (Varying) over the mesh axes that cut a row axis.
std::vector<Tensor> layer_norm_backward(const Tensor& g, const Tensor& x, const std::string& axis, const Tensor& scale,
                                        const Statistics& stats) {
  const auto order = detail::order_with_last(x.shape(), axis);
  const Tensor rows = detail::permute_to(detail::compute_values(x), order);
  const Tensor dy = detail::permute_to(detail::widen(g), order);
  const Tensor s = detail::compute_values(scale);
  const DType dtype = rows.dtype();
  const auto row_axes = detail::shape_without(rows.shape(), axis).names();
  Tensor dx = detail::make_result(rows.shape(), dtype, detail::merge_vary("layer_norm", {&dy, &rows, &s}), x.device_ptr());
  const VaryType summed = detail::merge_vary("layer_norm", {&dy, &rows}, row_axes);
  Tensor dscale = detail::make_result(scale.shape(), dtype, summed, x.device_ptr());
  Tensor dbias = detail::make_result(scale.shape(), dtype, summed, x.device_ptr());
  detail::kernels_of(rows).layer_norm_backward(dtype, stats.mean.numel(), x.size(axis), rows.raw(), s.raw(), stats.mean.raw(), stats.rstd.raw(),
                           dy.raw(), dx.raw_mutable(), dscale.raw_mutable(), dbias.raw_mutable(),
                           deterministic::sum_tree("layer_norm", rows, row_axes));
  return {dx, dscale, dbias};
}

}  // namespace

Tensor layer_norm(const Tensor& x, const std::string& axis, const Tensor& scale, const Tensor& bias, double eps) {
  const auto op_span = detail::enter_op("layer_norm", {&x, &scale, &bias});
  check_layer_norm(x, axis, scale, bias);
  Statistics stats;
  Tensor out = layer_norm_forward(x, axis, scale, bias, eps, stats);
  if (!autodiff::any_requires_grad({&x, &scale, &bias})) return out;
  return autodiff::record("layer_norm", out, {x, scale, bias},
                          [x = stop_gradient(x), axis, scale = stop_gradient(scale), stats](const Tensor& g) {
                            return layer_norm_backward(g, x, axis, scale, stats);
                          });
}

}  // namespace nax
