#pragma once
// The ops a transformer layer needs, each with its backward next to its forward (src/ops/), vary
// rules, and a nax::Error naming the op, the axes and the shapes on bad input.
#include <cstdint>
#include <string>

#include "nax/core/names.h"
#include "nax/tensor/tensor.h"

namespace nax {

// (x - mean) / sqrt(var + eps) * scale + bias over `axis`; the result has x's shape. scale and
// bias are exactly [axis] (x's size) and `axis` must be whole on each device (not cut over a mesh
// axis). The backward pass keeps only each row's mean and 1/std besides the inputs.
Tensor layer_norm(const Tensor& x, const std::string& axis, const Tensor& scale, const Tensor& bias, double eps = 1e-5);

// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). The result has x's shape.
Tensor gelu(const Tensor& x);

// Softmax and log-softmax over `axis` (numerically stable; the result has x's shape). `axis` must
// not be cut over a mesh axis: over a vocab cut over `mp`, use the vocab-parallel pieces below.
Tensor softmax(const Tensor& x, const std::string& axis);
Tensor log_softmax(const Tensor& x, const std::string& axis);

// cond != 0 ? a : b, broadcasting by name like the arithmetic ops: the result has a's axes in order,
// then b's other axes, then cond's other axes; an axis named in several operands has one size. a
// and b share a dtype (the result's); cond may be any dtype. No gradient flows to cond.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// Causal softmax attention scaled by 1/sqrt(head_dim). q, k and v carry the same axis names:
// `seq`, `head_dim` and batch axes (e.g. batch, heads), in any memory order (an operand whose
// head_dim is its last axis is read in place, others are permuted once); k and v may be longer
// along `seq` than q (a KV cache): query i then sits at position i + len(k) - len(q) and attends
// the keys up to that position. The result has q's shape and axis order. Batch axes may be cut
// over mesh axes (heads over mp, batch over dp); `seq` and `head_dim` may not.
// Fused forward and backward: the scores exist one block of query rows at a time, only each row's
// log-sum-exp is kept for the backward pass, and the probabilities are recomputed there.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, const std::string& seq, const std::string& head_dim);

// Which keys each query of attention_block sees.
struct AttentionMask {
  // Query i sits at key position i + query_offset and sees the keys at or before it. 0: q and k
  // are the same positions; in general the position of q's first row minus that of k's (a block
  // of keys from before the queries' sees more, one from after sees fewer or none).
  static AttentionMask causal(std::int64_t query_offset = 0) { return {query_offset, false}; }
  // Every query sees every key.
  static AttentionMask full() { return {0, true}; }

  std::int64_t query_offset = 0;
  bool all_keys = false;
};

// One block of attention and each query's log-sum-exp, the building block of attention over a
// sequence in pieces (flash attention's blocks, ring attention's steps).
struct AttentionBlock {
  Tensor out;  // q's shape, axis order and dtype
  // q's axes but head_dim (the batch axes in q's order, then seq): log sum_j exp(score_ij) over
  // the keys query i sees, scores scaled by 1/sqrt(head_dim); -inf (and out 0) where it sees none.
  // f32 for bf16 operands, else their dtype.
  Tensor lse;
};

// Softmax attention of the queries q to the keys k and values v under `mask`, with its log-sum-exp.
// Axes as causal_attention's, except that k and v may be any length along `seq` (not even that of q)
// and `seq` may be cut over mesh axes: each device attends its block of queries to the block of
// keys it holds, which the mask places. The result is cut as q is (keys cut along `seq` are
// per-device blocks: over those mesh axes the result is Varying unless q's rows are cut too).
// Gradients flow from both out and lse (the combine step needs the latter). Fused forward and
// backward, as causal_attention.
AttentionBlock attention_block(const Tensor& q, const Tensor& k, const Tensor& v, const std::string& seq, const std::string& head_dim,
                               AttentionMask mask = AttentionMask::causal());

// The attention of the same queries over the keys of both blocks, from the two blocks' results:
// the step of an online softmax (out weighted by exp(lse_a - lse) and exp(lse_b - lse), lse the
// log of the sum of exponentials). Ring attention is attention_block over the block a device holds,
// then, for each block received from its neighbour (ppermute), combine_attention with
// attention_block over it. Differentiable in all four tensors; a query neither block lets see a key
// stays out 0, lse -inf. out in a's dtype.
AttentionBlock combine_attention(const AttentionBlock& a, const AttentionBlock& b);

// GPT-J's rotary position embedding on the first `rotary_dims` of `head_dim`, interleaved form:
// each pair (x[2i], x[2i+1]) at position p turns by the angle p * base^(-2i / rotary_dims), to
// (x0 cos - x1 sin, x1 cos + x0 sin); the other dims pass through. Positions are the `seq` index
// plus `position_offset`. rotary_dims must be even and at most the size of head_dim; `seq` and
// `head_dim` must not be cut over a mesh axis. Any axis order; the result has x's.
Tensor rotary(const Tensor& x, const std::string& seq, const std::string& head_dim, std::int64_t rotary_dims,
              std::int64_t position_offset = 0, double base = 10000.0);

// Rows of `table` ([vocab, ...]) picked by the i32 `ids`: the result has ids' axes then the
// table's other axes (in the table's order). When `vocab` is cut over mesh axes, the table holds
// one block of the vocabulary (block r of the group starts at r * local size); ids outside it give
// zero rows, and the result is a partial value (Varying over those axes) to psum: the
// vocab-parallel embedding. No one-hot is materialised. An id outside the whole vocabulary is an
// error. The gradient goes to the table only.
Tensor embedding(const Tensor& table, const Tensor& ids, const std::string& vocab);

// logits[..., target] along `vocab` for i32 `targets`, which have exactly the logits' other axes (in
// any order; the result has targets' shape). With `vocab` cut over mesh axes, targets outside this
// device's block give 0 (a partial value, Varying over those axes, to psum).
Tensor pick(const Tensor& logits, const Tensor& targets, const std::string& vocab);

// Mean cross-entropy of `logits` against i32 `targets` over all of targets' axes, computed without
// gathering a vocab cut over `mesh_axes`: pmax of the local max (on a stop_gradient value), psum of
// the local sums of exponentials and of the picked target logits. `mesh_axes` must be exactly the
// mesh axes cutting `vocab` (empty: the vocab is whole). Where a target axis is cut (batch over
// dp), the result is this device's mean, Varying over those mesh axes: pmean it. bf16 logits are
// computed in f32 and give an f32 loss.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const std::string& vocab,
                     const std::vector<std::string>& mesh_axes = {});

}  // namespace nax
