#pragma once
// CPU kernels of attention: fused causal softmax attention with a query offset (forward and backward, flash-attention
// style over blocks of query rows, GEMMs through OpenBLAS, or through tree_gemm when sizes.tree is
// on) and the rotary position embedding, as the Kernels methods of their names say
// (nax/kernels/kernels.h). f32 and f64; the op layer computes bf16 in f32.
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

std::int64_t attention_forward_scratch(const AttentionSizes& sizes);
std::int64_t attention_backward_scratch(const AttentionSizes& sizes);

void causal_attention_forward(const AttentionSizes& sizes, const InMatrices& q, const InMatrices& k, const InMatrices& v,
                              const OutMatrices& out, void* lse, void* scratch);

void causal_attention_backward(const AttentionSizes& sizes, const InMatrices& q, const InMatrices& k, const InMatrices& v,
                               const InMatrices& out, const InMatrices& dout, const void* lse, const void* dlse, const OutMatrices& dq,
                               const OutMatrices& dk, const OutMatrices& dv, void* scratch);

void rotary_in_place(const RotarySizes& sizes, void* data, const std::int64_t* outer_offsets, std::int64_t outer_count);

}  // namespace nax::cpu
