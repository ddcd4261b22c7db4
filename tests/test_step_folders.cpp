// Step folders read only as committed units, by one loader for every command; weights and losses
// that are not finite refused by name. The damage is the forger's: files edited and their
// checksums (the safetensors file's and the manifest's) recomputed, so that each check below is
// the only one that can refuse it.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "files.h"
#include "gptj_helpers.h"
#include "hf_export.h"
#include "step_files.h"
#include "train.h"

using namespace nax;
using Catch::Matchers::Contains;
using nax::testing::corpus;
using nax::testing::file_bytes;
using nax::testing::replace_file;
using nax::testing::scratch_dir;
using nax::testing::tiny;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kFixture = NAX_HF_FIXTURES;

// Rewrites `folder`'s manifest.json to list its files as they now are.
void reseal_manifest(const std::string& folder) {
  json manifest = json::parse(file_bytes(folder + "/manifest.json"));
  json files = json::object();
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (name != "manifest.json") files[name] = {{"bytes", fs::file_size(entry.path())}, {"checksum", io::file_checksum(entry.path().string())}};
  }
  manifest["files"] = files;
  replace_file(folder + "/manifest.json", manifest.dump(2));
}

// Element `index` of tensor `name` in safetensors file `path` set to NaN (F32 or F16), and the
// file's own checksum, when it has one, recomputed.
void poke_nan(const std::string& path, const std::string& name, std::size_t index) {
  std::string bytes = file_bytes(path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  const json header = json::parse(bytes.substr(8, n));
  const auto& entry = header.at(name);
  const std::size_t width = entry.at("dtype") == "F32" ? 4 : 2, at = 8 + n + entry.at("data_offsets")[0].get<std::size_t>() + index * width;
  const std::uint32_t f32_nan = 0x7fc00000u;
  const std::uint16_t f16_nan = 0x7e00u;
  std::memcpy(bytes.data() + at, width == 4 ? static_cast<const void*>(&f32_nan) : static_cast<const void*>(&f16_nan), width);
  const std::string key = "\"nax.checksum\":\"";
  if (const auto digits = bytes.find(key, 8); digits != std::string::npos && digits < 8 + n) {
    bytes.replace(digits + key.size(), 16, std::string(16, '0'));
    io::Checksum sum;
    sum.update(bytes.data(), bytes.size());
    bytes.replace(digits + key.size(), 16, sum.hex());
  }
  replace_file(path, bytes);
}

void edit_json(const std::string& path, const std::function<void(json&)>& edit) {
  json j = json::parse(file_bytes(path));
  edit(j);
  replace_file(path, j.dump(2));
}

// A run of `steps` steps of tiny in `dir`, a checkpoint after each.
void train_run(const std::string& dir, std::int64_t steps) {
  auto o = tiny("dp=1,mp=1", steps);
  o.ckpt_dir = dir, o.save_every = 1;
  gptj::train(o, corpus());
}

gptj::TrainOptions resume_of(const std::string& dir, std::int64_t steps) {
  auto o = tiny("dp=1,mp=1", steps);
  o.ckpt_dir = dir, o.resume = true, o.allow_extend_steps = true, o.save_every = 1;
  return o;
}

// What `run` throws, or "" when it does not.
std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const nax::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a step folder without its manifest is refused by every command", "[e2e][gptj][errors]") {
  const std::string dir = scratch_dir("no_manifest"), run = dir + "/run", step = run + "/step_000002";
  train_run(run, 2);
  fs::remove(step + "/manifest.json");
  REQUIRE_THROWS_WITH(gptj::open_model(run), Contains(step) && Contains("has no manifest.json"));
  REQUIRE_THROWS_WITH(gptj::open_model(step), Contains("has no manifest.json"));
  gptj::ConvertOptions convert{step, dir + "/out"};
  REQUIRE_THROWS_WITH(gptj::convert(convert), Contains("has no manifest.json"));
  REQUIRE_THROWS_WITH(gptj::train(resume_of(run, 3), corpus()), Contains("has no manifest.json"));
  auto init = tiny("dp=1,mp=1", 1);
  init.config = "", init.init_from = step;
  REQUIRE_THROWS_WITH(gptj::train(init, corpus()), Contains("has no manifest.json"));
  // Copied out of its run folder under another name, it still holds trainer.json: a step folder.
  fs::copy(step, dir + "/mymodel");
  REQUIRE_THROWS_WITH(gptj::open_model(dir + "/mymodel"), Contains("has no manifest.json"));
  // An uncommitted temporary, given by name.
  fs::copy(step, run + "/step_000003.tmp.999999");
  REQUIRE_THROWS_WITH(gptj::open_model(run + "/step_000003.tmp.999999"), Contains("has no manifest.json"));
  // The step before it is untouched and loads.
  REQUIRE(gptj::open_model(run + "/step_000001").config.name == "tiny");
  fs::remove_all(dir);
}

