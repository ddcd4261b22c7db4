#pragma once
// The CUDA reduction (reduce.cu): out[j] = op over the input elements that map to j, the layout
// iterating the input with strides[0] and the output with strides[1] (0 along reduced dimensions);
// out (out_count elements) is initialised here. f32, f64, i32, and bf16 accumulated in f32.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/resources.h"
#include "nax/kernels/kernels.h"
#include "nax/core/reduce_op.h"
#include "nax/core/dtype.h"
#include "nax/kernels/sum_tree.h"

namespace nax::cuda {

// `multiprocessors` sizes the split of long reductions; the partial results of a split live in
// `workspace`. A floating sum with `tree.on` adds each output's inputs (row-major over the reduced
// dimensions) in the tree's order instead (tree_sum.cuh); integer sums are exact in any order.
void reduce(cudaStream_t stream, Workspace& workspace, int multiprocessors, ReduceOp op, DType dtype, const void* in, void* out,
            std::int64_t out_count, const kernels::Layout<2>& layout, const SumTree& tree);

}  // namespace nax::cuda
