#pragma once
// GPT-J checkpoints on top of nax's checkpoint module (nax/checkpoint/): a run folder of
// step_NNNNNN/ folders, each one unit (docs/checkpoints.md) and each a folder that Hugging Face's
// GPTJForCausalLM.from_pretrained loads:
//   config.json            GPTJConfig (validated on load: types, ranges, activation, epsilon)
//   model.safetensors      the parameters, Hugging Face names and layouts, f32
//   optimizer.safetensors  AdamW's moments m.NAME and v.NAME, f32
//   trainer.json           the step, the optimizer's step count, the tokenizer and the run record
//                          (what defines the trajectory, compared on --resume; step_files.h)
//   manifest.json          every file's size and checksum, written last
// Every command reads a step folder through one loader, open_step (step_files.h).
#include <nax/nax.h>
#include <nax/io/json.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "config.h"
#include "nax/io/files.h"
#include "nax/io/read_file.h"

namespace gptj {

using NamedTensors = std::vector<std::pair<std::string, nax::Tensor>>;
using nax::checkpoint::load_safetensors;
using nax::io::read_file;
using nax::checkpoint::save_safetensors;
using nax::io::write_file_atomically;

// A model tensor's dims as Hugging Face lays it out (heads and head_dim merged into one).
std::vector<std::int64_t> hf_dims(const nax::Shape& s);
nax::Tensor to_hf_layout(const nax::Tensor& t);

// config.json in the form of Hugging Face's GPTJConfig, and back: every field type- and
// range-checked, errors naming `path` and the field.
std::string hf_config_json(const Config& c);
nlohmann::json hf_config(const Config& c);  // the same, as JSON to edit before writing
Config config_from_json(const std::string& text, const std::string& path = "config.json");
Config config_from_json(const nax::io::JsonValue& json);
Config config_from_file(const std::string& path);  // through nax's bounded JSON reader, capped at 1 MiB

// The model tensors of device `s`'s parameters, gathered to global host tensors in Hugging Face
// layout (collective: every device calls it; the result is whole on each).
NamedTensors gather_hf_parameters(nax::Shard& s, const nax::nn::Parameters& params);

// The tensors a checkpoint holds for `specs`: model (Hugging Face names) and optimizer (m.NAME,
// v.NAME), with their stored dims.
std::vector<nax::checkpoint::ShardedRead> model_reads(const std::vector<nax::nn::ParamSpec>& specs);
std::vector<nax::checkpoint::ShardedRead> optimizer_reads(const std::vector<nax::nn::ParamSpec>& specs);

// Checks that `file` holds exactly `reads` (names, stored dims, f32), naming the file and tensor.
void expect_exactly(const nax::checkpoint::SafetensorsReader& file, const std::vector<nax::checkpoint::ShardedRead>& reads);

// A folder to load a model from: `dir` itself when it holds config.json or is a step folder
// (is_step_folder), else the newest committed step folder of run folder `dir`.
std::string model_folder(const std::string& dir);

// Checks that `weights` holds exactly `reads` (names, stored dims, any floating dtype; the
// attention mask buffers older transformers saved are allowed), naming the file and tensor.
void expect_model_tensors(const nax::checkpoint::SafetensorsFolder& weights, const std::vector<nax::checkpoint::ShardedRead>& reads);

// A model folder opened for inference or fine-tuning: its config (checked against the tensors)
// and weights, either a nax step folder (opened by open_step, as --resume opens it) or a Hugging
// Face folder (model.safetensors, or shards and model.safetensors.index.json; F32, F16 or BF16,
// read as f32; docs/hf-import.md). `nonfinite`: whether NaN or infinite weights are refused as
// they are read.
struct ModelFiles {
  std::string folder;
  Config config;
  nax::checkpoint::SafetensorsFolder weights;
};
inline nax::checkpoint::NonFinitePolicy nonfinite_policy(bool allow) {
  return allow ? nax::checkpoint::NonFinitePolicy::allow : nax::checkpoint::NonFinitePolicy::refuse;
}
ModelFiles open_model(const std::string& dir, nax::checkpoint::NonFinitePolicy nonfinite = nax::checkpoint::NonFinitePolicy::refuse);

}  // namespace gptj
