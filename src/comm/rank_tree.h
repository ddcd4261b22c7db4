#pragma once
// The order in which the communicators that reduce in their own code (threads, MPI's single copy)
// combine the ranks' values: the halving tree of deterministic mode's psum (docs/determinism.md),
// pairs first, then pairs of pairs: (r0 + r1) + (r2 + r3). Both use it on any group size, so they
// agree with each other bit for bit, and a psum over them already has the canonical order.
#include <cstddef>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "nax/core/dtype.h"

namespace nax::comm {

// The partial results a reduction over n ranks holds at once: one chunk per level of the tree.
class RankTreeScratch {
 public:
  void* slot(int level, std::size_t bytes) {
    if (slots_.size() <= static_cast<std::size_t>(level)) slots_.resize(static_cast<std::size_t>(level) + 1);
    auto& s = slots_[static_cast<std::size_t>(level)];
    if (s.size() < bytes) s.resize(bytes);
    return s.data();
  }

 private:
  std::vector<std::vector<char>> slots_;
};

// Reduces the n ranks' chunks of `count` elements in the halving tree and returns the result (in
// `scratch`). `read(q, into)` gives rank q's chunk: it returns a pointer to it, copying it into
// `into` (room for the chunk) first when it cannot be read where it is. A pair of ranks is added
// where the two chunks are, straight into its slot.
template <typename Read>
const void* reduce_ranks_in_tree(int n, std::size_t count, DType dtype, ReduceOp op, RankTreeScratch& scratch, void* incoming,
                                 Read&& read) {
  const std::size_t bytes = count * dtype_size(dtype);
  int pending = 0;  // partial results in scratch slots [0, pending)
  auto merge_top = [&] {
    cpu::accumulate(op, dtype, scratch.slot(pending - 2, bytes), scratch.slot(pending - 1, bytes), count);
    --pending;
  };
  const void* left = nullptr;  // an even rank's chunk, waiting for its right neighbour
  for (int q = 0; q < n; ++q) {
    void* slot = scratch.slot(pending, bytes);
    if (q % 2 == 0) {
      left = read(q, slot);
      continue;
    }
    cpu::combine_into(op, dtype, slot, left, read(q, incoming), count);  // the pair (q - 1, q)
    ++pending;
    for (int done = (q + 1) / 2; done % 2 == 0; done /= 2) merge_top();  // the nodes this pair completes
  }
  if (n % 2 == 1) {  // the last rank has no pair: it joins as it is
    void* slot = scratch.slot(pending++, bytes);
    if (left != slot) std::memcpy(slot, left, bytes);
  }
  while (pending > 1) merge_top();  // a group size that is not a power of two: the right edge, inward
  return scratch.slot(0, bytes);
}

}  // namespace nax::comm
