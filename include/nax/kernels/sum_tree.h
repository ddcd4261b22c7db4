#pragma once
// Deterministic mode's order of summation (docs/determinism.md). A sum over an index range of
// length n is a binary tree: the range is halved while its length is even and either forced
// halvings remain or it is longer than `leaf`; a leaf is summed in index order; a node is its left
// half's sum plus its right half's. The forced halvings are log2 of the most devices a sum may be
// cut over (the max cut): a device that holds one block of p (a power of two, at most the max cut)
// of a range cut over mesh axes uses `forced - log2 p`: its tree is then exactly the global tree's
// node over its block, and a psum that adds the p ranks' values in the same halving order (pairs,
// then pairs of pairs) completes the global tree. The result depends only on the global problem
// and the max cut, never on the mesh, the rows a device holds or the thread count.
#include <cstdint>

namespace nax {

// Whether n is 1, 2, 4, ...; and log2 of such an n (the header is C++17 for nvcc: no <bit>).
constexpr bool is_power_of_two(std::int64_t n) { return n >= 1 && (n & (n - 1)) == 0; }
constexpr int log2_of_power_of_two(std::int64_t n) {
  int log2 = 0;
  while ((std::int64_t{1} << log2) < n) ++log2;
  return log2;
}

struct SumTree {
  // The max cut unless RuntimeOptions::deterministic_max_cut says otherwise: every mesh axis of up
  // to 8 devices, and the leaves of a sum of 256 stay 32 long (64 would cut them to 4, which costs
  // the CPU's tree GEMM a third of its speed).
  static constexpr std::int64_t kMaxCut = 8;
  static constexpr std::int64_t kLeaf = 32;  // the longest leaf summed in index order

  bool on = false;  // off: the backend's fastest order (the default mode)
  int forced = log2_of_power_of_two(kMaxCut);
  std::int64_t leaf = kLeaf;

  // Whether a range of length n at this node is halved, and the tree of each half.
  bool halves(std::int64_t n) const { return n > 1 && n % 2 == 0 && (forced > 0 || n > leaf); }
  SumTree half() const { return {on, forced > 0 ? forced - 1 : 0, leaf}; }

  // The canonical tree of a device holding 1 of `blocks` blocks of the summed range, in trees whose
  // max cut is `max_cut` (a power of two).
  static SumTree canonical_for_block_of(std::int64_t blocks, std::int64_t max_cut = kMaxCut);
};

// Host reference: x[0] + ... + x[n-1] in `tree`'s order (leaves from their first term). Tests and
// small host-side sums use it; kernels implement the same order on their own.
template <typename T>
T tree_sum(const T* x, std::int64_t n, SumTree tree) {
  if (n == 0) return T(0);
  if (tree.halves(n)) return tree_sum(x, n / 2, tree.half()) + tree_sum(x + n / 2, n / 2, tree.half());
  T acc = x[0];
  for (std::int64_t i = 1; i < n; ++i) acc += x[i];
  return acc;
}

}  // namespace nax
