#pragma once
// CUDA kernels that fill, move and select elements of any dtype (layout.cu), with the semantics of
// the kernel interface (nax/kernels/kernels.h) and the CPU kernels. Each is enqueued on `stream`.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "nax/kernels/kernels.h"
#include "nax/core/dtype.h"

namespace nax::cuda {

// out[0..n) = value converted to dtype (a C++ cast; bf16 rounds to nearest even).
void fill(cudaStream_t stream, DType dtype, void* out, std::int64_t n, double value);
void copy(cudaStream_t stream, std::size_t element_size, const void* src, void* dst, const kernels::Layout<2>& layout);
void convert(cudaStream_t stream, DType from, const void* src, DType to, void* dst, std::int64_t n);
void where(cudaStream_t stream, DType dtype, const void* cond, const void* a, const void* b, void* out,
           const kernels::Layout<4>& layout);
// data = factor * data at the layout's offsets; factor 0 writes zeros (whatever was there, NaN too).
void scale(cudaStream_t stream, DType dtype, void* data, const kernels::Layout<1>& layout, double factor);

}  // namespace nax::cuda
