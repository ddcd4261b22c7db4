#include "step_files.h"

#include <filesystem>

#include "checkpoint.h"
#include "model.h"

namespace gptj {

namespace ckpt = nax::checkpoint;
using nax::io::JsonValue;

namespace {

// run.config: what the run was started with.
Config recorded_config(const JsonValue& j) {
  if (!j.is_object()) j.fail("is {}, not an object", j.brief());
  Config c;
  c.name = j.at("name").string();
  c.vocab = j.at("vocab").integer(1, nax::io::kMaxTokenIds);
  c.d_model = j.at("d_model").integer(1, 1 << 16);
  c.n_layers = j.at("n_layers").integer(1, 1024);
  c.n_heads = j.at("n_heads").integer(1, c.d_model);
  c.d_ff = j.at("d_ff").integer(1, 1 << 20);
  c.rotary_dims = j.at("rotary_dims").integer(0, c.d_model);
  c.max_seq = j.at("max_seq").integer(1, 1 << 20);
  c.layer_norm_eps = j.at("layer_norm_eps").number(0, 1);
  return c;
}

TrainerState trainer_state(const JsonValue& j) {
  if (!j.is_object()) j.fail("is {}, not a JSON object", j.brief());
  TrainerState t;
  t.path = j.file();
  t.step = j.at("step").integer(1, std::int64_t{1} << 40);
  const JsonValue adam = j.at("adam_steps");
  t.adam_steps = adam.integer(0, std::int64_t{1} << 40);
  if (t.adam_steps != t.step) adam.fail("= {} differs from 'step' = {} (one optimizer step per step)", t.adam_steps, t.step);
  const JsonValue run = j.at("run");
  if (!run.is_object()) run.fail("is {}, not an object (the run record)", run.brief());
  t.config = recorded_config(run.at("config"));
  t.run = run.raw();
  return t;
}

// config.json against the config trainer.json records for the run: one edited without the other
// is refused, naming both files and the fields.
void check_agree(const Config& file, const std::string& config_path, const TrainerState& t) {
  const Config& r = t.config;
  auto disagree = [&](const char* field, const char* recorded, const auto& got, const auto& want) {
    nax::fail("checkpoint", "'{}': field '{}' is {}, but '{}' records {} for the run (field 'run.config.{}'): the step folder's files disagree",
              config_path, field, got, t.path, want, recorded);
  };
  if (file.name != r.name) disagree("nax_config", "name", file.name, r.name);
  if (file.vocab < r.vocab) disagree("vocab_size", "vocab", file.vocab, r.vocab);  // padded for the mesh: at least
  if (file.d_model != r.d_model) disagree("n_embd", "d_model", file.d_model, r.d_model);
  if (file.n_layers != r.n_layers) disagree("n_layer", "n_layers", file.n_layers, r.n_layers);
  if (file.n_heads != r.n_heads) disagree("n_head", "n_heads", file.n_heads, r.n_heads);
  if (file.d_ff != r.d_ff) disagree("n_inner", "d_ff", file.d_ff, r.d_ff);
  if (file.rotary_dims != r.rotary_dims) disagree("rotary_dim", "rotary_dims", file.rotary_dims, r.rotary_dims);
  if (file.max_seq != r.max_seq) disagree("n_positions", "max_seq", file.max_seq, r.max_seq);
  if (file.layer_norm_eps != r.layer_norm_eps) disagree("layer_norm_epsilon", "layer_norm_eps", file.layer_norm_eps, r.layer_norm_eps);
}

}  // namespace

TrainerState trainer_state_from_json(const std::string& text, const std::string& path) {
  return trainer_state(nax::io::parse_json(text, path, nax::io::kTrainerStateCaps, "checkpoint"));
}

TrainerState trainer_state_from_file(const std::string& path) {
  return trainer_state(nax::io::read_json(path, nax::io::kTrainerStateCaps, "checkpoint"));
}

std::string trainer_json(std::int64_t step, std::int64_t adam_steps, const nlohmann::json& run) {
  const nlohmann::json j = {{"step", step}, {"adam_steps", adam_steps}, {"tokenizer", "bytes"}, {"run", run}};
  return j.dump(2) + "\n";
}

bool is_step_folder(const std::string& dir) {
  std::error_code ec;
  return ckpt::looks_like_step_folder(dir) || std::filesystem::exists(dir + "/trainer.json", ec) ||
         std::filesystem::exists(dir + "/optimizer.safetensors", ec);
}

StepFiles open_step(const std::string& folder, ckpt::NonFinitePolicy nonfinite) {
  ckpt::verify_step_folder(folder);
  const std::string config_path = folder + "/config.json";
  const Config config = config_from_file(config_path);
  TrainerState trainer = trainer_state_from_file(folder + "/trainer.json");
  const std::int64_t named = ckpt::step_of_name(std::filesystem::path(folder).filename().string());
  if (named >= 0 && trainer.step != named)
    nax::fail("checkpoint", "'{}': field 'step' is {}, the folder's name says {}", trainer.path, trainer.step, named);
  check_agree(config, config_path, trainer);
  // verify_step_folder has read every byte against the manifest's checksums.
  StepFiles step{folder, config, std::move(trainer), ckpt::SafetensorsFolder(folder, ckpt::ChecksumPolicy::verified, nonfinite)};
  const auto reads = model_reads(parameter_specs(config));
  expect_exactly(step.weights.file_of(reads.front().name), reads);
  return step;
}

}  // namespace gptj
