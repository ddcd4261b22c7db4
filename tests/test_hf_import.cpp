// Hugging Face GPT-J folders nax did not write (tests/fixtures/hf_gptj/, made by
// scripts/make_hf_fixtures.py with transformers): logits against transformers' on several meshes,
// the refusals, export in another layout and dtype, and fine-tuning (docs/hf-import.md).
#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nax/nax.h>
#include <nax/nax.h>
#include <nax/text/bpe_tokenizer.h>
#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "comparison.h"
#include "files.h"
#include "hf_export.h"
#include "model.h"
#include "train.h"

using namespace nax;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

const std::string kFixture = NAX_HF_FIXTURES;
const std::string kTokenizer = NAX_TOKENIZER_FIXTURES "/tokenizer.json";

std::string scratch(const std::string& name) { return testing::scratch_dir("hf_" + name); }

// A copy of the fixture folder to damage.
std::string fixture_copy(const std::string& name) {
  const std::string dir = scratch(name);
  fs::copy(kFixture, dir);
  return dir;
}

// The model's logits for `ids` on `mesh`, [tokens x vocab] flattened.
std::vector<double> logits_on(const gptj::ModelFiles& files, const std::string& mesh_spec, const std::vector<std::int32_t>& ids) {
  const Mesh mesh = Mesh::parse(mesh_spec);
  AxisRules rules = gptj::axis_rules(mesh);
  rules.set("batch", {});
  const auto specs = gptj::parameter_specs(files.config);
  Runtime rt = Runtime::local(mesh);
  return rt.run([&](Shard& s) {
    NoGrad no_grad;
    const gptj::Model model(files.config,
                            nn::Parameters::from_values(specs, checkpoint::load_sharded(s, files.weights, gptj::model_reads(specs), rules, DType::f32)));
    const Tensor x = s.shard(from_vector(Shape{{"batch", 1}, {"seq", static_cast<std::int64_t>(ids.size())}}, ids), rules);
    return s.gather(all_gather_invariant(model.logits(x), "mp", "vocab")).to_vector<double>();
  })[0];
}

std::vector<double> scaled(const std::vector<double>& v, double by) {
  std::vector<double> out;
  for (double x : v) out.push_back(x / by);
  return out;
}

}  // namespace

TEST_CASE("A Hugging Face GPT-J folder (F16, two shards) gives transformers' logits on meshes 1x1, 1x2, 1x4", "[hf]") {
  const auto start = std::chrono::steady_clock::now();
  const gptj::ModelFiles files = gptj::open_model(kFixture);
  const double open_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const gptj::Config& c = files.config;
  REQUIRE((c.vocab == 1024 && c.d_model == 32 && c.n_heads == 4 && c.head_dim == 8 && c.rotary_dims == 6 && c.d_ff == 96 &&
           c.n_layers == 2 && c.max_seq == 64 && c.layer_norm_eps == 1e-4 && c.eos_token_id == 0));
  REQUIRE(files.weights.files().size() == 2);
  REQUIRE(files.weights.find("lm_head.weight")->f16);

  const checkpoint::SafetensorsReader reference(kFixture + "/logits.safetensors", checkpoint::ChecksumPolicy::if_present);
  const auto prompts = nlohmann::json::parse(testing::file_bytes(kFixture + "/prompts.json"));
  const auto tokenizer = text::BpeTokenizer::from_file(kTokenizer);
  for (std::size_t k = 0; k < prompts.size(); ++k) {
    const auto ids = reference.read(fmt::format("ids.{}", k)).to_vector<std::int32_t>();
    REQUIRE(tokenizer.encode(prompts[k].get<std::string>()) == ids);  // nax's tokenizer agrees with `tokenizers` here too
    const auto want = reference.read(fmt::format("logits.{}", k)).to_vector<double>();
    REQUIRE(want.size() == ids.size() * 1024);
    double largest = 0;
    for (double x : want) largest = std::max(largest, std::abs(x));
    for (const std::string mesh : {"dp=1,mp=1", "dp=1,mp=2", "dp=1,mp=4"}) {
      const auto got = logits_on(files, mesh, ids);
      // Within 1e-3 of the largest logit, element by element (a NaN fails).
      const double error = testing::max_rel_error(scaled(got, largest), scaled(want, largest));
      fmt::print("hf import: prompt {} ({} tokens) on {}: max |nax - transformers| = {:.2e} of the largest logit {:.3f}\n", k, ids.size(),
                 mesh, error, largest);
      testing::require_close(scaled(got, largest), scaled(want, largest), 1e-3);
    }
  }
  fmt::print("hf import: opening and validating the fixture folder took {:.1f} ms\n", open_s * 1e3);
}

