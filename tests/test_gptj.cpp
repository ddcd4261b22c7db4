// The GPT-J example end to end: mesh-independent training, exact resume, checkpoints that load on
// any mesh, learning on a synthetic task, and refused corrupt checkpoints.
#include <filesystem>
#include <fstream>

#include "checkpoint.h"
#include "files.h"
#include "gptj_helpers.h"
#include "helpers.h"
#include "train.h"

using namespace nax;
using nax::testing::corpus;
using nax::testing::file_bytes;
using nax::testing::replace_file;
using nax::testing::scratch_dir;
using nax::testing::tiny;
using Catch::Matchers::Contains;

namespace {

std::vector<std::int64_t> ckpt_steps(const std::string& dir) { return nax::checkpoint::committed_steps(dir); }

}  // namespace

TEST_CASE("training losses do not depend on the mesh", "[e2e][gptj]") {
  const auto reference = gptj::train(tiny("dp=1,mp=1", 5), corpus()).losses;
  REQUIRE(reference.size() == 5);
  REQUIRE(reference.back() < reference.front());
  for (const std::string mesh : {"dp=1,mp=2", "dp=2,mp=1", "dp=2,mp=2", "dp=1,mp=4"}) {
    INFO("mesh " << mesh);
    auto losses = gptj::train(tiny(mesh, 5), corpus()).losses;
    REQUIRE(nax::testing::max_rel_error(losses, reference) <= 1e-5);
  }
}

TEST_CASE("gradient accumulation over micro-batches gives the same training", "[e2e][gptj]") {
  auto whole = gptj::train(tiny("dp=2,mp=1", 4), corpus()).losses;
  auto options = tiny("dp=2,mp=1", 4);
  options.micro_batches = 2;
  REQUIRE(nax::testing::max_rel_error(gptj::train(options, corpus()).losses, whole) <= 1e-5);
}

