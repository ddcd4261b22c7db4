#include "checkpoint.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <filesystem>

#include "model.h"

namespace gptj {

using nlohmann::json;
namespace ckpt = nax::checkpoint;

namespace {

// Field `key` of `j` as an integer in [lo, hi], or an error naming the file and the field.
std::int64_t int_field(const json& j, const char* key, std::int64_t lo, std::int64_t hi, const std::string& path) {
  if (!j.contains(key)) nax::fail("checkpoint", "'{}' has no field '{}'", path, key);
  const json& v = j[key];
  if (!v.is_number_integer()) nax::fail("checkpoint", "'{}': field '{}' is {}, not an integer", path, key, v.dump());
  if (v.is_number_unsigned() ? v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi) : (v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi))
    nax::fail("checkpoint", "'{}': field '{}' is {}, outside [{}, {}]", path, key, v.dump(), lo, hi);
  const auto x = v.get<std::int64_t>();
  if (x < lo) nax::fail("checkpoint", "'{}': field '{}' is {}, outside [{}, {}]", path, key, v.dump(), lo, hi);
  return x;
}

bool absent(const json& j, const char* key) { return !j.contains(key) || j[key].is_null(); }

}  // namespace

std::vector<std::int64_t> hf_dims(const nax::Shape& s) {
  std::vector<std::int64_t> dims;
  for (int i = 0; i < s.rank(); ++i) {
    if (s[i].name == "head_dim" && i > 0 && s[i - 1].name == "heads") dims.back() *= s[i].size;
    else dims.push_back(s[i].size);
  }
  return dims;
}

nax::Tensor to_hf_layout(const nax::Tensor& t) {
  std::vector<nax::Axis> axes;
  for (auto d : hf_dims(t.shape())) axes.push_back({fmt::format("d{}", axes.size()), d});
  return t.with_shape(nax::Shape(axes));
}

std::string hf_config_json(const Config& c) {
  json j = {{"architectures", {"GPTJForCausalLM"}},
            {"model_type", "gptj"},
            {"vocab_size", c.vocab},
            {"n_positions", c.max_seq},
            {"n_embd", c.d_model},
            {"n_layer", c.n_layers},
            {"n_head", c.n_heads},
            {"n_inner", c.d_ff},
            {"rotary_dim", c.rotary_dims},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", c.layer_norm_eps},
            {"tie_word_embeddings", false},
            {"bos_token_id", c.bos_token_id},
            {"eos_token_id", c.eos_token_id},
            {"torch_dtype", "float32"},
            {"nax_config", c.name}};
  return j.dump(2) + "\n";
}

namespace {

// Fields of Hugging Face's GPTJConfig that do not change what the model computes (training
// hyperparameters of other tools, generation and output switches, the files' bookkeeping).
bool inert_field(const std::string& key) {
  static const std::set<std::string> inert{"_name_or_path", "architectures", "initializer_range", "use_cache", "torch_dtype", "dtype",
                                           "transformers_version", "gradient_checkpointing", "tokenizer_class", "task_specific_params",
                                           "pad_token_id", "id2label", "label2id", "problem_type", "output_attentions",
                                           "output_hidden_states", "return_dict", "is_encoder_decoder", "chunk_size_feed_forward",
                                           "nax_config", "model_type"};
  return inert.contains(key) || key.starts_with("summary_");
}

// The fields whose values nax honours (read below) or checks against the only value it computes.
const std::set<std::string>& honoured_fields() {
  static const std::set<std::string> honoured{"vocab_size", "n_positions", "n_ctx", "n_embd", "n_layer", "n_head", "n_inner",
                                              "rotary_dim", "activation_function", "layer_norm_epsilon", "tie_word_embeddings",
                                              "bos_token_id", "eos_token_id", "attn_pdrop", "embd_pdrop", "resid_pdrop", "rotary",
                                              "scale_attn_weights"};
  return honoured;
}

}  // namespace

