#include "nax/kernels/sum_tree.h"

#include "nax/core/error.h"

namespace nax {

SumTree SumTree::canonical_for_block_of(std::int64_t blocks) {
  if (blocks < 1 || (blocks & (blocks - 1)) != 0)
    fail("deterministic", "a sum cut into {} blocks: deterministic mode needs a power of two devices along every cut axis", blocks);
  int log2 = 0;
  while ((std::int64_t{1} << log2) < blocks) ++log2;
  if (log2 > kForced)
    fail("deterministic", "a sum cut into {} blocks: deterministic mode allows at most {} devices along the axes a sum is cut over",
         blocks, std::int64_t{1} << kForced);
  return SumTree{.on = true, .forced = kForced - log2, .leaf = kLeaf};
}

}  // namespace nax
