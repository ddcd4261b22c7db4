#pragma once
// Deterministic mode's sums walked one output at a time (nax::SumTree, include/nax/core/
// sum_tree.h). A tree over n terms halves every node the same way, so it is a perfect binary tree
// of 2^levels leaves of `leaf` consecutive terms each: a leaf is folded in index order and the
// leaf sums are combined by a TreeStack (the carries of a binary counter: node = left + right as
// soon as both exist). On the device every operation is a correctly rounded intrinsic
// (__fadd_rn, __fmaf_rn, ...) that nvcc may neither contract nor reorder, so the bits equal the
// CPU's. Host and device code: test_cuda_tree_walk runs these walks on the CPU against
// nax::tree_sum, where the operations are the plain, equally rounded C++ ones (compiled with
// -ffp-contract=off: GCC would otherwise fuse a multiply and an add into one FMA).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "nax/core/error.h"
#include "nax/kernels/sum_tree.h"

namespace nax::cuda::detail {

// Deep enough for 2^39 leaves; tree_shape refuses more.
constexpr int kTreeStackDepth = 40;

struct TreeShape {
  int levels = 0;
  std::int64_t leaf = 0;  // terms per leaf; 0 for an empty sum
  __host__ __device__ std::int64_t leaves() const { return std::int64_t{1} << levels; }
};

inline TreeShape tree_shape(SumTree tree, std::int64_t n, const char* kernel) {
  TreeShape shape;
  while (tree.halves(n)) {
    n /= 2;
    tree = tree.half();
    ++shape.levels;
  }
  shape.leaf = n;
  if (shape.levels >= kTreeStackDepth) fail(kernel, "a sum tree of {} levels is deeper than the CUDA kernels take", shape.levels);
  return shape;
}

#define NAX_TREE_FN __host__ __device__ __forceinline__

#ifdef __CUDA_ARCH__
NAX_TREE_FN float add_rn(float a, float b) { return __fadd_rn(a, b); }
NAX_TREE_FN double add_rn(double a, double b) { return __dadd_rn(a, b); }
NAX_TREE_FN float sub_rn(float a, float b) { return __fsub_rn(a, b); }
NAX_TREE_FN double sub_rn(double a, double b) { return __dsub_rn(a, b); }
NAX_TREE_FN float mul_rn(float a, float b) { return __fmul_rn(a, b); }
NAX_TREE_FN double mul_rn(double a, double b) { return __dmul_rn(a, b); }
NAX_TREE_FN float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
NAX_TREE_FN double fma_rn(double a, double b, double c) { return __fma_rn(a, b, c); }
NAX_TREE_FN int lowest_set_bit(std::int64_t x) { return __ffsll(static_cast<long long>(x)) - 1; }
#else
template <typename T>
NAX_TREE_FN T add_rn(T a, T b) { return a + b; }
template <typename T>
NAX_TREE_FN T sub_rn(T a, T b) { return a - b; }
template <typename T>
NAX_TREE_FN T mul_rn(T a, T b) { return a * b; }
template <typename T>
NAX_TREE_FN T fma_rn(T a, T b, T c) { return std::fma(a, b, c); }
NAX_TREE_FN int lowest_set_bit(std::int64_t x) { return __builtin_ctzll(static_cast<unsigned long long>(x)); }
#endif

// The open nodes of a tree walked left to right: after the leaves (or aligned blocks of leaves)
// [0, p) the stack holds one sum per set bit of p, the largest block first.
template <typename Acc>
struct TreeStack {
  Acc values[kTreeStackDepth];
  int size = 0;

  // Adds the sum of the aligned block `index` of 2^level leaves (leaves [index << level, ...)),
  // the next one after those pushed so far: a right child closes its parent, and so on upwards.
  NAX_TREE_FN void push(Acc value, std::int64_t index) {
    for (; index & 1; index >>= 1) value = add_rn(values[--size], value);
    values[size++] = value;
  }

  // Leaves [from, to) that hold no term: each aligned block of them is a +0 subtree, still added
  // to its sibling (x + 0 turns -0 into +0, as the dense tree would).
  NAX_TREE_FN void push_zeros(std::int64_t from, std::int64_t to) {
    while (from < to) {
      int level = from == 0 ? 62 : lowest_set_bit(from);
      while ((std::int64_t{1} << level) > to - from) --level;
      push(Acc{0}, from >> level);
      from += std::int64_t{1} << level;
    }
  }

  NAX_TREE_FN Acc result() const { return values[0]; }  // after all the leaves
};

// A GEMM element's sum walked term by term in k order: leaves by fused multiply-add from +0.
template <typename Acc>
struct TreeDot {
  TreeStack<Acc> stack;
  Acc acc = 0;
  std::int64_t leaf_size, in_leaf = 0, leaf = 0;

  NAX_TREE_FN explicit TreeDot(std::int64_t leaf_terms) : leaf_size(leaf_terms) {}
  NAX_TREE_FN void add(Acc a, Acc b) {
    acc = fma_rn(a, b, acc);
    if (++in_leaf == leaf_size) {
      stack.push(acc, leaf++);
      acc = 0;
      in_leaf = 0;
    }
  }
  NAX_TREE_FN Acc result() const { return stack.result(); }  // after all k terms
};

// The tree sum over all n = leaves * leaf positions of term(p) at the ascending positions
// pos[0, picks) and +0 everywhere else, without visiting the +0 terms: a leaf folds from its first
// position, a run of absent terms adding one +0 (which only turns -0 into +0, as several would).
template <typename Acc, typename Term>
NAX_TREE_FN Acc sparse_tree_sum(const std::int32_t* pos, std::int64_t picks, TreeShape shape, const Term& term) {
  TreeStack<Acc> stack;
  std::int64_t next_leaf = 0, j = 0;
  while (j < picks) {
    std::int64_t p = pos[j];
    const std::int64_t leaf = p / shape.leaf, first = leaf * shape.leaf, last = first + shape.leaf - 1;
    stack.push_zeros(next_leaf, leaf);
    Acc acc = p == first ? term(p) : add_rn(Acc{0}, term(p));  // the leaf's terms before p were +0
    for (++j; j < picks && pos[j] <= last; ++j) {
      if (pos[j] > p + 1) acc = add_rn(acc, Acc{0});
      p = pos[j];
      acc = add_rn(acc, term(p));
    }
    if (p < last) acc = add_rn(acc, Acc{0});
    stack.push(acc, leaf);
    next_leaf = leaf + 1;
  }
  stack.push_zeros(next_leaf, shape.leaves());
  return stack.result();
}

}  // namespace nax::cuda::detail