Config config_from_json(const std::string& text, const std::string& path) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) nax::fail("checkpoint", "'{}' is not a JSON object", path);
  for (const auto& [key, value] : j.items())
    if (!inert_field(key) && !honoured_fields().contains(key))
      nax::fail("checkpoint", "'{}': field '{}' is not one nax's GPT-J knows (docs/hf-import.md lists them): refused rather than ignored", path, key);
  if (!absent(j, "model_type") && j["model_type"] != "gptj")
    nax::fail("checkpoint", "'{}': field 'model_type' is {}, not \"gptj\"", path, j["model_type"].dump());
  if (!absent(j, "activation_function") && j["activation_function"] != "gelu_new")
    nax::fail("checkpoint", "'{}': field 'activation_function' is {}: nax's GPT-J supports \"gelu_new\" only", path,
              j["activation_function"].dump());
  if (!absent(j, "tie_word_embeddings") && j["tie_word_embeddings"] != false)
    nax::fail("checkpoint", "'{}': field 'tie_word_embeddings' is {}: nax's GPT-J has an untied lm_head", path, j["tie_word_embeddings"].dump());
  for (const char* dropout : {"attn_pdrop", "embd_pdrop", "resid_pdrop"})
    if (!absent(j, dropout) && (!j[dropout].is_number() || j[dropout].get<double>() != 0.0))
      nax::fail("checkpoint", "'{}': field '{}' is {}: nax's GPT-J has no dropout (0 only)", path, dropout, j[dropout].dump());
  for (const char* flag : {"rotary", "scale_attn_weights"})
    if (!absent(j, flag) && j[flag] != true)
      nax::fail("checkpoint", "'{}': field '{}' is {}: nax's GPT-J computes it as true only", path, flag, j[flag].dump());
  Config c;
  c.name = j.contains("nax_config") && j["nax_config"].is_string() ? j["nax_config"].get<std::string>() : "custom";
  c.vocab = int_field(j, "vocab_size", 1, 1 << 24, path);
  c.max_seq = int_field(j, "n_positions", 1, 1 << 20, path);
  if (!absent(j, "n_ctx") && int_field(j, "n_ctx", 1, 1 << 20, path) != c.max_seq)
    nax::fail("checkpoint", "'{}': field 'n_ctx' is {}, differing from n_positions = {}", path, j["n_ctx"].dump(), c.max_seq);
  c.d_model = int_field(j, "n_embd", 1, 1 << 16, path);
  c.n_layers = int_field(j, "n_layer", 1, 1024, path);
  c.n_heads = int_field(j, "n_head", 1, c.d_model, path);
  if (c.d_model % c.n_heads != 0)
    nax::fail("checkpoint", "'{}': field 'n_head' = {} does not divide n_embd = {}", path, c.n_heads, c.d_model);
  c.head_dim = c.d_model / c.n_heads;
  c.d_ff = absent(j, "n_inner") ? 4 * c.d_model : int_field(j, "n_inner", 1, 1 << 20, path);
  c.rotary_dims = absent(j, "rotary_dim") ? c.head_dim : int_field(j, "rotary_dim", 2, c.head_dim, path);
  if (c.rotary_dims % 2 != 0) nax::fail("checkpoint", "'{}': field 'rotary_dim' = {} is odd (rotary pairs dimensions)", path, c.rotary_dims);
  if (!absent(j, "layer_norm_epsilon")) {
    const json& eps = j["layer_norm_epsilon"];
    if (!eps.is_number() || !std::isfinite(eps.get<double>()) || eps.get<double>() <= 0 || eps.get<double>() > 1)
      nax::fail("checkpoint", "'{}': field 'layer_norm_epsilon' is {}, not a number in (0, 1]", path, eps.dump());
    c.layer_norm_eps = eps.get<double>();
  }
  c.bos_token_id = absent(j, "bos_token_id") ? 0 : int_field(j, "bos_token_id", 0, c.vocab - 1, path);
  c.eos_token_id = absent(j, "eos_token_id") ? 0 : int_field(j, "eos_token_id", 0, c.vocab - 1, path);
  // A nax config by name: its dimensions are known, so a config.json edited apart from its
  // weights (the heads or rotary dims, which the tensors' shapes cannot show) is caught.
  const auto names = config_names();
  if (std::find(names.begin(), names.end(), c.name) != names.end()) {
    const Config known = config_by_name(c.name);
    auto check = [&](const char* field, std::int64_t got, std::int64_t want) {
      if (got != want) nax::fail("checkpoint", "'{}': field '{}' is {}, config '{}' has {}", path, field, got, c.name, want);
    };
    check("n_embd", c.d_model, known.d_model);
    check("n_layer", c.n_layers, known.n_layers);
    check("n_head", c.n_heads, known.n_heads);
    check("n_inner", c.d_ff, known.d_ff);
    check("rotary_dim", c.rotary_dims, known.rotary_dims);
    check("n_positions", c.max_seq, known.max_seq);
    if (c.vocab < known.vocab || (known.vocab != 256 && c.vocab != known.vocab))
      nax::fail("checkpoint", "'{}': field 'vocab_size' is {}, config '{}' has {}", path, c.vocab, c.name, known.vocab);
  }
  return c;
}

NamedTensors gather_hf_parameters(nax::Shard& s, const nax::nn::Parameters& params) {
  NamedTensors out;
  const auto& specs = params.specs();
  for (std::size_t i = 0; i < specs.size(); ++i) out.push_back({specs[i].name, to_hf_layout(s.gather(nax::stop_gradient(params[i])))});
  return out;
}

