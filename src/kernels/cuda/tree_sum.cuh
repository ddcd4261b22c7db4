#pragma once
// Deterministic mode's sums on the GPU (nax::SumTree, docs in include/nax/core/sum_tree.h). A tree
// over n terms halves every node the same way, so it is a perfect binary tree of 2^levels leaves
// of `leaf` consecutive terms each. Kernels fold a leaf in index order and combine leaf sums with
// a TreeStack (the carries of a binary counter: node = left + right as soon as both exist), or
// level by level (tree_sums below). Every operation is a correctly rounded intrinsic (__fadd_rn,
// __fmaf_rn, ...) that nvcc may neither contract nor reorder, so the bits equal the CPU's.
#include <cstdint>
#include <utility>

#include "kernels/cuda/check.h"
#include "kernels/cuda/map.cuh"
#include "kernels/cuda/resources.h"
#include "nax/core/error.h"
#include "nax/core/sum_tree.h"

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

__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fma_rn(double a, double b, double c) { return __fma_rn(a, b, c); }

// The open nodes of a tree walked left to right: after the leaves (or aligned blocks of leaves)
// [0, p) the stack holds one sum per set bit of p, the largest block first.
template <typename Acc>
struct TreeStack {
  Acc values[kTreeStackDepth];
  int size = 0;

  // Adds the sum of the aligned block `index` of 2^level leaves (leaves [index << level, ...)),
  // the next one after those pushed so far: a right child closes its parent, and so on upwards.
  __device__ void push(Acc value, std::int64_t index) {
    for (; index & 1; index >>= 1) value = add_rn(values[--size], value);
    values[size++] = value;
  }

  // Leaves [from, to) that hold no term: each aligned block of them is a +0 subtree, still added
  // to its sibling (x + 0 turns -0 into +0, as the dense tree would).
  __device__ void push_zeros(std::int64_t from, std::int64_t to) {
    while (from < to) {
      int level = from == 0 ? 62 : __ffsll(static_cast<long long>(from)) - 1;
      while ((std::int64_t{1} << level) > to - from) --level;
      push(Acc{0}, from >> level);
      from += std::int64_t{1} << level;
    }
  }

  __device__ Acc result() const { return values[0]; }  // after all the leaves
};

// --- level by level, many outputs at once ---
//
// Terms: a functor with `Acc operator()(o, i) const` (term i of output o, i in [0, n)) and
// `void finish(o, Acc sum) const` (stores output o). Partial sums live in the workspace as
// [node][output], so neighbouring threads take neighbouring outputs.

template <typename Acc, typename Terms>
__global__ void tree_leaves_kernel(const __grid_constant__ Terms terms, TreeShape shape, std::int64_t outputs, Acc* partials) {
  const std::int64_t total = outputs * shape.leaves();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t at = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; at < total; at += stride) {
    const std::int64_t o = at % outputs, first = at / outputs * shape.leaf;
    Acc acc = terms(o, first);
    for (std::int64_t i = 1; i < shape.leaf; ++i) acc = add_rn(acc, terms(o, first + i));
    if (shape.levels == 0) terms.finish(o, acc);
    else partials[at] = acc;
  }
}

// One level: node p of output o = child 2p + child 2p + 1.
template <typename Acc, typename Terms>
__global__ void tree_pairs_kernel(const __grid_constant__ Terms terms, std::int64_t outputs, std::int64_t nodes, const Acc* children,
                                  Acc* parents) {
  const std::int64_t total = outputs * nodes;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t at = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; at < total; at += stride) {
    const std::int64_t o = at % outputs, p = at / outputs;
    const Acc sum = add_rn(children[2 * p * outputs + o], children[(2 * p + 1) * outputs + o]);
    if (nodes == 1) terms.finish(o, sum);
    else parents[at] = sum;
  }
}

// Every output's n >= 1 terms summed in `tree`'s order: one launch for the leaves, one per level.
template <typename Acc, typename Terms>
void tree_sums(cudaStream_t stream, Workspace& workspace, const Terms& terms, std::int64_t outputs, std::int64_t n, const SumTree& tree,
               const char* kernel) {
  constexpr int kThreads = 256;
  const TreeShape shape = tree_shape(tree, n, kernel);
  std::int64_t nodes = shape.leaves();
  Acc* children = nullptr;
  Acc* parents = nullptr;
  if (shape.levels > 0) {  // two buffers: the leaves, then each level in the other one
    children = static_cast<Acc*>(workspace.get(static_cast<std::size_t>(outputs * (nodes + nodes / 2)) * sizeof(Acc)));
    parents = children + outputs * nodes;
  }
  tree_leaves_kernel<Acc, Terms><<<grid_for(static_cast<std::size_t>(outputs * nodes), kThreads), kThreads, 0, stream>>>(
      terms, shape, outputs, children);
  NAX_CUDA_CHECK_LAUNCH();
  while (nodes > 1) {
    nodes /= 2;
    tree_pairs_kernel<Acc, Terms><<<grid_for(static_cast<std::size_t>(outputs * nodes), kThreads), kThreads, 0, stream>>>(
        terms, outputs, nodes, children, parents);
    NAX_CUDA_CHECK_LAUNCH();
    std::swap(children, parents);
  }
}

}  // namespace nax::cuda::detail
