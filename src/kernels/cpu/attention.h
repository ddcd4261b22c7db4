#pragma once
// CPU kernels of attention: fused causal softmax attention (forward and backward, flash-attention
// style over blocks of query rows, GEMMs through OpenBLAS, or through tree_gemm when sizes.tree is
// on) and the rotary position embedding.
// f32 and f64; the op layer computes bf16 in f32.
#include <cstdint>
#include <vector>

#include "nax/kernels/kernels.h"
#include "nax/core/dtype.h"

namespace nax::cpu {

using kernels::AttentionSizes;
using kernels::InMatrices;
using kernels::OutMatrices;
using kernels::RotarySizes;
using kernels::strided_offsets;

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

// Rotary embedding in place (kernels/kernels.h says how).
void rotary_in_place(const RotarySizes& sizes, void* data, const std::int64_t* outer_offsets, std::int64_t outer_count);

}  // namespace nax::cpu