TEST_CASE("Hugging Face folders: pickles, broken indexes, missing, extra and ill-shaped tensors refused by name", "[hf][errors]") {
  {
    const std::string dir = scratch("pickle");
    fs::create_directories(dir);
    testing::replace_file(dir + "/config.json", testing::file_bytes(kFixture + "/config.json"));
    testing::replace_file(dir + "/pytorch_model.bin", "PK not read");
    REQUIRE_THROWS_WITH(gptj::open_model(dir), Contains("pytorch_model.bin") && Contains("save_pretrained(OUT_DIR, safe_serialization=True)"));
    fs::remove_all(dir);
  }
  const std::string index_name = "/model.safetensors.index.json";
  const auto index = nlohmann::json::parse(testing::file_bytes(kFixture + index_name));
  const std::string first = "model-00001-of-00002.safetensors", second = "model-00002-of-00002.safetensors";
  auto with_index = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    const std::string dir = fixture_copy(name);
    auto j = index;
    edit(j);
    testing::replace_file(dir + index_name, j.dump());
    return dir;
  };
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> broken{
      {[](auto& j) { j["weight_map"].erase("lm_head.bias"); }, "holds tensor 'lm_head.bias', which"},
      {[&](auto& j) { j["weight_map"]["lm_head.bias"] = first; }, "maps tensor 'lm_head.bias' to"},
      {[&](auto& j) { j["weight_map"]["lm_head.bias"] = "../" + second; }, "not a .safetensors file in the folder"},
      {[](auto& j) { j["weight_map"]["lm_head.bias"] = 3; }, "field 'weight_map[\"lm_head.bias\"]' is 3, not a string"},
      {[](auto& j) { j.erase("weight_map"); }, "field 'weight_map' is missing"},
      {[](auto& j) { j["weight_map"]["lm_head.bias"] = "model-00003-of-00002.safetensors"; }, "cannot read"},
  };
  for (std::size_t i = 0; i < broken.size(); ++i) {
    INFO(broken[i].second);
    const std::string dir = with_index(fmt::format("index{}", i), broken[i].first);
    REQUIRE_THROWS_WITH(gptj::open_model(dir), Contains(broken[i].second) && Contains(dir));
    fs::remove_all(dir);
  }
  {  // both layouts at once
    const std::string dir = fixture_copy("both");
    fs::copy_file(dir + "/" + first, dir + "/model.safetensors");
    REQUIRE_THROWS_WITH(gptj::open_model(dir), Contains("two sets of weights"));
    fs::remove_all(dir);
  }
  {  // a shard that lost its last bytes
    const std::string dir = fixture_copy("truncated");
    const std::string bytes = testing::file_bytes(dir + "/" + second);
    testing::replace_file(dir + "/" + second, bytes.substr(0, bytes.size() - 2));
    REQUIRE_THROWS_WITH(gptj::open_model(dir), Contains(second));
    fs::remove_all(dir);
  }
  // One file with a tensor missing, one too many, one ill-shaped.
  const checkpoint::SafetensorsFolder weights(kFixture, checkpoint::ChecksumPolicy::if_present);
  auto single_file = [&](const std::string& name, const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
    const std::string dir = scratch(name);
    fs::create_directories(dir);
    fs::copy_file(kFixture + "/config.json", dir + "/config.json");
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& t : weights.tensors()) tensors.push_back({t.name, weights.file_of(t.name).read(t.name)});
    edit(tensors);
    checkpoint::save_safetensors(dir + "/model.safetensors", tensors);
    return dir;
  };
  const std::vector<std::pair<std::function<void(std::vector<std::pair<std::string, Tensor>>&)>, std::string>> wrong{
      {[](auto& ts) { std::erase_if(ts, [](const auto& t) { return t.first == "transformer.h.1.mlp.fc_in.weight"; }); },
       "has no tensor 'transformer.h.1.mlp.fc_in.weight'"},
      {[](auto& ts) { ts.push_back({"transformer.h.0.attn.extra", zeros(Shape{{"d0", 2}})}); }, "holds tensor 'transformer.h.0.attn.extra'"},
      {[](auto& ts) {
         for (auto& [name, t] : ts)
           if (name == "transformer.ln_f.bias") t = zeros(Shape{{"d0", 31}});
       },
       "tensor 'transformer.ln_f.bias' has shape [31], expected [32]"},
      {[](auto& ts) {
         for (auto& [name, t] : ts)
           if (name == "lm_head.bias") t = zeros(Shape{{"d0", 1024}}, DType::i32);
       },
       "tensor 'lm_head.bias' is I32, not a floating type"},
  };
  for (std::size_t i = 0; i < wrong.size(); ++i) {
    INFO(wrong[i].second);
    const std::string dir = single_file(fmt::format("tensors{}", i), wrong[i].first);
    REQUIRE_THROWS_WITH(gptj::open_model(dir), Contains(wrong[i].second) && Contains(dir));
    fs::remove_all(dir);
  }
  // The older transformers' attention mask buffers are no model tensors, and are passed over.
  const std::string buffers = single_file("buffers", [](auto& ts) { ts.push_back({"transformer.h.0.attn.masked_bias", zeros(Shape{{"d0", 1}})}); });
  REQUIRE_NOTHROW(gptj::open_model(buffers));
  fs::remove_all(buffers);
}

