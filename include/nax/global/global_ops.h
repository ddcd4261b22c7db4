#pragma once
// Ops on global tensors (docs/architecture.md, Global view). Each has the per-shard op's name and meaning, and is
// written about as if on one device. Behind each call: the op's sharding rule (einsum-style
// factors, expanded per mesh axis), the strategy whose input redistributions cost least under the
// cost model (nax/global/cost_model.h; cached per op, placements and shapes), the
// redistributions, and the per-shard op on the local blocks. A reduction over a sharded axis
// gives a partial result, reduced only when a later op needs it whole: softmax, layer_norm and
// cross_entropy over a sharded axis work without gathering it.
#include <cstdint>
#include <string>

#include "nax/core/axis_rules.h"
#include "nax/core/names.h"
#include "nax/global/global_tensor.h"

namespace nax {

// --- steering ---
// The same global value with the placements given (collectives as docs/architecture.md's global view tabulates them).
// A shard of an axis whose size the mesh axes do not divide is refused, never padded.
GlobalTensor redistribute(const GlobalTensor& x, const Placements& placements);
// Tensor axes named in `rules` sharded over their mesh axes, the rest replicated.
GlobalTensor with_sharding_constraint(const GlobalTensor& x, const AxisRules& rules);
GlobalTensor stop_gradient(const GlobalTensor& x);
// Makes x an autodiff leaf (grad(loss.local(), {p.local()}) then gives its gradient).
GlobalTensor parameter(const GlobalTensor& x);

// --- elementwise (broadcast by name, like the per-shard ops) ---
GlobalTensor add(const GlobalTensor& a, const GlobalTensor& b);
GlobalTensor sub(const GlobalTensor& a, const GlobalTensor& b);
GlobalTensor mul(const GlobalTensor& a, const GlobalTensor& b);
GlobalTensor div(const GlobalTensor& a, const GlobalTensor& b);
GlobalTensor operator+(const GlobalTensor& a, const GlobalTensor& b);
GlobalTensor operator-(const GlobalTensor& a, const GlobalTensor& b);
GlobalTensor operator*(const GlobalTensor& a, const GlobalTensor& b);
GlobalTensor operator/(const GlobalTensor& a, const GlobalTensor& b);
GlobalTensor operator+(const GlobalTensor& a, double b);
GlobalTensor operator-(const GlobalTensor& a, double b);
GlobalTensor operator*(const GlobalTensor& a, double b);
GlobalTensor operator/(const GlobalTensor& a, double b);
GlobalTensor operator*(double a, const GlobalTensor& b);
GlobalTensor operator-(const GlobalTensor& x);
GlobalTensor exp(const GlobalTensor& x);
GlobalTensor log(const GlobalTensor& x);
GlobalTensor sqrt(const GlobalTensor& x);
GlobalTensor rsqrt(const GlobalTensor& x);
GlobalTensor tanh(const GlobalTensor& x);
GlobalTensor square(const GlobalTensor& x);
GlobalTensor gelu(const GlobalTensor& x);
GlobalTensor cast(const GlobalTensor& x, DType dtype);

// --- contraction and reductions ---
GlobalTensor dot(const GlobalTensor& a, const GlobalTensor& b, const Names& contract);
GlobalTensor sum(const GlobalTensor& x, const Names& axes);
GlobalTensor max(const GlobalTensor& x, const Names& axes);
GlobalTensor mean(const GlobalTensor& x, const Names& axes);

// --- layout ---
GlobalTensor rename(const GlobalTensor& x, const std::string& from, const std::string& to);
GlobalTensor transpose(const GlobalTensor& x, const Names& order);

// --- transformer ops (nax/ops/transformer_ops.h has their per-shard meaning) ---
// Over an axis that is whole on every device these run the fused per-shard kernels; over a
// sharded axis they are composed from the primitives above, so that the reductions become partial
// values and small all-reduces instead of gathering the axis.
GlobalTensor layer_norm(const GlobalTensor& x, const std::string& axis, const GlobalTensor& scale, const GlobalTensor& bias,
                        double eps = 1e-5);
GlobalTensor softmax(const GlobalTensor& x, const std::string& axis);
GlobalTensor log_softmax(const GlobalTensor& x, const std::string& axis);
// Mean cross-entropy over all of targets' axes: a replicated scalar.
GlobalTensor cross_entropy(const GlobalTensor& logits, const GlobalTensor& targets, const std::string& vocab);
GlobalTensor pick(const GlobalTensor& logits, const GlobalTensor& targets, const std::string& vocab);
GlobalTensor embedding(const GlobalTensor& table, const GlobalTensor& ids, const std::string& vocab);
GlobalTensor causal_attention(const GlobalTensor& q, const GlobalTensor& k, const GlobalTensor& v, const std::string& seq,
                              const std::string& head_dim);
GlobalTensor rotary(const GlobalTensor& x, const std::string& seq, const std::string& head_dim, std::int64_t rotary_dims,
                    std::int64_t position_offset = 0, double base = 10000.0);

// --- debugging ---
// Strategy choices of this thread's device: found in the cache, or chosen afresh. With the
// environment variable NAX_SHARDING_LOG=1, device 0 prints every fresh choice (op, input
// placements, the redistributions chosen, the result's placements and their cost) to stderr.
struct ShardingCacheStats {
  std::size_t hits = 0, misses = 0;
};
ShardingCacheStats sharding_cache_stats();

}  // namespace nax
