#include "checkpoint.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <filesystem>

#include "model.h"
#include "step_files.h"

namespace gptj {

using nlohmann::json;
namespace ckpt = nax::checkpoint;

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

std::string hf_config_json(const Config& c) { return hf_config(c).dump(2) + "\n"; }

json hf_config(const Config& c) {
  return {{"architectures", {"GPTJForCausalLM"}},
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

namespace {

// A field that must be absent, null or `want` (the only value nax's GPT-J computes with).
void require(const nax::io::JsonValue& j, const char* key, const json& want, const char* why) {
  if (const auto v = j.given(key); v && v->raw() != want) v->fail("is {}: {}", v->brief(), why);
}

// The dimensions, each type- and range-checked.
void read_dimensions(const nax::io::JsonValue& j, Config& c) {
  c.vocab = j.at("vocab_size").integer(1, nax::io::kMaxTokenIds);
  c.max_seq = j.at("n_positions").integer(1, 1 << 20);
  if (const auto ctx = j.given("n_ctx"); ctx && ctx->integer(1, 1 << 20) != c.max_seq) ctx->fail("is {}, differing from n_positions = {}", ctx->brief(), c.max_seq);
  c.d_model = j.at("n_embd").integer(1, 1 << 16);
  c.n_layers = j.at("n_layer").integer(1, 1024);
  const auto heads = j.at("n_head");
  c.n_heads = heads.integer(1, c.d_model);
  if (c.d_model % c.n_heads != 0) heads.fail("= {} does not divide n_embd = {}", c.n_heads, c.d_model);
  c.head_dim = c.d_model / c.n_heads;
  const auto inner = j.given("n_inner");
  c.d_ff = inner ? inner->integer(1, 1 << 20) : 4 * c.d_model;
  const auto rotary = j.given("rotary_dim");
  c.rotary_dims = rotary ? rotary->integer(2, c.head_dim) : c.head_dim;
  if (c.rotary_dims % 2 != 0) rotary->fail("= {} is odd (rotary pairs dimensions)", c.rotary_dims);
  if (const auto eps = j.given("layer_norm_epsilon")) {
    c.layer_norm_eps = eps->number(0, 1);
    if (c.layer_norm_eps <= 0) eps->fail("is {}, not a number in (0, 1]", eps->brief());
  }
  const auto bos = j.given("bos_token_id"), eos = j.given("eos_token_id");
  c.bos_token_id = bos ? bos->integer(0, c.vocab - 1) : 0;
  c.eos_token_id = eos ? eos->integer(0, c.vocab - 1) : 0;
}

// A nax config by name: its dimensions are known, so a config.json edited apart from its weights
// (the heads or rotary dims, which the tensors' shapes cannot show) is caught.
void check_named(const nax::io::JsonValue& j, const Config& c) {
  const auto names = config_names();
  if (std::find(names.begin(), names.end(), c.name) == names.end()) return;
  const Config known = config_by_name(c.name);
  auto check = [&](const char* field, std::int64_t got, std::int64_t want) {
    if (got == want) return;
    if (const auto v = j.given(field)) v->fail("is {}, config '{}' has {}", got, c.name, want);
    nax::fail("checkpoint", "'{}': field '{}' is absent (so {}), config '{}' has {}", j.file(), field, got, c.name, want);
  };
  check("n_embd", c.d_model, known.d_model);
  check("n_layer", c.n_layers, known.n_layers);
  check("n_head", c.n_heads, known.n_heads);
  check("n_inner", c.d_ff, known.d_ff);
  check("rotary_dim", c.rotary_dims, known.rotary_dims);
  check("n_positions", c.max_seq, known.max_seq);
  if (c.vocab < known.vocab || (known.vocab != 256 && c.vocab != known.vocab)) check("vocab_size", c.vocab, known.vocab);
}

}  // namespace

Config config_from_json(const nax::io::JsonValue& j) {
  if (!j.is_object()) j.fail("is {}, not a JSON object", j.brief());
  j.for_each_member([](const std::string& key, const nax::io::JsonValue& value) {
    if (!inert_field(key) && !honoured_fields().contains(key))
      value.fail("is not one nax's GPT-J knows (docs/hf-import.md lists them): refused rather than ignored");
  });
  require(j, "model_type", "gptj", "not \"gptj\"");
  require(j, "activation_function", "gelu_new", "nax's GPT-J supports \"gelu_new\" only");
  require(j, "tie_word_embeddings", false, "nax's GPT-J has an untied lm_head");
  for (const char* dropout : {"attn_pdrop", "embd_pdrop", "resid_pdrop"})
    if (const auto v = j.given(dropout); v && v->number(-1e300, 1e300) != 0.0) v->fail("is {}: nax's GPT-J has no dropout (0 only)", v->brief());
  for (const char* flag : {"rotary", "scale_attn_weights"}) require(j, flag, true, "nax's GPT-J computes it as true only");
  Config c;
  const auto name = j.given("nax_config");
  c.name = name ? name->string() : "custom";
  read_dimensions(j, c);
  check_named(j, c);
  return c;
}

Config config_from_json(const std::string& text, const std::string& path) {
  return config_from_json(nax::io::parse_json(text, path, nax::io::kModelConfigCaps, "checkpoint"));
}

Config config_from_file(const std::string& path) { return config_from_json(nax::io::read_json(path, nax::io::kModelConfigCaps, "checkpoint")); }

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
  if (fs::exists(dir + "/config.json", ec) || is_step_folder(dir)) return dir;
  const auto steps = ckpt::committed_steps(dir);
  if (steps.empty()) nax::fail("checkpoint", "cannot read '{}/config.json', and '{}' holds no committed step_NNNNNN/ folder", dir, dir);
  return ckpt::step_folder(dir, steps.back());
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

ModelFiles open_model(const std::string& dir, ckpt::NonFinitePolicy nonfinite) {
  const std::string folder = model_folder(dir);
  if (is_step_folder(folder)) {  // nax's own: one loader, whichever command reads it
    StepFiles step = open_step(folder, nonfinite);
    return {folder, step.config, std::move(step.weights)};
  }
  Config config = config_from_file(folder + "/config.json");
  ModelFiles m{folder, config, ckpt::SafetensorsFolder(folder, ckpt::ChecksumPolicy::if_present, nonfinite)};
  expect_model_tensors(m.weights, model_reads(parameter_specs(config)));
  return m;
}

}  // namespace gptj
