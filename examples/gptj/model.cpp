#include "model.h"

#include <fmt/format.h>

#include <cmath>

namespace gptj {

using namespace nax;

std::vector<nn::ParamSpec> parameter_specs(const Config& c) {
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layers));
  std::vector<nn::ParamSpec> specs{{"transformer.wte.weight", Shape{{"vocab", c.vocab}, {"embed", c.d_model}}, nn::Init::normal, 0.02}};
  for (std::int64_t i = 0; i < c.n_layers; ++i) {
    for (const auto& [name, shape] : block_parameter_shapes(block_config(c))) {
      nn::ParamSpec spec{fmt::format("transformer.h.{}.{}", i, name), shape, nn::Init::normal, 0.02};
      if (name.ends_with(".bias")) spec.init = nn::Init::zeros;
      if (name == "ln_1.weight") spec.init = nn::Init::ones;
      if (name == "attn.out_proj.weight" || name == "mlp.fc_out.weight") spec.stddev = residual_std;
      specs.push_back(spec);
    }
  }
  specs.push_back({"transformer.ln_f.weight", Shape{{"embed", c.d_model}}, nn::Init::ones});
  specs.push_back({"transformer.ln_f.bias", Shape{{"embed", c.d_model}}, nn::Init::zeros});
  specs.push_back({"lm_head.weight", Shape{{"vocab", c.vocab}, {"embed", c.d_model}}, nn::Init::normal, 0.02});
  specs.push_back({"lm_head.bias", Shape{{"vocab", c.vocab}}, nn::Init::zeros});
  return specs;
}

AxisRules axis_rules(const Mesh& mesh) {
  AxisRules rules{{"vocab", "mp"}, {"heads", "mp"}, {"mlp", "mp"}};
  if (mesh.has("dp")) rules.set("batch", {"dp"});
  if (context_devices(mesh) > 1) rules.set("seq", {"cp"});  // in zigzag order (ring_attention.h)
  if (fsdp_devices(mesh) > 1) {  // FSDP: a data-parallel axis that also cuts every parameter with an embed axis
    rules.set("batch", mesh.has("dp") ? std::vector<std::string>{"dp", "fsdp"} : std::vector<std::string>{"fsdp"});
    rules.set("embed", {"fsdp"});
  }
  return rules;
}

BlockConfig block_config(const Config& c) {
  return BlockConfig{.d_model = c.d_model, .n_heads = c.n_heads, .head_dim = c.head_dim, .d_ff = c.d_ff, .rotary_dims = c.rotary_dims, .layer_norm_eps = c.layer_norm_eps};
}

namespace {

// A parameter as the model uses it: in the compute dtype and, under FSDP, gathered along embed over
// fsdp (after the cast, so that bf16 travels), the same on every device (Invariant); its gradient,
// the devices' terms from their blocks of the batch, is reduce-scattered back to this device's
// block. Under remat the gather runs again in the backward, as FSDP's does.
bool cut_by_fsdp(const Tensor& p) { return !p.vary().split_mesh_axes("embed").empty(); }

Tensor in_use(const Tensor& stored, DType compute) {
  const Tensor p = for_compute(stored, compute);
  return cut_by_fsdp(p) ? all_gather_invariant(p, "fsdp", "embed") : p;
}

// The same, started (the prefetch of stage_blocks).
Pending<Tensor> start_in_use(const Tensor& stored, DType compute) {
  const Tensor p = for_compute(stored, compute);
  if (!cut_by_fsdp(p)) return Pending<Tensor>("whole already", [p] { return p; });
  return start_all_gather_invariant(p, "fsdp", "embed");
}

BlockParams in_compute_dtype(const std::vector<Tensor>& stored, DType compute) {
  std::vector<Tensor> block;
  for (const auto& p : stored) block.push_back(in_use(p, compute));
  return BlockParams::from(block);
}

}  // namespace

Tensor Model::param(const std::vector<Tensor>& values, const std::string& name) const {
  const auto& specs = params_.specs();
  for (std::size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name == name) return in_use(values[i], compute_);
  fail("gptj", "stage {} of {} holds no parameter '{}'", stage_.index, stage_.count, name);
}

// Block i's parameters as the model holds them (the f32 master weights under bf16 compute): ten
// per layer, after the embedding on the first stage.
std::vector<Tensor> Model::stored_block(const std::vector<Tensor>& values, std::int64_t i) const {
  const auto first = static_cast<std::size_t>((stage_.first() ? 1 : 0) + (i - stage_.first_layer) * 10);
  return {values.begin() + static_cast<std::ptrdiff_t>(first), values.begin() + static_cast<std::ptrdiff_t>(first + 10)};
}

// Under remat the casts to the compute dtype run inside the checkpointed function, so that their
// bf16 copies are not kept from forward to backward either.
Tensor Model::block_forward(const std::vector<Tensor>& values, std::int64_t i, const Tensor& x, const BlockConfig& bc, KVCache* cache) const {
  if (!remat_ || cache != nullptr) return block(in_compute_dtype(stored_block(values, i), compute_), x, bc, cache);
  return nax::remat([stored = stored_block(values, i), compute = compute_, bc](const Tensor& h) {
    return block(in_compute_dtype(stored, compute), h, bc);
  }, x);
}