TEST_CASE("config.json of Hugging Face's GPTJConfig: every field honoured or refused by name", "[hf][errors]") {
  const auto good = nlohmann::json::parse(testing::file_bytes(kFixture + "/config.json"));
  REQUIRE(gptj::config_from_json(good.dump(), "c.json").vocab == 1024);
  auto with = [&](const std::string& field, const std::string& value) {
    auto j = good;
    j[field] = nlohmann::json::parse(value);
    return j.dump();
  };
  const std::vector<std::tuple<std::string, std::string, std::string>> cases{
      {"attn_pdrop", "0.1", "field 'attn_pdrop' is 0.1: nax's GPT-J has no dropout"},
      {"resid_pdrop", "\"x\"", "field 'resid_pdrop'"},
      {"rotary", "false", "field 'rotary' is false"},
      {"scale_attn_weights", "false", "field 'scale_attn_weights' is false"},
      {"n_ctx", "128", "field 'n_ctx' is 128, differing from n_positions = 64"},
      {"eos_token_id", "1024", "field 'eos_token_id' is 1024, outside [0, 1023]"},
      {"bos_token_id", "-1", "field 'bos_token_id' is -1"},
      {"rope_scaling", "{}", "field 'rope_scaling' is not one nax's GPT-J knows"},
      {"activation_function", "\"gelu\"", "supports \"gelu_new\" only"},
      {"tie_word_embeddings", "true", "untied lm_head"},
  };
  for (const auto& [field, value, expected] : cases) {
    INFO(field << " = " << value);
    REQUIRE_THROWS_WITH(gptj::config_from_json(with(field, value), "c.json"), Contains(expected) && Contains("c.json"));
  }
  const auto eos = gptj::config_from_json(with("eos_token_id", "7"), "c.json");
  REQUIRE(eos.eos_token_id == 7);
  REQUIRE(gptj::config_from_json(gptj::hf_config_json(eos), "c.json").eos_token_id == 7);  // written back
}

