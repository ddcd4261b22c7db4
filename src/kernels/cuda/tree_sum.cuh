#pragma once
// Deterministic mode's sums for many outputs at once, level by level (tree_sums below): one
// thread per (output, leaf) folds the leaves, then one launch per level adds pairs of nodes.
// The tree and its one-output walks: tree_walk.h.
#include <cstdint>
#include <utility>

#include "kernels/cuda/check.h"
#include "kernels/cuda/map.cuh"
#include "kernels/cuda/resources.h"
#include "kernels/cuda/tree_walk.h"
#include "nax/kernels/sum_tree.h"

namespace nax::cuda::detail {

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
