// Whether the mode is on, which tree each sum walks, and what it refuses.
#include <fmt/format.h>

#include <algorithm>

#include "deterministic/deterministic.h"
#include "nax/shard/shard.h"

namespace nax::deterministic {

bool on() {
  const Shard* s = Shard::current();
  return s != nullptr && s->deterministic();
}

SumTree sum_tree(std::string_view op, const Tensor& x, const std::vector<std::string>& axes) {
  if (!on()) return {};
  std::int64_t blocks = 1;
  const Mesh& mesh = Shard::current()->mesh();
  bool leading = true;  // every axis so far whole and of size 1
  for (const auto& axis : axes) {
    const auto cuts = x.vary().split_mesh_axes(axis);
    if (!cuts.empty()) {
      if (!leading)
        fail(op, "deterministic mode sums over ({}) of {}, where '{}' is cut over mesh axes ({}) behind another axis: a "
             "device's part would not be one block of the sum; sum over '{}' first or put it first",
             fmt::join(axes, ", "), x.str(), axis, fmt::join(cuts, ", "), axis);
      for (const auto& m : cuts) blocks *= mesh.axis_size(m);
    }
    if (!cuts.empty() || x.shape().size(axis) > 1) leading = false;
  }
  return SumTree::canonical_for_block_of(blocks, Shard::current()->deterministic_max_cut());
}

void check_operand(std::string_view op, const Tensor& x, OnPartial rule) {
  if (!terms_of(x).empty() && rule != OnPartial::add)
    fail(op, "deterministic mode: {} is a sum of partial sums over mesh axes ({}) that no psum has finished; {} of it would "
         "depend on the mesh's order of addition: psum it first (psum finishes each part in the canonical order)",
         x.str(), fmt::join(x.vary().partial_mesh_axes(), ", "), op);
  if (rule == OnPartial::add || rule == OnPartial::move) return;  // exact on a sum's terms
  for (const auto& m : x.vary().partial_mesh_axes())
    if (x.vary().partial_sum(m))
      fail(op, "deterministic mode: {} is a partial sum over mesh axis '{}' that no psum has finished; {} of it would add the "
           "devices' parts in another order than one device adds the whole (psum it first; only ops that add partial sums or "
           "move their elements, such as add, neg, concat and layout ops, may take them)", x.str(), m, op);
}

void check_partial_result(std::string_view op, const VaryType& result, DType dtype, std::string_view operands) {
  if (dtype != DType::bf16 || !on()) return;
  for (const auto& m : result.partial_mesh_axes())
    fail(op, "deterministic mode: {} gives a bf16 partial sum over mesh axis '{}', rounded to bf16 before its psum: the bits "
         "would depend on how many devices share the sum; compute in f32", operands, m);
}

Names in_mesh_order(const Names& mesh_axes) {
  if (mesh_axes.list().size() < 2 || !on()) return mesh_axes;
  std::vector<std::string> ordered = mesh_axes.list();
  const Mesh& mesh = Shard::current()->mesh();
  for (const auto& m : ordered)
    if (!mesh.has(m)) return mesh_axes;  // the collective names the unknown axis
  std::stable_sort(ordered.begin(), ordered.end(), [&](const auto& a, const auto& b) { return mesh.axis_position(a) < mesh.axis_position(b); });
  return Names(ordered);
}

}  // namespace nax::deterministic