TEST_CASE("F16 is stored and read as IEEE half, rounded to nearest even", "[hf]") {
  const std::string dir = scratch("half");
  fs::create_directories(dir);
  const std::string path = dir + "/h.safetensors";
  // value, its half's bits (IEEE 754 binary16), the value read back
  const std::vector<std::tuple<float, std::uint16_t, float>> cases{
      {1.0f, 0x3c00, 1.0f},          {-2.0f, 0xc000, -2.0f},         {0.0f, 0x0000, 0.0f},
      {-0.0f, 0x8000, -0.0f},        {65504.0f, 0x7bff, 65504.0f},   {65519.0f, 0x7bff, 65504.0f},
      {65520.0f, 0x7c00, INFINITY},  {1e9f, 0x7c00, INFINITY},       {std::ldexp(1.0f, -24), 0x0001, std::ldexp(1.0f, -24)},
      {std::ldexp(1.0f, -14), 0x0400, std::ldexp(1.0f, -14)},        {std::ldexp(1.0f, -26), 0x0000, 0.0f},
      {std::ldexp(3.0f, -26), 0x0001, std::ldexp(1.0f, -24)},        {1.0f + std::ldexp(1.0f, -11), 0x3c00, 1.0f},
      {1.0f + std::ldexp(3.0f, -11), 0x3c02, 1.0f + std::ldexp(1.0f, -9)}, {0.1f, 0x2e66, 0.0999755859375f},
  };
  std::vector<float> values;
  for (const auto& c : cases) values.push_back(std::get<0>(c));
  values.push_back(NAN);
  const auto n = static_cast<std::int64_t>(values.size());
  checkpoint::TensorInfo info{"h", DType::f32, {n}};
  info.f16 = true;
  {
    checkpoint::SafetensorsWriter writer(path, {info});
    writer.write(from_vector(Shape{{"d0", n}}, values));
    writer.commit();
  }
  const checkpoint::SafetensorsReader file(path);
  REQUIRE(checkpoint::safetensors_dtype(*file.find("h")) == "F16");
  const std::string bytes = testing::file_bytes(path);
  const std::size_t data = bytes.size() - static_cast<std::size_t>(n) * 2;
  const auto back = file.read("h").to_vector<float>();
  for (std::size_t i = 0; i < cases.size(); ++i) {
    std::uint16_t bits = 0;
    std::memcpy(&bits, bytes.data() + data + 2 * i, 2);
    INFO("value " << std::get<0>(cases[i]));
    REQUIRE(bits == std::get<1>(cases[i]));
    REQUIRE(back[i] == std::get<2>(cases[i]));
    REQUIRE(std::signbit(back[i]) == std::signbit(std::get<2>(cases[i])));
  }
  REQUIRE(std::isnan(back.back()));
  fs::remove_all(dir);
}

