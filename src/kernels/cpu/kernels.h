#pragma once
// CPU kernels: raw compute on pointers, as the Kernels methods of their names say
// (nax/kernels/kernels.h). Layouts are given in elements; f32, f64 and i32 (bf16 is converted to
// f32 by the op layer, except by cast, copy, binary and the GEMM, which handle it directly).
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/strided.h"
#include "nax/core/reduce_op.h"
#include "nax/core/dtype.h"
#include "nax/kernels/sum_tree.h"

namespace nax::cpu {

using kernels::BinaryOp;
using kernels::UnaryOp;

void binary(BinaryOp op, DType dtype, const void* a, const void* b, void* out, const Layout<3>& layout);
void unary(UnaryOp op, DType dtype, const void* in, void* out, std::int64_t n);
void fill(DType dtype, void* out, std::int64_t n, double value);

void reduce(ReduceOp op, DType dtype, const void* in, void* out, std::int64_t out_count, const Layout<2>& layout,
            const SumTree& tree);
// The sum of reduce with `tree.on`: each output's inputs, row-major over the reduced dimensions,
// added in the tree's order (leaves from their first term).
void tree_sum(DType dtype, const void* in, void* out, std::int64_t out_count, const Layout<2>& layout, const SumTree& tree);

void copy(std::size_t element_size, const void* src, void* dst, const Layout<2>& layout);
// memcpy with non-temporal stores: for destinations that will not be read again soon (a peer's
// buffer), it spares the read-for-ownership of every destination line.
void stream_copy(void* dst, const void* src, std::size_t bytes);
void convert(DType from, const void* src, DType to, void* dst, std::int64_t n);

void accumulate(ReduceOp op, DType dtype, void* dst, const void* src, std::size_t n);
// dst = a op b element by element (dst may be a), with accumulate's bits.
void combine_into(ReduceOp op, DType dtype, void* dst, const void* a, const void* b, std::size_t n);

// C (m x n, row stride ldc) = A (m x k) * B (k x n) + beta C, row-major, each operand optionally
// transposed in memory. f32 and f64 through OpenBLAS, or with `tree.on` through tree_gemm.
void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          const void* a, std::int64_t lda, const void* b, std::int64_t ldb, void* c, std::int64_t ldc,
          double beta = 0.0, const SumTree& tree = {});

using kernels::GemmShape;
// Deterministic mode's GEMM (shape.tree on, f32 and f64): each C element its sum over k in the
// tree's order (leaves by fused multiply-adds from zero), then + beta C; the batch included.
void tree_gemm(DType dtype, const GemmShape& shape, const void* a, const void* b, void* c);

// Index ops' row kernels (kernels/kernels.h says what they compute), f32, f64 and i32.
void scan_rows(DType dtype, std::int64_t rows, std::int64_t n, const void* x, void* y, bool exclusive, bool reverse);
void top_k_rows(DType dtype, std::int64_t rows, std::int64_t n, std::int64_t k, bool largest, const void* x, void* values,
                std::int32_t* indices);

// The threads each BLAS call of this process uses (RuntimeOptions::blas_threads): OpenBLAS's and
// the bf16 GEMM's.
void set_blas_threads(int threads);
int blas_threads();

// GEMM through oneDNN's matmul (onednn_gemm.cpp), bf16 (f32 sums) and f32: available where oneDNN
// has kernels for the dtype on this processor; beta 0 and no tree. False (nothing computed) for an
// f32 shape oneDNN has only its reference loops for or refuses.
bool onednn_gemm_available(DType dtype);
bool onednn_gemm(DType dtype, const GemmShape& shape, const void* a, const void* b, void* c);

// One fused AdamW step (kernels/kernels.h says the formula), f32, out of place.
void adamw(std::int64_t n, const float* p, const float* m, const float* v, const float* g, float* p_out, float* m_out, float* v_out,
           const kernels::AdamWStep& step);

}  // namespace nax::cpu
