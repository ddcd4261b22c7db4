#pragma once
// A SumTree (nax/kernels/sum_tree.h) over a range, flattened for kernels: its leaves in index order,
// each followed by the number of nodes it completes. Running the leaves in order with a stack of
// partial sums (a leaf pushes its sum; each completed node pops its right and left halves and
// pushes left + right) computes every node exactly as the recursive definition does, without
// recursion in the inner loops.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "nax/kernels/sum_tree.h"

namespace nax::cpu {

struct SumLeaf {
  std::int64_t begin = 0, length = 0;
  int merges = 0;  // nodes whose last leaf this is: each adds the partial sum below it (left) to the top (right)
};

struct SumSchedule {
  std::vector<SumLeaf> leaves;  // empty for an empty range (whose sum is +0)
  int depth = 0;                // the most partial sums on the stack at once
};

SumSchedule sum_schedule(std::int64_t n, const SumTree& tree);

// Sums of `width` columns over the schedule's range: leaf(begin, length, acc) writes the leaf's
// sums of the columns to acc[0, width); the nodes add the halves' sums column by column. stack
// holds schedule.depth * width elements; the result is left in stack[0, width) (+0 when empty).
template <typename T, typename Leaf>
void sum_columns(const SumSchedule& schedule, std::int64_t width, T* stack, Leaf&& leaf) {
  if (schedule.leaves.empty()) {
    std::fill(stack, stack + width, T(0));
    return;
  }
  int top = 0;  // partial sums on the stack
  for (const SumLeaf& l : schedule.leaves) {
    T* right = stack + top * width;
    leaf(l.begin, l.length, right);
    for (int m = 0; m < l.merges; ++m, --top) {
      T* left = right - width;
      for (std::int64_t j = 0; j < width; ++j) left[j] = left[j] + right[j];
      right = left;
    }
    ++top;
  }
}

}  // namespace nax::cpu
