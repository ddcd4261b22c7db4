// Shape ops that move no data (expand_dims, squeeze), stack, and constants shaped like a tensor.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "ops/tape.h"
#include "nax/ops/index_ops.h"
#include "ops/internal.h"

namespace nax {

namespace {

Shape checked_shape(std::string_view op, std::vector<Axis> axes, const Tensor& x, const std::string& axis) {
  try {
    return Shape(std::move(axes));
  } catch (const Error&) {
    fail(op, "the new axis '{}' clashes with an axis of {}", axis, x.str());
  }
}

Tensor expand_dims_forward(const Tensor& x, const std::string& axis, int position) {
  const auto op_span = detail::enter_op("expand_dims", {{&x, OnPartial::move}});
  if (position < 0 || position > x.rank())
    fail("expand_dims", "position {} for axis '{}' is outside [0, {}] (the rank of {})", position, axis, x.rank(), x.str());
  std::vector<Axis> axes = x.shape().axes();
  axes.insert(axes.begin() + position, Axis{axis, 1});
  return x.with_shape(checked_shape("expand_dims", axes, x, axis));
}

// The positions (in x) of the squeezed axes, ascending.
std::vector<int> squeezed_positions(const Tensor& x, const Names& axes) {
  std::vector<int> positions;
  std::set<std::string> seen;
  for (const auto& a : axes.list()) {
    const int i = x.shape().require(a, "squeeze");
    if (!seen.insert(a).second) fail("squeeze", "axis '{}' named twice in {} for {}", a, axes.str(), x.str());
    if (x.shape()[i].size != 1) fail("squeeze", "axis '{}' has size {}, not 1, in {}", a, x.shape()[i].size, x.str());
    positions.push_back(i);
  }
  std::sort(positions.begin(), positions.end());
  return positions;
}

Tensor squeeze_forward(const Tensor& x, const Names& axes) {
  const auto op_span = detail::enter_op("squeeze", {{&x, OnPartial::move}});
  const std::vector<int> positions = squeezed_positions(x, axes);
  std::vector<Axis> kept;
  for (int i = 0; i < x.rank(); ++i)
    if (!std::binary_search(positions.begin(), positions.end(), i)) kept.push_back(x.shape()[i]);
  VaryType vary = x.vary();
  for (const auto& a : axes.list())
    for (const auto& m : x.vary().split_mesh_axes(a)) vary.set_varying(m);  // each device keeps its own element
  return x.with_shape(Shape(kept)).with_vary(vary);
}

}  // namespace

Tensor expand_dims(const Tensor& x, const std::string& axis, int position) {
  Tensor out = expand_dims_forward(x, axis, position);
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record("expand_dims", out, {x}, [axis](const Tensor& g) { return std::vector<Tensor>{squeeze(g, axis)}; });
}

Tensor squeeze(const Tensor& x, const Names& axes) {
  Tensor out = squeeze_forward(x, axes);
  if (!autodiff::any_requires_grad({&x})) return out;
  std::vector<std::pair<int, std::string>> restore;  // ascending positions in x
  for (int i : squeezed_positions(x, axes)) restore.push_back({i, x.shape()[i].name});
  return autodiff::record("squeeze", out, {x}, [restore](const Tensor& g) {
    Tensor back = g;
    for (const auto& [position, name] : restore) back = expand_dims(back, name, position);
    return std::vector<Tensor>{back};
  });
}

Tensor stack(const std::vector<Tensor>& xs, const std::string& axis, int position) {
  if (xs.empty()) fail("stack", "no tensors to stack along '{}'", axis);
  std::vector<detail::Operand> moved;
  for (const auto& x : xs) moved.push_back({&x, OnPartial::move});
  const auto op_span = detail::enter_op("stack", moved);
  std::vector<Tensor> expanded;
  for (const auto& x : xs) {
    if (x.shape().has(axis)) fail("stack", "the new axis '{}' is already an axis of {}", axis, x.str());
    expanded.push_back(expand_dims(x, axis, position));
  }
  return concat(expanded, axis);
}

// A constant is the same on every device: where x is a partial value the result is Invariant (a
// zero is a known zero, which partial sums may be added to: an accumulator starts from it).
Tensor full_like(const Tensor& x, double value, DType dtype) {
  const auto op_span = detail::enter_op("full_like", {{&x, OnPartial::move}});
  const bool zero = value == 0.0 && !std::signbit(value);
  VaryType vary = x.vary();
  for (const auto& m : x.vary().partial_mesh_axes()) vary.set_invariant(m);
  Tensor out = detail::make_result(x.shape(), dtype, vary, x.device_ptr());
  detail::kernels_of(out).fill(dtype, out.raw_mutable(), out.numel(), value);
  return zero ? out.as_known_zero() : out;
}

Tensor full_like(const Tensor& x, double value) { return full_like(x, value, x.defined() ? x.dtype() : DType::f32); }
Tensor zeros_like(const Tensor& x) { return full_like(x, 0.0); }
Tensor ones_like(const Tensor& x) { return full_like(x, 1.0); }

}  // namespace nax
