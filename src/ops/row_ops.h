#pragma once
// Helpers shared by the transformer ops (layer_norm, softmax, gelu, where): computing off the
// tape in f32/f64, and viewing a tensor as rows along one axis.
#include <string>
#include <string_view>
#include <vector>

#include "nax/ops/tape.h"
#include "ops/internal.h"

namespace nax::detail {

// x's values in the dtype kernels compute in (bf16 widened to f32), with no recorded history:
// the op records itself as one node.
inline Tensor compute_values(const Tensor& x) { return widen(stop_gradient(x)); }

// x's axis names with `axis` moved last: the order that makes each row along `axis` contiguous.
inline std::vector<std::string> order_with_last(const Shape& shape, const std::string& axis) {
  std::vector<std::string> order;
  for (const auto& a : shape.axes())
    if (a.name != axis) order.push_back(a.name);
  order.push_back(axis);
  return order;
}

inline Shape shape_without(const Shape& shape, const std::string& axis) {
  std::vector<Axis> axes;
  for (const auto& a : shape.axes())
    if (a.name != axis) axes.push_back(a);
  return Shape(axes);
}

inline void check_floating(std::string_view op, const Tensor& x) {
  if (!is_floating(x.dtype())) fail(op, "needs a floating dtype (f32, f64, bf16), got {}", x.str());
}

// A row op needs the whole `axis` on this device.
inline void check_axis_whole(std::string_view op, const Tensor& x, const std::string& axis, std::string_view hint) {
  const auto cuts = x.vary().split_mesh_axes(axis);
  if (!cuts.empty())
    fail(op, "axis '{}' of {} is cut over mesh axis '{}': each device holds only a block of it, and {} needs the whole axis ({})",
         axis, x.str(), fmt::join(cuts, "', '"), op, hint);
}

}  // namespace nax::detail
