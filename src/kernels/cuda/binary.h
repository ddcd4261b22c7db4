#pragma once
// CUDA elementwise arithmetic on any dtype (binary.cu), with the CPU kernels' semantics: bf16 in
// f32, integer division by zero gives 0, comparisons give 1 or 0 of the dtype, max/min as
// `a > b ? a : b`. Each is enqueued on `stream`.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "nax/kernels/kernels.h"
#include "nax/core/reduce_op.h"
#include "nax/core/dtype.h"

namespace nax::cuda {

// out = op(a, b): a, b and out at strides[0], [1] and [2] of the layout.
void binary(cudaStream_t stream, kernels::BinaryOp op, DType dtype, const void* a, const void* b, void* out,
            const kernels::Layout<3>& layout);
void unary(cudaStream_t stream, kernels::UnaryOp op, DType dtype, const void* in, void* out, std::int64_t n);
// dst[i] = op(dst[i], src[i]); a NaN propagates through max and min.
void accumulate(cudaStream_t stream, ReduceOp op, DType dtype, void* dst, const void* src, std::size_t n);

}  // namespace nax::cuda
