#include "nax/kernels/sum_tree.h"

#include "nax/core/error.h"

namespace nax {

SumTree SumTree::canonical_for_block_of(std::int64_t blocks, std::int64_t max_cut) {
  if (!is_power_of_two(blocks))
    fail("deterministic", "a sum cut into {} blocks: deterministic mode needs a power of two devices along every cut axis", blocks);
  if (!is_power_of_two(max_cut)) fail("deterministic", "max cut {}: it must be a power of two", max_cut);
  if (blocks > max_cut)
    fail("deterministic",
         "a sum cut into {} blocks: deterministic mode's sum trees take at most {} devices along the axes a sum is cut over; set "
         "RuntimeOptions::deterministic_max_cut (or NAX_DETERMINISTIC_MAX_CUT) to {} or more, the same on every mesh whose bits "
         "are compared (short sums then get shorter leaves, which is slower)",
         blocks, max_cut, blocks);
  return SumTree{.on = true, .forced = log2_of_power_of_two(max_cut) - log2_of_power_of_two(blocks), .leaf = kLeaf};
}

}  // namespace nax
