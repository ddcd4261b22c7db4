#pragma once
// Deterministic mode's GEMM on CUDA (GemmShape::tree.on; kernels.h gives the order): each C
// element's sum over k in the tree's order, a leaf by fused multiply-adds from +0 in k order, a
// node left + right, then C = sum + beta C_old (beta 0: C is not read). The order depends on k
// and the tree only, never on m, n, the batch, the strides or the grid; f32 and f64 match the CPU
// bit for bit. f32, f64, and bf16 operands and result with f32 accumulation (as gemm_lt).
#include <cuda_runtime.h>

#include "nax/core/dtype.h"
#include "nax/kernels/kernels.h"

namespace nax::cuda {

// shape.m, n, k and batch > 0; row strides of 0 mean packed rows.
void tree_gemm(cudaStream_t stream, DType dtype, const kernels::GemmShape& shape, const void* a, const void* b, void* c);

}  // namespace nax::cuda
