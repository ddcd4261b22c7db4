// where(cond, a, b): cond != 0 ? a : b, broadcasting by name. Result axes: a's in order, then b's
// others, then cond's others. Gradients flow to a and b (masked), none to cond.
#include <fmt/format.h>

#include <map>

#include "ops/tape.h"
#include "nax/ops/transformer_ops.h"
#include "ops/row_ops.h"

namespace nax {

namespace {

Shape where_shape(const Tensor& cond, const Tensor& a, const Tensor& b) {
  std::vector<Axis> axes;
  std::map<std::string, std::pair<std::int64_t, std::string_view>> seen;  // axis -> size, operand that set it
  const std::pair<const Tensor*, std::string_view> operands[] = {{&a, "a"}, {&b, "b"}, {&cond, "cond"}};
  for (const auto& [t, label] : operands)
    for (const auto& axis : t->shape().axes()) {
      auto [it, fresh] = seen.try_emplace(axis.name, axis.size, label);
      if (fresh) axes.push_back(axis);
      else if (it->second.first != axis.size)
        fail("where", "axis '{}' has size {} in {} but {} in {}: cond {}, a {}, b {}", axis.name, it->second.first, it->second.second,
             axis.size, label, cond.str(), a.str(), b.str());
    }
  return Shape(axes);
}

Tensor zero_scalar(DType dtype, const std::shared_ptr<Device>& device) {
  Tensor z = Tensor::empty(Shape{}, dtype, device);
  detail::kernels_of(z).fill(dtype, z.raw_mutable(), 1, 0.0);
  return z;
}

// cond as 1/0 in `dtype` (cond != 0 is tested before any conversion that could round it to 0).
Tensor mask_in(const Tensor& cond, DType dtype) {
  const Tensor c = detail::compute_values(cond);
  if (c.dtype() == dtype) return c;
  return cast(ne(c, zero_scalar(c.dtype(), c.device_ptr())), dtype);
}

Tensor where_forward(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const Shape shape = where_shape(cond, a, b);
  const VaryType vary = detail::merge_vary("where", {&cond, &a, &b});
  const Tensor va = detail::compute_values(a), vb = detail::compute_values(b);
  const Tensor mask = mask_in(cond, va.dtype());
  Tensor out = detail::make_result(shape, va.dtype(), vary, a.device_ptr());
  detail::kernels_of(out).where(va.dtype(), mask.raw(), va.raw(), vb.raw(), out.raw_mutable(),
                                detail::layout_over(shape.axes(), mask.shape(), va.shape(), vb.shape(), shape));
  return detail::narrow_to(out, a.dtype());
}

}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const auto op_span = detail::enter_op("where", {&cond, {&a, OnPartial::move}, {&b, OnPartial::move}});
  detail::check_same_dtype("where", a, b);
  Tensor out = where_forward(cond, a, b);
  if (!autodiff::any_requires_grad({&a, &b})) return out;
  return autodiff::record("where", out, {a, b}, [cond = stop_gradient(cond), a_shape = a.shape(), b_shape = b.shape()](const Tensor& g) {
    const Tensor zero = zero_scalar(g.dtype(), g.device_ptr());
    return std::vector<Tensor>{detail::sum_to(where_forward(cond, g, zero), a_shape),
                               detail::sum_to(where_forward(cond, zero, g), b_shape)};
  });
}

}  // namespace nax
