#pragma once
// The index ops along an axis cut over mesh axes: each device works on its block, then the group
// exchanges only what the answer needs (the blocks' totals, the blocks' top-k candidates).
#include <string>

#include "nax/ops/index_ops.h"

namespace nax::detail {

// Prefix sums along a cut axis: this block's own prefix sums plus the totals of the blocks before
// it (one all_gather_invariant of the totals). Split like x.
Tensor cumsum_across_blocks(const Tensor& x, const std::string& axis, bool exclusive);

// The global top k along a cut axis (indices global): each block's top k (or all of it), gathered
// with all_gather_invariant, and the top k of those candidates. Invariant over the cutting axes.
TopK top_k_across_blocks(const Tensor& x, const std::string& axis, std::int64_t k, const std::string& k_axis);

}  // namespace nax::detail
