#pragma once
// Shape, indexing, scan and dynamic-slice ops for per-shard code (the toolkit of shard_map users:
// MoE routing, Megatron-style pipelines). Each op states its vary rule and its gradient; every op
// is listed in docs/ops.md.
//
// Indices are i32 tensors (argmax, top_k's indices, one_hot's and scatter_add's ids, offsets):
// integer values take no gradient, and an op producing them records nothing.
//
// argmax, argmin, top_k and cumsum also work along an axis cut over mesh axes (a vocab over mp):
// each device works on its block and the group exchanges only the blocks' totals or top-k
// candidates (all_gather_invariant); indices are global. scatter_add and dynamic_update_slice need
// their axis whole on each device: when it is cut they throw a nax::Error naming the op, the axis
// and the mesh axis.
#include <cstdint>
#include <string>
#include <vector>

#include "nax/core/names.h"
#include "nax/tensor/tensor.h"

namespace nax {

// --- shape ---

// x with a new axis `axis` of size 1 at `position` (0 = outermost, x.rank() = innermost). Same data,
// x's vary type; gradient: squeeze.
Tensor expand_dims(const Tensor& x, const std::string& axis, int position = 0);

// x without its size-1 axes `axes`. Same data. Squeezing an axis cut over a mesh axis leaves each
// device its own element: the result is Varying over that mesh axis. Gradient: expand_dims.
Tensor squeeze(const Tensor& x, const Names& axes);

// The tensors (same axes, sizes, dtype and device; any axis order: the first one's is used) stacked
// along a new axis `axis` of size xs.size() at `position`. Vary: the operands' merged (as concat).
// Gradient: each operand gets its slice.
Tensor stack(const std::vector<Tensor>& xs, const std::string& axis, int position = 0);

// Constants with x's shape, device and vary type (a constant block of a Split tensor is a block of
// a constant), in x's dtype unless given. No gradient flows to x.
Tensor zeros_like(const Tensor& x);
Tensor ones_like(const Tensor& x);
Tensor full_like(const Tensor& x, double value);
Tensor full_like(const Tensor& x, double value, DType dtype);

// --- indexing ---

// 1 where the i32 `ids` equal the index along the new axis `axis` (its size = the number of
// classes), else 0: ids' axes then `axis`, in `dtype`. An id outside [0, axis.size) gives an
// all-zero row (as jax.nn.one_hot): MoE routing drops tokens over capacity that way. Vary: ids'.
// No gradient.
Tensor one_hot(const Tensor& ids, const Axis& axis, DType dtype = DType::f32);

// The i32 index of the largest (smallest) value along `axis`, x's other axes. Ties give the first
// index; a NaN counts as larger (smaller) than everything, the first NaN wins (as numpy). Vary: x's;
// along a cut axis the global index, Invariant over the cutting mesh axes. No gradient.
Tensor argmax(const Tensor& x, const std::string& axis);
Tensor argmin(const Tensor& x, const std::string& axis);

// The k largest values along `axis`, in descending order, and their i32 indices: both with x's
// other axes then a new axis `k_axis` of size k (ties: the lower index first; NaN as in argmax).
// Vary: x's; along a cut axis the global top k, Invariant over the cutting mesh axes. The gradient flows to x through `values` (each chosen
// element gets its value's gradient); `indices` take none.
struct TopK {
  Tensor values;
  Tensor indices;
};
TopK top_k(const Tensor& x, const std::string& axis, std::int64_t k, const std::string& k_axis = "k");

// Index add: target with updates[p, ...] added at target[axis = ids[p], ...] for every index p of
// the i32 `ids`. updates has ids' axes and target's axes other than `axis` (any order); repeated
// ids accumulate. An id outside [0, size of axis) is an error. Vary: merged over the operands;
// `axis` must be whole on each device and ids' axes must not be cut over a mesh axis (each device
// would add only its own updates: scatter into zeros_like(target) and psum first). Gradients: to
// target the incoming gradient, to updates its rows at ids (a gather); none to ids. Floating
// dtypes only.
Tensor scatter_add(const Tensor& target, const std::string& axis, const Tensor& ids, const Tensor& updates);

// --- scan ---

// Inclusive prefix sum along `axis` (exclusive: the sum of the elements before). x's shape and vary
// type (along a cut axis each device holds its block of the global prefix sums). Gradient: the
// reverse prefix sum.
Tensor cumsum(const Tensor& x, const std::string& axis, bool exclusive = false);

// --- dynamic slices: offsets that are tensors, e.g. axis_index(m) * block (one per device) ---

// The `size` elements of x along `axis` from `start`, an i32 scalar tensor (read on the host: a
// device synchronisation). start + size must lie within the axis (error otherwise, naming the
// start). Vary: x's merged with start's; a slice of a Split axis is Varying. Gradient to x: g
// written at start into zeros; none to start.
Tensor dynamic_slice(const Tensor& x, const std::string& axis, const Tensor& start, std::int64_t size);

// x with `update` written along `axis` from `start` (an i32 scalar tensor); update has x's axes,
// equal sizes except along `axis`; the block must lie within the axis (error otherwise). Vary:
// merged over x, update and start; `axis` must be whole.
// Gradients: to x, g with the written block zeroed; to update, g's block at start.
Tensor dynamic_update_slice(const Tensor& x, const Tensor& update, const std::string& axis, const Tensor& start);

}  // namespace nax
