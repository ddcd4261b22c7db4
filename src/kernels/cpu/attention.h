#pragma once
// CPU kernels of attention: fused causal softmax attention (forward and backward, flash-attention
// style over blocks of query rows, GEMMs through OpenBLAS) and the rotary position embedding.
// f32 and f64; the op layer computes bf16 in f32.
#include <cstdint>
#include <vector>

#include "nax/core/dtype.h"

namespace nax::cpu {

// One [rows x head_dim] matrix per batch index b, starting at data + offsets[b] (in elements), its
// rows `row_stride` elements apart and head_dim contiguous.
template <typename Pointer>
struct Matrices {
  Pointer data = nullptr;
  const std::int64_t* offsets = nullptr;
  std::int64_t row_stride = 0;
};
using InMatrices = Matrices<const void*>;
using OutMatrices = Matrices<void*>;

// Sizes of one causal attention call. Query i (of tq) sits at position i + tk - tq and attends
// keys 0..that position; scores are scaled by `scale`. Query rows are processed `block_rows` at a
// time so that only a [block_rows x tk] matrix of scores exists at once.
struct AttentionSizes {
  DType dtype = DType::f32;
  std::int64_t batches = 0, tq = 0, tk = 0, head_dim = 0;
  double scale = 1.0;
  std::int64_t block_rows = 128;
};

// Elements of `dtype` the caller provides as scratch to the forward and backward kernels.
std::int64_t attention_forward_scratch(const AttentionSizes& sizes);
std::int64_t attention_backward_scratch(const AttentionSizes& sizes);

// out = softmax(q k^T * scale + causal mask) v; lse[b * tq + i] = log-sum-exp of row i's scaled
// scores (contiguous [batches x tq]), all that the backward needs besides q, k, v and out.
void causal_attention_forward(const AttentionSizes& sizes, const InMatrices& q, const InMatrices& k, const InMatrices& v,
                              const OutMatrices& out, void* lse, void* scratch);

// dq, dk, dv from dout, recomputing the probabilities from q, k and lse. dq, dk and dv are
// overwritten.
void causal_attention_backward(const AttentionSizes& sizes, const InMatrices& q, const InMatrices& k, const InMatrices& v,
                               const InMatrices& out, const InMatrices& dout, const void* lse, const OutMatrices& dq,
                               const OutMatrices& dk, const OutMatrices& dv, void* scratch);

// Rotary embedding in place on data laid out with the given strides: for every index of the
// other axes (`outer_count` offsets in `outer_offsets`), every position s < seq_len and every pair
// i < rotary_dims / 2, the pair at head_dim indices (2i, 2i+1) turns by
// direction * (s + position_offset) * base^(-2i / rotary_dims).
struct RotarySizes {
  DType dtype = DType::f32;
  std::int64_t seq_len = 0, seq_stride = 0, head_dim_stride = 0;
  std::int64_t rotary_dims = 0, position_offset = 0;
  double base = 10000.0;
  double direction = 1.0;  // -1: the inverse rotation
};
void rotary_in_place(const RotarySizes& sizes, void* data, const std::int64_t* outer_offsets, std::int64_t outer_count);

// The element offset of every index of `rank` dimensions (row-major over them) with the given
// sizes and strides: how the op layer lists the matrices of a batch.
std::vector<std::int64_t> strided_offsets(const std::int64_t* sizes, const std::int64_t* strides, int rank);

}  // namespace nax::cpu
