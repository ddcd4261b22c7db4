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

namespace nax::cuda {

// `multiprocessors` sizes the split of long reductions; the partial results of a split live in
// `workspace`.
void reduce(cudaStream_t stream, Workspace& workspace, int multiprocessors, ReduceOp op, DType dtype, const void* in, void* out,
            std::int64_t out_count, const kernels::Layout<2>& layout);

}  // namespace nax::cuda