TEST_CASE("every command reads a step folder's config as --resume does", "[e2e][gptj][errors]") {
  const std::string dir = scratch_dir("one_loader"), run = dir + "/run", step = run + "/step_000002";
  train_run(run, 2);
  const std::string config = step + "/config.json", trainer = step + "/trainer.json";
  const std::string config_before = file_bytes(config), trainer_before = file_bytes(trainer);

  // config.json alone edited: every reader refuses it, naming both files.
  edit_json(config, [](json& j) { j["layer_norm_epsilon"] = 0.5; });
  reseal_manifest(step);
  for (const std::string& message : {error_of([&] { gptj::open_model(run); }), error_of([&] { gptj::train(resume_of(run, 3), corpus()); })}) {
    REQUIRE_THAT(message, Contains(config) && Contains(trainer) && Contains("layer_norm_epsilon") && Contains("run.config.layer_norm_eps"));
  }

  // Both edited alike: read as written by every command, and --resume names the difference.
  edit_json(trainer, [](json& j) { j["run"]["config"]["layer_norm_eps"] = 0.5; });
  reseal_manifest(step);
  REQUIRE(gptj::open_model(step).config.layer_norm_eps == 0.5);
  REQUIRE_THROWS_WITH(gptj::train(resume_of(run, 3), corpus()),
                      Contains("config.layer_norm_eps differs: the checkpoint's run has 0.5, this one 1e-05") && Contains(trainer));

  // trainer.json's fields are named with the file.
  replace_file(config, config_before);
  replace_file(trainer, trainer_before);
  edit_json(trainer, [](json& j) { j["run"]["seed"] = 99; });
  reseal_manifest(step);
  REQUIRE(gptj::open_model(run).config.name == "tiny");
  REQUIRE_THROWS_WITH(gptj::train(resume_of(run, 3), corpus()), Contains("seed differs") && Contains(trainer) && Contains("'run.seed'"));
  edit_json(trainer, [](json& j) { j["step"] = "2"; });
  reseal_manifest(step);
  REQUIRE_THROWS_WITH(gptj::open_model(run), Contains(trainer) && Contains("field 'step' is \"2\", not an integer"));
  fs::remove_all(dir);
}

TEST_CASE("weights that are not finite are refused, naming the tensor and the count", "[e2e][gptj][errors]") {
  const std::string dir = scratch_dir("nonfinite"), hf = dir + "/hf";
  fs::create_directories(hf);
  for (const char* f : {"config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"})
    fs::copy_file(kFixture + "/" + f, hf + "/" + f);
  const json index = json::parse(file_bytes(hf + "/model.safetensors.index.json"));
  const std::string tensor = "transformer.h.1.mlp.fc_in.weight", shard = hf + "/" + index["weight_map"][tensor].get<std::string>();
  poke_nan(shard, tensor, 5);
  poke_nan(shard, tensor, 17);
  gptj::SampleOptions s;
  s.ckpt_dir = hf, s.prompt = "hello";
  REQUIRE_THROWS_WITH(gptj::prompt_logits(s), Contains(shard) && Contains(tensor) && Contains("holds 2 non-finite values"));
  gptj::ConvertOptions convert{hf, dir + "/out"};
  REQUIRE_THROWS_WITH(gptj::convert(convert), Contains(tensor) && Contains("holds 2 non-finite"));
  s.allow_nonfinite = true;
  REQUIRE(std::isnan(gptj::prompt_logits(s).back().front()));

  // A step folder resealed around a NaN: refused as well.
  const std::string run = dir + "/run", step = run + "/step_000001";
  train_run(run, 1);
  poke_nan(step + "/model.safetensors", "lm_head.weight", 0);
  reseal_manifest(step);
  s.ckpt_dir = run, s.allow_nonfinite = false;
  REQUIRE_THROWS_WITH(gptj::prompt_logits(s), Contains(step + "/model.safetensors") && Contains("lm_head.weight") && Contains("holds 1 non-finite"));
  fs::remove_all(dir);
}

TEST_CASE("a loss that is not finite stops training and saves nothing over the last good step", "[e2e][gptj][errors]") {
  const std::string dir = scratch_dir("nan_loss"), run = dir + "/run", step = run + "/step_000002";
  train_run(run, 2);
  // Step 2's weights made NaN (resealed): accepted only with allow_nonfinite, then the first step's loss is NaN.
  poke_nan(step + "/model.safetensors", "transformer.ln_f.weight", 3);  // every position's output
  reseal_manifest(step);
  std::map<std::string, std::string> before;
  for (const auto& entry : fs::directory_iterator(step)) before[entry.path().filename().string()] = file_bytes(entry.path().string());
  REQUIRE_THROWS_WITH(gptj::train(resume_of(run, 4), corpus()), Contains("transformer.ln_f.weight") && Contains("non-finite"));
  auto o = resume_of(run, 4);
  o.allow_nonfinite = true;
  REQUIRE_THROWS_WITH(gptj::train(o, corpus()),
                      Contains("step 3: the loss is nan: training stopped, nothing of this step saved (the newest checkpoint, step 2"));
  REQUIRE(nax::checkpoint::committed_steps(run) == std::vector<std::int64_t>{1, 2});
  for (const auto& [name, bytes] : before) REQUIRE(file_bytes(step + "/" + name) == bytes);
  fs::remove_all(dir);
}
