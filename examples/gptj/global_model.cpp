#include "global_model.h"

#include <fmt/format.h>

namespace gptj {

using namespace nax;

// GPTJBlock.forward: h = ln_1(x); attn_output + feed_forward_output + residual.
GlobalTensor GlobalModel::block(std::int64_t layer, const GlobalTensor& x) const {
  auto p = [&](const char* name) { return param(fmt::format("transformer.h.{}.{}", layer, name)); };
  const std::int64_t rot = config_.rotary_dims;
  GlobalTensor h = whole_sequence(layer_norm(x, "embed", p("ln_1.weight"), p("ln_1.bias"), config_.layer_norm_eps));
  GlobalTensor q = rotary(dot(h, p("attn.q_proj.weight"), "embed"), "seq", "head_dim", rot);
  GlobalTensor k = rotary(dot(h, p("attn.k_proj.weight"), "embed"), "seq", "head_dim", rot);
  GlobalTensor v = dot(h, p("attn.v_proj.weight"), "embed");
  GlobalTensor attn = dot(causal_attention(q, k, v, "seq", "head_dim"), p("attn.out_proj.weight"), {"heads", "head_dim"});
  GlobalTensor ff = dot(gelu(dot(h, p("mlp.fc_in.weight"), "embed") + p("mlp.fc_in.bias")), p("mlp.fc_out.weight"), "mlp") +
                    p("mlp.fc_out.bias");
  return attn + ff + x;
}

namespace {

// The activations' placement under sequence parallelism: the batch cut as the data is, the
// sequence over mp when `seq_cut`, the rest whole.
AxisRules activation_rules(const Mesh& mesh, bool seq_cut) {
  AxisRules rules;
  if (seq_cut) rules.set("seq", {"mp"});
  std::vector<std::string> batch;
  for (const auto* axis : {"dp", "fsdp"})
    if (mesh.has(axis)) batch.push_back(axis);
  if (!batch.empty()) rules.set("batch", batch);
  return rules;
}

bool cuts_sequence(bool sequence_parallel) {
  const Mesh& mesh = Shard::current()->mesh();
  return sequence_parallel && mesh.has("mp") && mesh.axis_size("mp") > 1;
}

}  // namespace

GlobalTensor GlobalModel::between_blocks(const GlobalTensor& x) const {
  return cuts_sequence(sequence_parallel_) ? with_sharding_constraint(x, activation_rules(Shard::current()->mesh(), true)) : x;
}

// What the projections read: with sequence parallelism gathered once along seq for all four of them.
GlobalTensor GlobalModel::whole_sequence(const GlobalTensor& h) const {
  return cuts_sequence(sequence_parallel_) ? with_sharding_constraint(h, activation_rules(Shard::current()->mesh(), false)) : h;
}

GlobalTensor GlobalModel::logits(const GlobalTensor& ids) const {
  GlobalTensor x = between_blocks(embedding(param("transformer.wte.weight"), ids, "vocab"));
  for (std::int64_t i = 0; i < config_.n_layers; ++i) x = between_blocks(block(i, x));
  GlobalTensor h = layer_norm(x, "embed", param("transformer.ln_f.weight"), param("transformer.ln_f.bias"), config_.layer_norm_eps);
  return dot(h, param("lm_head.weight"), "embed") + param("lm_head.bias");
}

GlobalTensor GlobalModel::loss(const GlobalTensor& ids, const GlobalTensor& targets) const {
  return cross_entropy(loss_precision(logits(ids)), targets, "vocab");
}

Tensor GlobalModel::loss(const Tensor& ids, const Tensor& targets) const {
  return loss(GlobalTensor::from_local(ids), GlobalTensor::from_local(targets)).local();
}

}  // namespace gptj