std::vector<Pending<Tensor>> Model::start_gathers(const std::vector<Tensor>& values, std::int64_t i) const {
  std::vector<Pending<Tensor>> gathers;
  for (const Tensor& stored : stored_block(values, i)) gathers.push_back(start_in_use(stored, compute_));
  return gathers;
}

Tensor Model::stage_blocks(const std::vector<Tensor>& values, Tensor x, const BlockConfig& bc) const {
  const bool prefetch = !remat_ && fsdp_devices(Shard::current()->mesh()) > 1;
  if (!prefetch) {
    for (std::int64_t i = stage_.first_layer; i < stage_.end_layer; ++i) x = block_forward(values, i, x, bc, nullptr);
    return x;
  }
  std::vector<Pending<Tensor>> next = start_gathers(values, stage_.first_layer);
  for (std::int64_t i = stage_.first_layer; i < stage_.end_layer; ++i) {
    std::vector<Tensor> gathered;
    for (auto& p : next) gathered.push_back(p.wait());
    if (i + 1 < stage_.end_layer) next = start_gathers(values, i + 1);
    x = block(BlockParams::from(gathered), x, bc);
  }
  return x;
}

BlockConfig Model::block_config_for(bool generating) const {
  BlockConfig bc = block_config(config_);
  bc.sequence_parallel = sequence_parallel_ && !generating && axis_size("mp") > 1;  // mp=1: nothing to cut
  bc.context_parallel = !generating && context_devices(Shard::current()->mesh()) > 1;
  bc.deterministic = Shard::current()->deterministic();
  bc.overlap_pieces = overlap_pieces_;
  return bc;
}

// Deterministic context parallelism: the whole sequence's embeddings, then this device's block, so
// that the table's gradient sums whole rows.
Tensor Model::embed(const std::vector<Tensor>& values, const Tensor& ids, const BlockConfig& bc) const {
  if (context_gathered(bc))
    return own_block(psum(embedding(param(values, "transformer.wte.weight"), all_gather_invariant(ids, "cp", "seq"), "vocab"), "mp"), "cp",
                     "seq");
  return sum_over_mp(embedding(param(values, "transformer.wte.weight"), ids, "vocab"), bc);
}

Tensor Model::head(const std::vector<Tensor>& values, const Tensor& x, const BlockConfig& bc) const {
  const Tensor h = normalized(x, param(values, "transformer.ln_f.weight"), param(values, "transformer.ln_f.bias"), config_.layer_norm_eps, bc);
  return dot(h, param(values, "lm_head.weight"), "embed") + param(values, "lm_head.bias");
}

Tensor Model::stage_forward(const std::vector<Tensor>& values, const Tensor& input, const Tensor& ids, const Tensor& targets) const {
  const BlockConfig bc = block_config_for(false);
  const Tensor x = stage_blocks(values, stage_.first() ? embed(values, ids, bc) : input, bc);
  return stage_.last() ? mean_loss(head(values, x, bc), targets_for(targets, bc)) : x;
}

// The targets as the head's logits hold them: the whole sequence under deterministic context
// parallelism (its head runs on gathered rows).
Tensor Model::targets_for(const Tensor& targets, const BlockConfig& bc) const {
  return context_gathered(bc) ? all_gather_invariant(targets, "cp", "seq") : targets;
}

Tensor Model::stage_activation_zeros(const Tensor& ids) const {
  VaryType vary = ids.vary();
  std::int64_t seq = ids.size("seq");
  if (block_config_for(false).sequence_parallel) {
    vary.set_split("mp", "seq");
    seq /= axis_size("mp");
  }
  NoGrad no_grad;
  return pvary(zeros(Shape{{"batch", ids.size("batch")}, {"seq", seq}, {"embed", config_.d_model}}, compute_).with_vary(vary), "pp");
}

Tensor Model::logits(const Tensor& ids, std::vector<KVCache>* caches) const {
  require_whole("logits");
  if (caches != nullptr && caches->size() != static_cast<std::size_t>(config_.n_layers))
    caches->resize(static_cast<std::size_t>(config_.n_layers));
  const auto& values = params_.values();
  const BlockConfig bc = block_config_for(caches != nullptr);
  Tensor x = embed(values, ids, bc);
  if (caches == nullptr) return head(values, stage_blocks(values, x, bc), bc);
  for (std::int64_t i = 0; i < config_.n_layers; ++i) x = block_forward(values, i, x, bc, &(*caches)[static_cast<std::size_t>(i)]);
  return head(values, x, bc);
}

Tensor Model::mean_loss(const Tensor& logits, const Tensor& targets) const {
  Tensor local = cross_entropy(loss_precision(logits), targets, "vocab", {"mp"});
  std::vector<std::string> cut;  // the batch over dp, the sequence over cp (not pp: the stages hold different values)
  for (const auto& axis : local.vary().unreduced_mesh_axes())
    if (axis != "pp") cut.push_back(axis);
  return cut.empty() ? local : pmean(local, cut);
}

Tensor Model::loss(const Tensor& ids, const Tensor& targets) const { return mean_loss(logits(ids), targets_for(targets, block_config_for(false))); }

void Model::require_whole(const char* what) const {
  if (stage_.count > 1)
    fail("gptj", "{}: this model holds stage {} of {} of a pipeline (layers {} to {}); run it with run_pipeline (pipeline.h)", what,
         stage_.index, stage_.count, stage_.first_layer, stage_.end_layer - 1);
}

}  // namespace gptj
