#include "global_model.h"

#include <fmt/format.h>

#include "model.h"

namespace gptj {

using namespace nax;

// GPTJBlock.forward: h = ln_1(x); attn_output + feed_forward_output + residual.
GlobalTensor GlobalModel::block(std::int64_t layer, const GlobalTensor& x) const {
  auto p = [&](const char* name) { return param(fmt::format("transformer.h.{}.{}", layer, name)); };
  const std::int64_t rot = config_.rotary_dims;
  // what the projections read: with sequence parallelism, gathered once along seq for all four
  GlobalTensor h = placed(layer_norm(x, "embed", p("ln_1.weight"), p("ln_1.bias"), config_.layer_norm_eps), false);
  GlobalTensor q = rotary(dot(h, p("attn.q_proj.weight"), "embed"), "seq", "head_dim", rot);
  GlobalTensor k = rotary(dot(h, p("attn.k_proj.weight"), "embed"), "seq", "head_dim", rot);
  GlobalTensor v = dot(h, p("attn.v_proj.weight"), "embed");
  GlobalTensor attn = dot(causal_attention(q, k, v, "seq", "head_dim"), p("attn.out_proj.weight"), {"heads", "head_dim"});
  GlobalTensor ff = dot(gelu(dot(h, p("mlp.fc_in.weight"), "embed") + p("mlp.fc_in.bias")), p("mlp.fc_out.weight"), "mlp") +
                    p("mlp.fc_out.bias");
  return attn + ff + x;
}

// The residual stream's and the LayerNorms' placements: the batch cut as the data is (axis_rules),
// the sequence over mp when `seq_cut` with sequence parallelism, the rest whole. FSDP needs the
// constraint too: its parameters are cut along embed over fsdp, and left to itself propagation
// would gather the batch (the ids are the smallest thing to move) and contract over embed cut
// over fsdp, psumming every activation, where FSDP gathers each parameter instead (as
// with_sharding_constraint does in a JAX FSDP model). Without either x is left to propagation.
GlobalTensor GlobalModel::placed(const GlobalTensor& x, bool seq_cut) const {
  const Mesh& mesh = Shard::current()->mesh();
  const bool sequence_cut = sequence_parallel_ && mesh.has("mp") && mesh.axis_size("mp") > 1;
  if (!sequence_cut && fsdp_devices(mesh) == 1) return x;
  const AxisRules data = axis_rules(mesh);
  AxisRules rules;
  if (!data.mesh_axes("batch").empty()) rules.set("batch", data.mesh_axes("batch"));
  if (sequence_cut && seq_cut) rules.set("seq", {"mp"});
  return with_sharding_constraint(x, rules);
}

GlobalTensor GlobalModel::logits(const GlobalTensor& ids) const {
  GlobalTensor x = placed(embedding(param("transformer.wte.weight"), ids, "vocab"), true);
  for (std::int64_t i = 0; i < config_.n_layers; ++i) x = placed(block(i, x), true);
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
