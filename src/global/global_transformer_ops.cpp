// Global-view transformer ops. Over an axis whole on every device they run the fused per-shard
// kernels under a rule that keeps that axis whole; over a sharded axis they are composed from
// primitives, so each reduction becomes a partial value and a small all-reduce (as GSPMD sees it).
#include <fmt/format.h>

#include "global/propagation.h"
#include "nax/ops/ops.h"
#include "nax/ops/transformer_ops.h"

namespace nax {

using global_detail::apply;
using global_detail::Rule;

namespace {

bool sharded_along(const GlobalTensor& x, const std::string& axis) {
  for (const auto& [m, p] : x.placements().entries())
    if (p.is_shard() && p.axis() == axis) return true;
  return false;
}

}  // namespace

GlobalTensor layer_norm(const GlobalTensor& x, const std::string& axis, const GlobalTensor& scale, const GlobalTensor& bias, double eps) {
  x.shape().require(axis, "layer_norm");
  if (sharded_along(x, axis)) {
    const double n = static_cast<double>(x.size(axis));
    GlobalTensor centred = x - sum(x, axis) / n;
    GlobalTensor inv_std = rsqrt(sum(square(centred), axis) / n + eps);
    return centred * inv_std * scale + bias;
  }
  Rule rule("layer_norm", fmt::format("layer_norm:{}:{}", axis, eps), {x.shape().names(), scale.shape().names(), bias.shape().names()}, x.shape().names());
  rule.whole = {axis};
  return apply(rule, {&x, &scale, &bias}, [&](const std::vector<Tensor>& t) { return layer_norm(t[0], axis, t[1], t[2], eps); });
}

namespace {
GlobalTensor fused_over_whole(const std::string& op, const GlobalTensor& x, const std::string& axis, Tensor (*fn)(const Tensor&, const std::string&)) {
  Rule rule(op, op + ":" + axis, {x.shape().names()}, x.shape().names());
  rule.whole = {axis};
  return apply(rule, {&x}, [&](const std::vector<Tensor>& t) { return fn(t[0], axis); });
}
}  // namespace

GlobalTensor softmax(const GlobalTensor& x, const std::string& axis) {
  x.shape().require(axis, "softmax");
  if (!sharded_along(x, axis)) return fused_over_whole("softmax", x, axis, nax::softmax);
  GlobalTensor e = exp(x - stop_gradient(max(x, axis)));
  return e / sum(e, axis);
}

GlobalTensor log_softmax(const GlobalTensor& x, const std::string& axis) {
  x.shape().require(axis, "log_softmax");
  if (!sharded_along(x, axis)) return fused_over_whole("log_softmax", x, axis, nax::log_softmax);
  GlobalTensor z = x - stop_gradient(max(x, axis));
  return z - log(sum(exp(z), axis));
}

GlobalTensor pick(const GlobalTensor& logits, const GlobalTensor& targets, const std::string& vocab) {
  logits.shape().require(vocab, "pick");
  Rule rule("pick", "pick:" + vocab, {logits.shape().names(), targets.shape().names()}, targets.shape().names());
  rule.linear = {{0}};
  return apply(rule, {&logits, &targets}, [&](const std::vector<Tensor>& t) { return pick(t[0], t[1], vocab); });
}

// log-sum-exp minus the target's logit, from pieces: a vocab cut over mesh axes costs three small
// all-reduces (max, sum of exponentials, picked logit), never a gathered logits tensor.
GlobalTensor cross_entropy(const GlobalTensor& logits, const GlobalTensor& targets, const std::string& vocab) {
  logits.shape().require(vocab, "cross_entropy");
  GlobalTensor z = logits - stop_gradient(max(logits, vocab));
  GlobalTensor per_token = log(sum(exp(z), vocab)) - pick(z, targets, vocab);
  return redistribute(mean(per_token, per_token.shape().names()), Placements{});
}

GlobalTensor embedding(const GlobalTensor& table, const GlobalTensor& ids, const std::string& vocab) {
  table.shape().require(vocab, "embedding");
  std::vector<std::string> out = ids.shape().names();
  for (const auto& a : global_detail::without(table.shape().names(), {vocab})) out.push_back(a);
  Rule rule("embedding", "embedding:" + vocab, {table.shape().names(), ids.shape().names()}, out);
  rule.linear = {{0}};
  return apply(rule, {&table, &ids}, [&](const std::vector<Tensor>& t) { return embedding(t[0], t[1], vocab); });
}

GlobalTensor causal_attention(const GlobalTensor& q, const GlobalTensor& k, const GlobalTensor& v, const std::string& seq,
                              const std::string& head_dim) {
  Rule rule("causal_attention", "causal_attention:" + seq + ":" + head_dim, {q.shape().names(), k.shape().names(), v.shape().names()}, q.shape().names());
  rule.whole = {seq, head_dim};
  return apply(rule, {&q, &k, &v}, [&](const std::vector<Tensor>& t) { return causal_attention(t[0], t[1], t[2], seq, head_dim); });
}

GlobalTensor rotary(const GlobalTensor& x, const std::string& seq, const std::string& head_dim, std::int64_t rotary_dims,
                    std::int64_t position_offset, double base) {
  Rule rule("rotary", fmt::format("rotary:{}:{}:{}:{}:{}", seq, head_dim, rotary_dims, position_offset, base), {x.shape().names()}, x.shape().names());
  rule.whole = {seq, head_dim};
  return apply(rule, {&x}, [&](const std::vector<Tensor>& t) { return rotary(t[0], seq, head_dim, rotary_dims, position_offset, base); });
}

}  // namespace nax
