// Deterministic mode's scatter_add_rows: table row t is the SumTree sum over i in [0, count) of
// the dense terms (grad row i where ids[i] picks t, else +0). A device holding one block of the
// ids then computes exactly the global tree's node over its block (+0 rows where its block picks
// nothing), and a psum of the blocks completes the global tree.
// The tree is walked only where a row has picks: a subtree without any is +0 without being
// computed, so a row costs O(picks x depth x row) rather than O(count x row).
#include <algorithm>
#include <vector>

#include "kernels/cpu/float_dispatch.h"
#include "kernels/cpu/lookup.h"

namespace nax::cpu {

namespace {

template <typename T>
struct RowSums {
  const T* grad;
  std::int64_t row;

  const T* term(std::int64_t i) const { return grad + i * row; }

  // Sums written to `out` end in one of these states. A sum that has had +0 added holds no -0, so
  // adding +0 again (an empty sibling) leaves it as it is and can be skipped.
  enum class Sum { empty, raw, zero_added };

  void add_zero(T* out) const {
    for (std::int64_t j = 0; j < row; ++j) out[j] = out[j] + T(0);
  }

  // The dense leaf over [begin, begin + n) whose picked indices are [p, end) (at least one): the
  // first term, then += each next one, absent terms being +0. Adding +0 changes only a -0 (to +0),
  // and once is as good as several times: one += 0 stands for each run of absent terms.
  Sum leaf(std::int64_t begin, std::int64_t n, const std::int64_t* p, const std::int64_t* end, T* out) const {
    std::int64_t previous = begin - 1;
    for (bool first = true; p != end; ++p, first = false) {
      const T* g = term(*p);
      if (first && *p == begin) {
        std::copy(g, g + row, out);
      } else if (first) {  // +0 + g
        for (std::int64_t j = 0; j < row; ++j) out[j] = T(0) + g[j];
      } else {
        for (std::int64_t j = 0; j < row; ++j) out[j] = (*p > previous + 1 ? out[j] + T(0) : out[j]) + g[j];
      }
      previous = *p;
    }
    if (previous == begin + n - 1) return Sum::raw;
    add_zero(out);
    return Sum::zero_added;
  }

  // The sum of the subtree over [begin, begin + n), written to out unless it picks nothing (its
  // sum is then +0). A half that picks nothing leaves its sibling's sum in out, + 0.
  // scratch: a row per level below.
  Sum subtree(std::int64_t begin, std::int64_t n, const SumTree& tree, const std::int64_t* p, const std::int64_t* end, T* out,
              T* scratch) const {
    if (p == end) return Sum::empty;
    if (!tree.halves(n)) return leaf(begin, n, p, end, out);
    const std::int64_t middle = begin + n / 2;
    const std::int64_t* split = std::lower_bound(p, end, middle);
    if (p == split || split == end) {  // one half picks nothing: +0 + right, or left + +0
      const Sum half = p == split ? subtree(middle, n / 2, tree.half(), split, end, out, scratch)
                                  : subtree(begin, n / 2, tree.half(), p, split, out, scratch);
      if (half == Sum::raw) add_zero(out);
      return Sum::zero_added;
    }
    subtree(begin, n / 2, tree.half(), p, split, out, scratch + row);
    subtree(middle, n / 2, tree.half(), split, end, scratch, scratch + row);
    for (std::int64_t j = 0; j < row; ++j) out[j] = out[j] + scratch[j];
    return Sum::raw;
  }
};

// Levels of the tree over n: how many times it halves at most.
int tree_levels(std::int64_t n, SumTree tree) {
  int levels = 0;
  for (; tree.halves(n); n /= 2, tree = tree.half()) ++levels;
  return levels;
}

template <typename T>
void tree_scatter_typed(const std::int32_t* ids, std::int64_t count, VocabRange range, const T* grad, std::int64_t row,
                        T* table_grad, const SumTree& tree) {
  std::fill(table_grad, table_grad + range.local * row, T(0));
  // The picks of each local row, in index order (a counting sort by row).
  std::vector<std::int64_t> starts(static_cast<std::size_t>(range.local + 1), 0);
  for (std::int64_t i = 0; i < count; ++i)
    if (range.holds(ids[i])) ++starts[static_cast<std::size_t>(ids[i] - range.start + 1)];
  for (std::int64_t t = 0; t < range.local; ++t) starts[static_cast<std::size_t>(t + 1)] += starts[static_cast<std::size_t>(t)];
  std::vector<std::int64_t> picks(static_cast<std::size_t>(starts.back()));
  std::vector<std::int64_t> next(starts.begin(), starts.end() - 1);
  for (std::int64_t i = 0; i < count; ++i)
    if (range.holds(ids[i])) picks[static_cast<std::size_t>(next[static_cast<std::size_t>(ids[i] - range.start)]++)] = i;

  const RowSums<T> sums{grad, row};
  std::vector<T> scratch(static_cast<std::size_t>((tree_levels(count, tree) + 1) * row));
  for (std::int64_t t = 0; t < range.local; ++t) {
    const std::int64_t* p = picks.data() + starts[static_cast<std::size_t>(t)];
    const std::int64_t* end = picks.data() + starts[static_cast<std::size_t>(t + 1)];
    sums.subtree(0, count, tree, p, end, table_grad + t * row, scratch.data());
  }
}

}  // namespace

void tree_scatter_add_rows(DType dtype, const std::int32_t* ids, std::int64_t count, VocabRange range, const void* grad,
                           std::int64_t row, void* table_grad, const SumTree& tree) {
  with_floating_type(dtype, "scatter_add_rows", [&](auto zero) {
    using T = decltype(zero);
    tree_scatter_typed<T>(ids, count, range, static_cast<const T*>(grad), row, static_cast<T*>(table_grad), tree);
  });
}

}  // namespace nax::cpu