TEST_CASE("gptj convert writes the Hugging Face layout: sharded above a size with the index, in the chosen dtype", "[hf]") {
  const checkpoint::SafetensorsFolder source(kFixture, checkpoint::ChecksumPolicy::if_present);
  for (const std::string dtype : {"f16", "bf16", "f32"}) {
    INFO(dtype);
    const std::string out = scratch("convert_" + dtype);
    const auto files = gptj::convert({.from = kFixture, .out = out, .dtype = dtype, .max_file_bytes = dtype == "f32" ? 10'000'000u : 50'000u});
    const gptj::ModelFiles back = gptj::open_model(out);
    REQUIRE(back.config.rotary_dims == 6);
    if (dtype == "f32") {
      REQUIRE(files == std::vector<std::string>{"model.safetensors", "config.json"});
    } else {
      REQUIRE(back.weights.files().size() == 4);  // 175 kB in files of at most 50 kB, the 64 kB embeddings alone
      REQUIRE(fs::exists(out + "/model.safetensors.index.json"));
    }
    for (const auto& t : source.tensors()) {
      const checkpoint::TensorInfo& info = *back.weights.find(t.name);
      REQUIRE(checkpoint::safetensors_dtype(info) == (dtype == "f16" ? "F16" : dtype == "bf16" ? "BF16" : "F32"));
      const Tensor want = source.file_of(t.name).read(t.name);
      const Tensor got = back.weights.file_of(t.name).read(t.name, want.shape());
      // F16 weights through f32 and back are exact; to bf16 they round as cast() rounds.
      const Tensor expected = dtype == "bf16" ? cast(want, DType::bf16) : want;
      REQUIRE(cast(got, DType::f64).to_vector<double>() == cast(expected, DType::f64).to_vector<double>());
    }
    REQUIRE_THROWS_WITH(gptj::convert({.from = kFixture, .out = out}), Contains("is not an empty folder"));
    fs::remove_all(out);
  }
  REQUIRE_THROWS_WITH(gptj::convert({.from = kFixture, .out = scratch("x"), .dtype = "f8"}), Contains("--dtype is 'f8'"));
}

TEST_CASE("Fine-tuning the Hugging Face fixture for a few steps lowers the held-out loss", "[hf]") {
  const std::string dir = scratch("finetune");
  fs::create_directories(dir);
  std::string text;
  for (int i = 0; i < 120; ++i) text += fmt::format("The quick brown fox jumps over the lazy dog, {} times. It's {} o'clock.\n", i % 9, i % 12);
  testing::replace_file(dir + "/data.txt", text);
  gptj::TrainOptions o;
  o.init_from = kFixture, o.tokenizer = kTokenizer, o.data = {dir + "/data.txt"}, o.token_cache = dir;
  o.mesh = "dp=2,mp=2", o.steps = 12, o.batch = 4, o.seq = 32, o.lr = 3e-3, o.warmup = 2, o.eval_every = 0, o.eval_batches = 2, o.quiet = true;
  o.ckpt_dir = dir + "/run";
  const auto result = gptj::train(o, gptj::TextData::load_tokenized(o.data, o.tokenizer, o.token_cache, true));
  fmt::print("hf fine-tune: held-out loss {:.4f} before, {:.4f} after {} steps on {}\n", result.initial_heldout_loss, result.heldout_loss, o.steps,
             o.mesh);
  REQUIRE(std::isfinite(result.initial_heldout_loss));
  REQUIRE(result.heldout_loss < result.initial_heldout_loss - 0.5);
  // The checkpoint is a model folder of the same config, for sample, logits and convert.
  const gptj::ModelFiles saved = gptj::open_model(o.ckpt_dir);
  REQUIRE((saved.config.d_model == 32 && saved.config.rotary_dims == 6 && saved.config.vocab == 1024 && saved.config.layer_norm_eps == 1e-4));
  fs::remove_all(dir);
}

TEST_CASE("Sampling a Hugging Face folder: top-p, stop at end-of-text, a batch of prompts, never a padding row", "[hf]") {
  gptj::SampleOptions o;
  o.ckpt_dir = kFixture, o.tokenizer = kTokenizer, o.tokens = 8, o.temperature = 0;
  o.prompts = {"The quick brown fox", "It's"};
  const auto greedy = gptj::sample_batch(o);
  REQUIRE(greedy.size() == 2);
  for (std::size_t k = 0; k < 2; ++k) {  // a batch gives each prompt's own continuation
    gptj::SampleOptions one = o;
    one.prompts.clear(), one.prompt = o.prompts[k];
    REQUIRE(gptj::sample(one) == greedy[k]);
  }
  // Top-p that keeps only the most likely token is greedy, whatever the temperature.
  gptj::SampleOptions nucleus = o;
  nucleus.temperature = 1.5, nucleus.top_k = 0, nucleus.top_p = 1e-9, nucleus.seed = 5;
  REQUIRE(gptj::sample_batch(nucleus) == greedy);
  nucleus.top_p = 1;  // while the whole distribution draws something else
  REQUIRE(gptj::sample_batch(nucleus) != greedy);
  for (double bad : {0.0, -0.5, 1.01, static_cast<double>(NAN)}) {
    nucleus.top_p = bad;
    REQUIRE_THROWS_WITH(gptj::sample_batch(nucleus), Contains("--top-p must be a number in (0, 1]"));
  }

  // End-of-text: with eos_token_id set to the greedy first token, the continuation is empty.
  gptj::SampleOptions first = o;
  first.prompts.clear(), first.prompt = o.prompts[0];
  const auto rows = gptj::prompt_logits(first);
  const auto& last = rows.back();
  const auto best = std::max_element(last.begin(), last.begin() + 1001) - last.begin();
  const std::string eos_dir = fixture_copy("eos");
  auto config = nlohmann::json::parse(testing::file_bytes(eos_dir + "/config.json"));
  config["eos_token_id"] = best;
  testing::replace_file(eos_dir + "/config.json", config.dump());
  first.ckpt_dir = eos_dir;
  REQUIRE(gptj::sample(first).empty());
  first.stop_at_eos = false;
  REQUIRE(gptj::sample(first) == greedy[0]);
  fs::remove_all(eos_dir);

  // Rows past the tokenizer's 1001 ids are padding: made the most likely, they are still never drawn.
  const std::string padded = scratch("padding");
  fs::create_directories(padded);
  fs::copy_file(kFixture + "/config.json", padded + "/config.json");
  const checkpoint::SafetensorsFolder weights(kFixture, checkpoint::ChecksumPolicy::if_present);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& t : weights.tensors()) {
    Tensor value = weights.file_of(t.name).read(t.name);
    if (t.name == "lm_head.bias") {
      auto bias = value.to_vector<float>();
      for (std::size_t i = 1001; i < bias.size(); ++i) bias[i] = 100;
      value = from_vector(value.shape(), bias);
    }
    tensors.push_back({t.name, value});
  }
  checkpoint::save_safetensors(padded + "/model.safetensors", tensors);
  gptj::SampleOptions pad = o;
  pad.ckpt_dir = padded;
  REQUIRE(gptj::sample_batch(pad) == greedy);
  fs::remove_all(padded);
}
