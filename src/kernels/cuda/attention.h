#pragma once
// Fused causal attention on CUDA, flash-attention style (forward and backward): no [tq x tk]
// matrix in device memory. Semantics as the kernel interface's causal_attention_forward and
// _backward (include/nax/kernels/kernels.h; the CPU reference is src/kernels/cpu/attention.cpp): query i
// of tq sits at key position i + sizes.query_offset and attends the keys up to that position,
// scores scaled by sizes.scale; lse[b * tq + i] is row i's log-sum-exp, f32 (-inf for a row that
// sees no key, whose output is 0).
//
// dtypes: f32 (FMAs, f32 throughout) and bf16 (tensor cores, f32 accumulation and softmax);
// head_dim up to 256; any tq, tk > 0 (the op layer writes the results of tk = 0 itself). The offsets arrays are host memory, read before the
// call returns. Work is enqueued on `stream`; the calls return without waiting for it.
// Algorithm: attention_forward.cuh, attention_backward.cuh, attention_deterministic_dq.cuh (the
// tile code they share: attention_warp.cuh); tiling: attention.cu; scratch: attention.cpp.
#include <cuda_runtime.h>

#include <cstdint>

#include "nax/kernels/kernels.h"

namespace nax::cuda {

// Scratch each call needs, in elements of sizes.dtype: none for the forward; the backward's
// per-row delta and its f32 dq accumulator (about batches * tq * (head_dim + 1) floats).
std::int64_t attention_forward_scratch(const kernels::AttentionSizes& sizes);
std::int64_t attention_backward_scratch(const kernels::AttentionSizes& sizes);

// out = softmax(q k^T * scale + causal mask) v; lse [batches x tq] f32.
void attention_forward(cudaStream_t stream, const kernels::AttentionSizes& sizes, const kernels::InMatrices& q,
                       const kernels::InMatrices& k, const kernels::InMatrices& v, const kernels::OutMatrices& out, void* lse,
                       void* scratch);

// dq, dk, dv (overwritten) from dout and dlse (f32, lse's layout; null when lse has no gradient),
// the probabilities recomputed from q, k and lse.
void attention_backward(cudaStream_t stream, const kernels::AttentionSizes& sizes, const kernels::InMatrices& q,
                        const kernels::InMatrices& k, const kernels::InMatrices& v, const kernels::InMatrices& out,
                        const kernels::InMatrices& dout, const void* lse, const void* dlse, const kernels::OutMatrices& dq,
                        const kernels::OutMatrices& dk, const kernels::OutMatrices& dv, void* scratch);

}  // namespace nax::cuda