TEST_CASE("resuming from a checkpoint continues exactly, on the same mesh or another", "[e2e][gptj]") {
  const auto straight = gptj::train(tiny("dp=2,mp=2", 6), corpus()).losses;
  const std::vector<double> tail(straight.begin() + 3, straight.end());
  for (const std::string resume_mesh : {"dp=2,mp=2", "dp=1,mp=4"}) {
    const std::string dir = scratch_dir("resume");
    auto interrupted = tiny("dp=2,mp=2", 6);
    interrupted.ckpt_dir = dir, interrupted.stop_after = 3;
    REQUIRE(gptj::train(interrupted, corpus()).losses.size() == 3);
    auto resumed = tiny(resume_mesh, 6);
    resumed.ckpt_dir = dir, resumed.resume = true;
    const auto losses = gptj::train(resumed, corpus()).losses;
    INFO("resumed on " << resume_mesh);
    if (resume_mesh == "dp=2,mp=2") REQUIRE(losses == tail);
    else REQUIRE(nax::testing::max_rel_error(losses, tail) <= 1e-5);
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("a checkpoint saved on one mesh samples the same text on another", "[e2e][gptj]") {
  const std::string dir = scratch_dir("reshard");
  auto o = tiny("dp=2,mp=2", 3);
  o.ckpt_dir = dir;
  gptj::train(o, corpus());
  gptj::SampleOptions s;
  s.ckpt_dir = dir, s.prompt = "line 1", s.tokens = 12, s.temperature = 0;
  std::string reference;
  for (const std::string mesh : {"dp=1,mp=1", "dp=1,mp=2", "dp=2,mp=4", "dp=1,mp=4"}) {
    s.mesh = mesh;
    std::string text = gptj::sample(s);
    REQUIRE(text.size() == 12);
    if (reference.empty()) reference = text;
    INFO("mesh " << mesh);
    REQUIRE(text == reference);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("the model learns a synthetic task", "[e2e][gptj]") {
  // A repeating 8-byte pattern: after 60 steps the next byte is predictable (loss < 0.5 nats).
  std::string text;
  for (int i = 0; i < 500; ++i) text += "abcdefg\n";
  auto o = tiny("dp=1,mp=2", 60);
  o.lr = 2e-2, o.warmup = 5;
  auto result = gptj::train(o, gptj::TextData::from_text(text));
  INFO("final loss " << result.losses.back() << " held-out " << result.heldout_loss);
  REQUIRE(result.losses.back() < 0.5);
  REQUIRE(result.heldout_loss < 0.5);
}

TEST_CASE("corrupt, truncated or mismatched checkpoints are refused", "[e2e][gptj][errors]") {
  const std::string dir = scratch_dir("corrupt");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/t.safetensors";
  gptj::save_safetensors(path, {{"w", random_normal(Shape{{"a", 4}, {"b", 3}}, 1, "w")}, {"i", arange({"n", 5}, DType::i32)}});
  auto loaded = gptj::load_safetensors(path);
  REQUIRE(loaded.at("w").to_vector<double>() == random_normal(Shape{{"a", 4}, {"b", 3}}, 1, "w").to_vector<double>());
  REQUIRE(loaded.at("i").to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 1, 2, 3, 4});

  std::string bytes = gptj::read_file(path);
  std::string flipped = bytes;
  flipped[flipped.size() - 3] ^= 0x40;
  gptj::write_file_atomically(path, flipped);
  REQUIRE_THROWS_WITH(gptj::load_safetensors(path), Contains("checksum") && Contains(path));
  gptj::write_file_atomically(path, bytes.substr(0, bytes.size() - 10));
  REQUIRE_THROWS_WITH(gptj::load_safetensors(path), Contains("safetensors") && Contains(path));
  gptj::write_file_atomically(path, bytes.substr(0, 5));
  REQUIRE_THROWS_WITH(gptj::load_safetensors(path), Contains("truncated"));
  REQUIRE_THROWS_WITH(gptj::load_safetensors(dir + "/missing.safetensors"), Contains("cannot read"));

  auto o = tiny("dp=1,mp=1", 1);
  o.ckpt_dir = dir + "/run";
  gptj::train(o, corpus());
  auto other = o;
  other.config = "small", other.resume = true;
  REQUIRE_THROWS_WITH(gptj::train(other, corpus()), Contains("config 'tiny'") && Contains("small"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a mesh that does not divide the model is refused with one clear line", "[e2e][gptj][errors]") {
  REQUIRE_THROWS_WITH(gptj::train(tiny("dp=1,mp=8", 1), corpus()), Contains("heads = 4") && Contains("mp=8"));
  REQUIRE(gptj::padded_for(gptj::config_by_name("tiny"), Mesh::parse("dp=1,mp=3")).vocab == 258);  // bytes, padded for mp=3
  REQUIRE(gptj::padded_for(gptj::config_by_name("125m"), Mesh::parse("dp=1,mp=3")).vocab == 50400);
  REQUIRE_THROWS_WITH(gptj::train(tiny("dp=3,mp=1", 1), corpus()), Contains("batch = 4") && Contains("dp=3"));
  REQUIRE(gptj::train(tiny("mp=2", 2), corpus()).losses == gptj::train(tiny("dp=1,mp=2", 2), corpus()).losses);  // dp left out: dp=1
  REQUIRE_THROWS_WITH(gptj::config_by_name("huge"), Contains("unknown config 'huge'") && Contains("tiny"));
  REQUIRE_THROWS_WITH(gptj::TextData::load({"/nonexistent/file.txt"}), Contains("cannot read '/nonexistent/file.txt'"));
}

// gptj export (for the JAX baseline, bench/jax_baseline.py).
#include <nlohmann/json.hpp>

#include "export.h"

TEST_CASE("gptj export writes the trainer's initial parameters, batches and settings", "[e2e][gptj]") {
  const std::string dir = scratch_dir("export");
  gptj::ExportOptions e;
  e.train = tiny("dp=1,mp=2", 3);
  e.out = dir;
  gptj::export_run(e, corpus());
  for (const char* file : {"model.safetensors", "config.json", "batches.safetensors", "export.json"})
    REQUIRE(std::filesystem::exists(dir + "/" + file));

  // The batches are the loader's, step by step.
  const auto batches = gptj::load_safetensors(dir + "/batches.safetensors");
  REQUIRE(batches.size() == 6);
  for (std::int64_t k = 0; k < 3; ++k) {
    auto [ids, targets] = corpus().batch(gptj::TextData::Split::train, k, 4, 16, 0);
    REQUIRE(batches.at(fmt::format("ids.{}", k)).dtype() == DType::i32);
    REQUIRE(batches.at(fmt::format("ids.{}", k)).to_vector<std::int32_t>() == ids.to_vector<std::int32_t>());
    REQUIRE(batches.at(fmt::format("targets.{}", k)).to_vector<std::int32_t>() == targets.to_vector<std::int32_t>());
  }

  // The settings are the trainer's.
  const auto info = nlohmann::json::parse(gptj::read_file(dir + "/export.json"));
  REQUIRE(info["config"] == "tiny");
  REQUIRE(info["mesh"] == "dp=1,mp=2");
  REQUIRE(info["dims"]["vocab"] == 256);
  REQUIRE(info["steps"] == 3);
  REQUIRE(info["optimizer"]["lr"] == 1e-2);
  REQUIRE(info["optimizer"]["weight_decay"] == gptj::TrainOptions{}.weight_decay);
  REQUIRE(info["lr_per_step"].size() == 3);
  REQUIRE(info["lr_per_step"][1].get<double>() == nn::warmup_cosine(1, 2, 3, 1e-2));

  // The parameters are the trainer's initial ones: on the first batch they give its first loss.
  const gptj::ModelFiles files = gptj::open_model(dir);  // a folder with config.json, as Hugging Face's
  const gptj::Config& config = files.config;
  REQUIRE(config.name == "tiny");
  const auto specs = gptj::parameter_specs(config);
  REQUIRE(files.weights.tensors().size() == specs.size());
  const Mesh mesh = Mesh::parse("dp=1,mp=2");
  const AxisRules rules = gptj::axis_rules(mesh);
  double first_loss = 0;
  Runtime rt = Runtime::local(mesh);
  rt.run([&](Shard& s) {
    std::vector<Tensor> values = checkpoint::load_sharded(s, files.weights, gptj::model_reads(specs), rules, DType::f32);
    const gptj::Model model(config, nn::Parameters::from_values(specs, values));
    NoGrad no_grad;
    const double loss = model.loss(s.shard(batches.at("ids.0").with_shape(Shape{{"batch", 4}, {"seq", 16}}), rules),
                                   s.shard(batches.at("targets.0").with_shape(Shape{{"batch", 4}, {"seq", 16}}), rules))
                            .item();
    if (s.device() == 0) first_loss = loss;
  });
  const auto trained = gptj::train(tiny("dp=1,mp=2", 3), corpus()).losses;
  REQUIRE(nax::testing::max_rel_error({first_loss}, {trained.front()}) <= 1e-6);
  std::filesystem::remove_all(dir);
}

// Checkpoints that are one unit, validated loads, checked resume (docs/checkpoints.md).
#include <random>

TEST_CASE("config.json: every field type- and range-checked, the file and field named", "[e2e][gptj][errors]") {
  const std::string good = gptj::hf_config_json(gptj::config_by_name("tiny"));
  REQUIRE(gptj::config_from_json(good, "c.json").n_heads == 4);
  auto with = [&](const std::string& field, const std::string& value) {
    auto j = nlohmann::json::parse(good);
    j[field] = nlohmann::json::parse(value);
    return j.dump();
  };
  const std::vector<std::tuple<std::string, std::string, std::string>> cases{
      {"n_head", "0", "field 'n_head' is 0, outside [1, 32]"},
      {"n_head", "3", "'n_head' = 3 does not divide n_embd = 32"},
      {"n_head", "2", "field 'n_head' is 2, config 'tiny' has 4"},
      {"n_head", "8", "field 'n_head' is 8, config 'tiny' has 4"},
      {"n_head", "2.5", "field 'n_head' is 2.5, not an integer"},
      {"n_head", "\"4\"", "not an integer"},
      {"n_layer", "0", "field 'n_layer' is 0"},
      {"n_layer", "-1", "field 'n_layer' is -1"},
      {"n_layer", "1", "field 'n_layer' is 1, config 'tiny' has 2"},
      {"rotary_dim", "0", "field 'rotary_dim' is 0"},
      {"rotary_dim", "3", "'rotary_dim' = 3 is odd"},
      {"rotary_dim", "2", "field 'rotary_dim' is 2, config 'tiny' has 4"},
      {"n_embd", "1e18", "field 'n_embd'"},
      {"vocab_size", "18446744073709551615", "field 'vocab_size'"},
      {"activation_function", "\"relu\"", "'activation_function' is \"relu\": nax's GPT-J supports \"gelu_new\" only"},
      {"layer_norm_epsilon", "-1", "'layer_norm_epsilon' is -1"},
      {"layer_norm_epsilon", "\"small\"", "'layer_norm_epsilon' is \"small\""},
      {"tie_word_embeddings", "true", "tie_word_embeddings"},
      {"model_type", "\"gpt2\"", "model_type"},
  };
  for (const auto& [field, value, expected] : cases) {
    INFO(field << " = " << value);
    REQUIRE_THROWS_WITH(gptj::config_from_json(with(field, value), "c.json"), Contains(expected) && Contains("c.json"));
  }
  REQUIRE_THROWS_WITH(gptj::config_from_json("[1]", "c.json"), Contains("'c.json' is an array, not a JSON object"));
  REQUIRE_THROWS_WITH(gptj::config_from_json("{", "c.json"), Contains("'c.json' is not valid JSON"));
  auto custom = nlohmann::json::parse(with("nax_config", "\"mine\""));
  custom["n_head"] = 8, custom["rotary_dim"] = 2, custom["layer_norm_epsilon"] = 0.25;
  const gptj::Config c = gptj::config_from_json(custom.dump(), "c.json");
  REQUIRE((c.n_heads == 8 && c.head_dim == 4 && c.rotary_dims == 2 && c.layer_norm_eps == 0.25));

  // Mutations of the text: each parses to a config or is refused with a nax::Error.
  std::mt19937_64 rng(7);
  const std::vector<std::string> tokens{"0", "-1", "1e308", "1e999", "2.5", "null", "true", "\"\"", "[]", "{}", ",", ":", "9223372036854775808"};
  int refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string text = good;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k) {
      const std::size_t at = rng() % text.size();
      if (rng() % 2) text.replace(at, 1 + rng() % 4, tokens[rng() % tokens.size()]);
      else text.insert(at, tokens[rng() % tokens.size()]);
    }
    try {
      gptj::config_from_json(text, "c.json");
    } catch (const nax::Error&) {
      ++refused;
    }
  }
  REQUIRE(refused > 1000);
}

TEST_CASE("layer_norm_epsilon of config.json is honoured", "[e2e][gptj]") {
  const std::string dir = scratch_dir("epsilon");
  auto o = tiny("dp=1,mp=1", 1);
  o.ckpt_dir = dir + "/run";
  gptj::train(o, corpus());
  const std::string model = dir + "/model";  // a plain Hugging Face-style folder: no manifest
  std::filesystem::create_directories(model);
  std::filesystem::copy_file(dir + "/run/step_000001/model.safetensors", model + "/model.safetensors");
  gptj::SampleOptions s;
  s.ckpt_dir = model, s.prompt = "line 1";
  std::vector<std::vector<double>> logits;
  for (double eps : {1e-5, 1e-5, 0.5}) {
    auto config = gptj::config_by_name("tiny");
    config.layer_norm_eps = eps;
    replace_file(model + "/config.json", gptj::hf_config_json(config));
    logits.push_back(gptj::prompt_logits(s).back());
  }
  REQUIRE(logits[0] == logits[1]);
  for (double v : logits[2]) REQUIRE(std::isfinite(v));  // so that a NaN cannot pass for a difference
  REQUIRE(nax::testing::max_rel_error(logits[2], logits[0]) > 1e-3);
  std::filesystem::remove_all(dir);
}

TEST_CASE("resume (--resume) compares the run's settings and names what differs", "[e2e][gptj][errors]") {
  const std::string dir = scratch_dir("resume_checks");
  auto first = tiny("dp=1,mp=2", 4);
  first.ckpt_dir = dir, first.stop_after = 2;
  gptj::train(first, corpus());
  REQUIRE(ckpt_steps(dir) == std::vector<std::int64_t>{2});
  auto resumed = [&](auto edit) {
    auto o = tiny("dp=1,mp=2", 4);
    o.ckpt_dir = dir, o.resume = true;
    edit(o);
    return o;
  };
  REQUIRE_THROWS_WITH(gptj::train(resumed([](auto& o) { o.batch = 8; }), corpus()), Contains("batch differs: the checkpoint's run has 4, this one 8"));
  REQUIRE_THROWS_WITH(gptj::train(resumed([](auto& o) { o.seed = 3; }), corpus()), Contains("seed differs") && Contains("has 0, this one 3"));
  REQUIRE_THROWS_WITH(gptj::train(resumed([](auto& o) { o.lr = 1e-3; }), corpus()), Contains("lr differs"));
  REQUIRE_THROWS_WITH(gptj::train(resumed([](auto& o) { o.dtype = DType::bf16; }), corpus()), Contains("dtype differs"));
  REQUIRE_THROWS_WITH(gptj::train(resumed([](auto& o) { o.steps = 6; }), corpus()), Contains("steps differs") && Contains("--allow-extend-steps"));
  REQUIRE_THROWS_WITH(gptj::train(resumed([](auto& o) { o.steps = 2, o.allow_extend_steps = true; }), corpus()), Contains("steps differs"));
  // A fresh run into a folder holding checkpoints is refused.
  auto fresh = tiny("dp=1,mp=2", 4);
  fresh.ckpt_dir = dir;
  REQUIRE_THROWS_WITH(gptj::train(fresh, corpus()), Contains("already holds checkpoints (newest step 2)") && Contains("--resume"));
  // Extending, on another mesh: allowed with the flag.
  auto extended = resumed([](auto& o) { o.steps = 6, o.allow_extend_steps = true, o.mesh = "dp=2,mp=1", o.save_every = 1, o.keep = 2; });
  REQUIRE(gptj::train(extended, corpus()).losses.size() == 4);
  REQUIRE(ckpt_steps(dir) == std::vector<std::int64_t>{5, 6});
  // A damaged committed checkpoint is refused on resume, naming the file.
  const std::string weights = dir + "/step_000006/model.safetensors";
  std::string bytes = file_bytes(weights);
  bytes[bytes.size() / 2] ^= 0x10;
  replace_file(weights, bytes);
  auto more = resumed([](auto& o) { o.steps = 8, o.allow_extend_steps = true; });
  REQUIRE_THROWS_WITH(gptj::train(more, corpus()), Contains(weights) && Contains("checksum"));
  gptj::SampleOptions sample;
  sample.ckpt_dir = dir;
  REQUIRE_THROWS_WITH(gptj::sample(sample), Contains(weights));
  std::filesystem::remove_all(dir);
}

TEST_CASE("prompts beyond the context are refused, without overflow", "[e2e][gptj][errors]") {
  const std::string dir = scratch_dir("context");
  auto o = tiny("dp=1,mp=1", 1);
  o.ckpt_dir = dir;
  gptj::train(o, corpus());
  gptj::SampleOptions s;
  s.ckpt_dir = dir, s.prompt = std::string(2049, 'a');
  REQUIRE_THROWS_WITH(gptj::prompt_logits(s), Contains("the prompt (2049 tokens) plus 0 generated exceeds the model's context of 2048"));
  s.prompt = "abc", s.tokens = std::numeric_limits<std::int64_t>::max();
  REQUIRE_THROWS_WITH(gptj::sample(s), Contains("exceeds the model's context of 2048"));
  s.prompt = std::string(2044, 'a'), s.tokens = 4, s.temperature = 0;  // exactly the context
  REQUIRE(gptj::sample(s).empty() == false);
  s.temperature = std::nan("");
  REQUIRE_THROWS_WITH(gptj::sample(s), Contains("--temperature must be a finite number"));
  std::filesystem::remove_all(dir);
}
