#pragma once
// CUDA row normalisations (norm.cu): layer_norm and (log-)softmax over contiguous rows of length
// n, f32, f64 or bf16 (statistics and sums in f32 for bf16). The semantics of nax/kernels/kernels.h.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/resources.h"
#include "nax/core/dtype.h"
#include "nax/kernels/sum_tree.h"

namespace nax::cuda {

// y = (x - mean) * rstd * scale + bias; mean and rstd (one per row; f32 for bf16, else of dtype) for the backward.
void layer_norm_forward(cudaStream_t stream, DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale,
                        const void* bias, double eps, void* y, void* mean, void* rstd);
// dx per row; dscale and dbias (overwritten) summed over rows, through per-chunk partials in
// `workspace` combined in a fixed order (no atomics: the same inputs give the same bits). With
// `rows_tree.on`, each column's sum over rows of dy * ((x - mean) * rstd) and of dy runs in the
// tree's order (tree_sum.cuh), the CPU's bits.
void layer_norm_backward(cudaStream_t stream, Workspace& workspace, int multiprocessors, DType dtype, std::int64_t rows,
                         std::int64_t n, const void* x, const void* scale, const void* mean, const void* rstd, const void* dy,
                         void* dx, void* dscale, void* dbias, const SumTree& rows_tree);
void softmax_forward(cudaStream_t stream, DType dtype, std::int64_t rows, std::int64_t n, const void* x, void* y, bool log);
// From the forward's output y: softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy).
void softmax_backward(cudaStream_t stream, DType dtype, std::int64_t rows, std::int64_t n, const void* y, const void* dy, void* dx,
                      bool log);

}  // namespace nax::cuda