std::vector<ckpt::ShardedRead> model_reads(const std::vector<nax::nn::ParamSpec>& specs) {
  std::vector<ckpt::ShardedRead> reads;
  for (const auto& spec : specs) reads.push_back({spec.name, spec.global, hf_dims(spec.global)});
  return reads;
}

std::vector<ckpt::ShardedRead> optimizer_reads(const std::vector<nax::nn::ParamSpec>& specs) {
  std::vector<ckpt::ShardedRead> reads;
  for (const char* kind : {"m", "v"})
    for (const auto& spec : specs) reads.push_back({fmt::format("{}.{}", kind, spec.name), spec.global, hf_dims(spec.global)});
  return reads;
}

std::string model_folder(const std::string& dir) {
  namespace fs = std::filesystem;
  if (dir.empty()) nax::fail("checkpoint", "no checkpoint folder given");
  std::error_code ec;
  if (!fs::exists(dir, ec)) nax::fail("checkpoint", "cannot read '{}/config.json': '{}' does not exist", dir, dir);
  if (!fs::is_directory(dir, ec)) nax::fail("checkpoint", "'{}' is not a folder (give a run folder or a step folder)", dir);
  std::string folder = dir;
  if (!fs::exists(dir + "/config.json", ec)) {
    const auto steps = ckpt::committed_steps(dir);
    if (steps.empty()) nax::fail("checkpoint", "cannot read '{}/config.json', and '{}' holds no committed step_NNNNNN/ folder", dir, dir);
    folder = ckpt::step_folder(dir, steps.back());
  }
  if (fs::exists(folder + "/manifest.json", ec)) ckpt::verify_step_folder(folder);
  return folder;
}

void expect_exactly(const ckpt::SafetensorsReader& file, const std::vector<ckpt::ShardedRead>& reads) {
  ckpt::expect_tensors(file, reads, nax::DType::f32);
  if (file.tensors().size() != reads.size()) {
    std::set<std::string> names;
    for (const auto& r : reads) names.insert(r.name);
    for (const auto& t : file.tensors())
      if (!names.contains(t.name)) nax::fail("checkpoint", "'{}' holds tensor '{}', which the model does not have", file.path(), t.name);
  }
}

void expect_model_tensors(const ckpt::SafetensorsFolder& weights, const std::vector<ckpt::ShardedRead>& reads) {
  ckpt::expect_tensors(weights, reads);
  std::set<std::string> names;
  for (const auto& r : reads) names.insert(r.name);
  for (const auto& t : weights.tensors()) {
    // Older transformers saved the attention's causal mask and masking value as buffers.
    const bool mask_buffer = t.name.starts_with("transformer.h.") && (t.name.ends_with(".attn.bias") || t.name.ends_with(".attn.masked_bias"));
    if (!names.contains(t.name) && !mask_buffer)
      nax::fail("checkpoint", "'{}' holds tensor '{}', which the model does not have", weights.file_of(t.name).path(), t.name);
  }
}

ModelFiles open_model(const std::string& dir) {
  const std::string folder = model_folder(dir);
  const std::string config_path = folder + "/config.json";
  Config config = config_from_json(read_file(config_path), config_path);
  // nax's step folders carry checksums; a Hugging Face folder's files are checked without one.
  const bool nax_step = std::filesystem::exists(folder + "/manifest.json");
  ModelFiles m{folder, config, ckpt::SafetensorsFolder(folder, nax_step ? ckpt::ChecksumPolicy::required : ckpt::ChecksumPolicy::if_present)};
  expect_model_tensors(m.weights, model_reads(parameter_specs(config)));
  return m;
}

TrainerState trainer_state_from_json(const std::string& text, const std::string& path) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) nax::fail("checkpoint", "'{}' is not a JSON object", path);
  TrainerState t;
  t.step = int_field(j, "step", 1, std::int64_t{1} << 40, path);
  t.adam_steps = int_field(j, "adam_steps", 0, std::int64_t{1} << 40, path);
  if (t.adam_steps != t.step)
    nax::fail("checkpoint", "'{}': field 'adam_steps' = {} differs from 'step' = {} (one optimizer step per step)", path, t.adam_steps, t.step);
  if (!j.contains("run") || !j["run"].is_object()) nax::fail("checkpoint", "'{}' has no object 'run' (the run record)", path);
  t.run = j["run"];
  return t;
}

std::string trainer_json(std::int64_t step, std::int64_t adam_steps, const json& run) {
  const json j = {{"step", step}, {"adam_steps", adam_steps}, {"tokenizer", "bytes"}, {"run", run}};
  return j.dump(2) + "\n";
}

}  // namespace gptj
