#include "export.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace gptj {

using namespace nax;

NamedTensors initial_parameters(const Config& config, const Mesh& mesh, std::uint64_t seed) {
  // On the mesh itself, as the trainer does, although the init does not depend on it.
  Runtime rt = Runtime::local(mesh);
  const auto specs = parameter_specs(config);
  const AxisRules rules = axis_rules(mesh);
  NamedTensors out;
  rt.run([&](Shard& s) {
    NamedTensors tensors = gather_hf_parameters(s, nn::Parameters::init(s, specs, rules, seed));
    if (s.device() == 0) out = std::move(tensors);
  });
  return out;
}

void export_run(const ExportOptions& options, const TextData& data) {
  const TrainOptions& o = options.train;
  if (options.out.empty()) fail("export", "no output folder (--out DIR)");
  if (o.steps < 1 || o.batch < 1 || o.seq < 1) fail("export", "--steps, --batch and --seq must be positive");
  const Mesh mesh = model_mesh(o.mesh);
  const Config config = padded_for(config_by_name(o.config), mesh);
  check_fits(config, mesh, o.batch);
  check_dp_mp_only(mesh, "gptj export");
  if (o.seq > config.max_seq) fail("export", "--seq {} exceeds the config's maximum {}", o.seq, config.max_seq);

  NamedTensors batches;
  std::vector<double> lrs;
  for (std::int64_t k = 0; k < o.steps; ++k) {
    auto [ids, targets] = data.batch(TextData::Split::train, k, o.batch, o.seq, o.seed);
    batches.push_back({fmt::format("ids.{}", k), ids});
    batches.push_back({fmt::format("targets.{}", k), targets});
    lrs.push_back(nn::warmup_cosine(k, o.warmup, o.steps, o.lr));
  }
  const NamedTensors model = initial_parameters(config, mesh, o.seed);

  const nn::AdamWConfig adam{.weight_decay = o.weight_decay, .shard_state_over = {}};  // as the trainer builds its optimizer
  // The schedule's floor, as a fraction of the peak: its value once past warmup and the total.
  const double final_ratio = nn::warmup_cosine(std::max(o.steps, o.warmup), o.warmup, o.steps, 1.0);
  nlohmann::json info = {
      {"config", config.name},
      {"dims",
       {{"vocab", config.vocab},
        {"unpadded_vocab", config_by_name(o.config).vocab},
        {"d_model", config.d_model},
        {"n_layers", config.n_layers},
        {"n_heads", config.n_heads},
        {"head_dim", config.head_dim},
        {"d_ff", config.d_ff},
        {"rotary_dims", config.rotary_dims},
        {"max_seq", config.max_seq},
        {"layer_norm_eps", config.layer_norm_eps}}},
      {"mesh", mesh.str()},
      {"seed", o.seed},
      {"batch", o.batch},
      {"seq", o.seq},
      {"steps", o.steps},
      {"optimizer",
       {{"name", "adamw"},
        {"lr", o.lr},
        {"warmup", o.warmup},
        {"total_steps", o.steps},
        {"schedule", "warmup_cosine"},
        {"final_lr_ratio", final_ratio},
        {"weight_decay", adam.weight_decay},
        {"weight_decay_min_rank", 2},
        {"clip", o.clip},
        {"beta1", adam.beta1},
        {"beta2", adam.beta2},
        {"eps", adam.eps}}},
      {"lr_per_step", lrs},
      {"parameters", nlohmann::json::array()},
      {"files", {"model.safetensors", "config.json", "batches.safetensors"}}};
  for (const auto& [name, t] : model) info["parameters"].push_back(name);

  std::error_code ec;
  std::filesystem::create_directories(options.out, ec);
  if (ec || !std::filesystem::is_directory(options.out)) fail("export", "--out: cannot create folder '{}': {}", options.out, ec ? ec.message() : "not a folder");
  const std::string dir = options.out;
  save_safetensors(dir + "/model.safetensors", model, {{"format", "pt"}});
  write_file_atomically(dir + "/config.json", hf_config_json(config));
  save_safetensors(dir + "/batches.safetensors", batches, {{"steps", std::to_string(o.steps)}});
  write_file_atomically(dir + "/export.json", info.dump(2) + "\n");
}

}  // namespace gptj
