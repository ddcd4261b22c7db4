#pragma once
// Copies of a tensor's elements into another arrangement, through its device's kernels: the
// layouts a kernel walks a shape in, broadcasting, and the per-rank regrouping of blocks that the
// collectives send (shared by the op layer and deterministic mode's psums).
#include <cstdint>
#include <vector>

#include "nax/core/shape.h"
#include "nax/kernels/kernels.h"
#include "nax/tensor/tensor.h"

namespace nax::detail {

// The kernels of the device `x` lives on.
inline kernels::Kernels& kernels_of(const Tensor& x) { return x.device().kernels(); }

// Strides of `x`'s axes in the order of `axes` (0 for axes x lacks): for broadcasting.
kernels::Dims strides_in_order(const Shape& x, const std::vector<Axis>& axes);
kernels::Dims sizes_of(const std::vector<Axis>& axes);
// The layout that walks `axes`, with each operand's strides in that order (strides_in_order).
template <typename... Shapes>
kernels::Layout<sizeof...(Shapes)> layout_over(const std::vector<Axis>& axes, const Shapes&... operands) {
  return {static_cast<int>(axes.size()), sizes_of(axes), {strides_in_order(operands, axes)...}};
}

// g broadcast to `shape` (a fresh tensor with g's vary type; records nothing).
Tensor broadcast_to(const Tensor& g, const Shape& shape);

// Copies src viewed as [outer, n, chunk] into dst viewed as [n, outer, chunk] (or back: `inverse`):
// every rank's block of an axis with `outer` elements before it made contiguous, in rank order.
void regroup(const Tensor& src, Tensor& dst, std::int64_t outer, std::int64_t n, std::int64_t chunk, bool inverse);

// x's elements converted to `dtype` (x itself when it has it), with x's vary type; records nothing.
Tensor converted(const Tensor& x, DType dtype);

}  // namespace nax::detail
