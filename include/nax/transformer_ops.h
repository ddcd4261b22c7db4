#pragma once
// The ops a transformer layer needs, each with its backward next to its forward (src/ops/), vary
// rules, and a nax::Error naming the op, the axes and the shapes on bad input.
#include <cstdint>
#include <string>

#include "nax/core/names.h"
#include "nax/tensor.h"

namespace nax {

// (x - mean) / sqrt(var + eps) * scale + bias over `axis`; scale and bias are [axis]. `axis` must
// not be cut over a mesh axis.
Tensor layer_norm(const Tensor& x, const std::string& axis, const Tensor& scale, const Tensor& bias, double eps = 1e-5);

// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
Tensor gelu(const Tensor& x);

// Softmax and log-softmax over `axis` (not cut over a mesh axis: over a vocab cut over `mp`, use
// the vocab-parallel pieces below).
Tensor softmax(const Tensor& x, const std::string& axis);
Tensor log_softmax(const Tensor& x, const std::string& axis);

// cond != 0 ? a : b, broadcasting by name like the arithmetic ops. No gradient flows to cond.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// Causal softmax attention scaled by 1/sqrt(head_dim). q, k and v carry the same axis names:
// `seq`, `head_dim` and batch axes (e.g. batch, heads); k and v may be longer along `seq` than q
// (a KV cache): query i then sits at position i + len(k) - len(q). The result has q's shape.
// Fused forward and backward: only each row's log-sum-exp is kept for the backward pass, the
// [seq x seq] probabilities are recomputed there.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, const std::string& seq, const std::string& head_dim);

// GPT-J's rotary position embedding on the first `rotary_dims` of `head_dim`, interleaved form:
// each pair (x[2i], x[2i+1]) at position p turns by p * base^(-2i / rotary_dims). Positions are the
// `seq` index plus `position_offset`.
Tensor rotary(const Tensor& x, const std::string& seq, const std::string& head_dim, std::int64_t rotary_dims,
              std::int64_t position_offset = 0, double base = 10000.0);

// Rows of `table` ([vocab, ...]) picked by the integer `ids`: the result has ids' axes then the
// table's other axes. When `vocab` is cut over mesh axes, the table holds one block of the
// vocabulary; ids outside it give zero rows, and the result is a partial value (Varying over those
// axes) to psum: the vocab-parallel embedding. No one-hot is materialised.
Tensor embedding(const Tensor& table, const Tensor& ids, const std::string& vocab);

// logits[..., target] along `vocab` for integer `targets` (axes: logits' other axes). With `vocab`
// cut over mesh axes, targets outside this device's block give 0 (a partial value to psum).
Tensor pick(const Tensor& logits, const Tensor& targets, const std::string& vocab);

// Mean cross-entropy of `logits` against integer `targets`, computed without gathering a vocab
// cut over `mesh_axes`: pmax of the local max (on a stop_gradient value), psum of the local sums
// of exponentials and of the picked target logits. Empty `mesh_axes`: the vocab is whole.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const std::string& vocab,
                     const std::vector<std::string>& mesh_axes = {});

}  // namespace nax
