// Index ops along an axis cut over mesh axes (across_blocks.h). Ties and NaN keep the rules of the
// whole-axis ops: candidates arrive in block order, each block's sorted with the lower index
// first, so the lowest global index wins a tie.
#include "ops/across_blocks.h"

#include "ops/tape.h"
#include "nax/ops/collectives.h"
#include "nax/ops/transformer_ops.h"
#include "ops/internal.h"

namespace nax::detail {

namespace {

// x's data and history with another vary type (an identity node, so that x's gradient keeps x's).
Tensor retyped(const Tensor& x, VaryType vary) {
  Tensor out = stop_gradient(x).with_vary(std::move(vary));
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record("retype", out, {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

// Each device's block as per-device data: Varying, not Split, over `cuts`.
Tensor local_blocks(const Tensor& x, const std::vector<std::string>& cuts) {
  VaryType vary = x.vary();
  for (const auto& m : cuts) vary.set_varying(m);
  return retyped(x, vary);
}

// t typed as this device's block of `axis` over `cuts` (major first), ready to gather.
Tensor as_blocks(const Tensor& t, const std::string& axis, const std::vector<std::string>& cuts) {
  VaryType vary = t.vary();
  for (const auto& m : cuts) vary.set_invariant(m);
  for (const auto& m : cuts) vary.set_split(m, axis);
  return retyped(t, vary);
}

}  // namespace

Tensor cumsum_across_blocks(const Tensor& x, const std::string& axis, bool exclusive) {
  const auto cuts = x.vary().split_mesh_axes(axis);
  const Tensor local = local_blocks(x, cuts);
  const Tensor within = cumsum(local, axis, exclusive);
  const std::string blocks = "blocks_of_" + axis;
  const Tensor totals = all_gather_invariant(as_blocks(expand_dims(sum(local, axis), blocks), blocks, cuts), cuts, blocks);
  const Tensor before = lt(arange(Axis{blocks, totals.size(blocks)}, DType::i32), axis_index(cuts));  // the blocks before this one
  const Tensor offset = sum(totals * cast(before, totals.dtype()), blocks);
  return retyped(within + offset, x.vary());  // a block of the global prefix sums
}

TopK top_k_across_blocks(const Tensor& x, const std::string& axis, std::int64_t k, const std::string& k_axis) {
  const auto cuts = x.vary().split_mesh_axes(axis);
  const std::int64_t local_size = x.size(axis);
  const TopK mine = top_k(local_blocks(x, cuts), axis, std::min(k, local_size), k_axis);
  const Tensor global_indices = mine.indices + axis_index(cuts) * static_cast<double>(local_size);
  const Tensor values = all_gather_invariant(as_blocks(mine.values, k_axis, cuts), cuts, k_axis);
  const Tensor indices = all_gather_invariant(as_blocks(global_indices, k_axis, cuts), cuts, k_axis);
  const std::string best = "best_of_" + k_axis;
  const TopK chosen = top_k(values, k_axis, k, best);
  const Tensor zero = full(Shape{}, 0.0, DType::i32);
  const Tensor picked = sum(where(one_hot(chosen.indices, Axis{k_axis, values.size(k_axis)}, DType::i32), indices, zero), k_axis);
  return {rename(chosen.values, best, k_axis), rename(picked, best, k_axis)};
}

}  // namespace nax::detail
