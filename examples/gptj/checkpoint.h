#pragma once
// Checkpoints: safetensors files of global tensors (so a checkpoint saved on one mesh loads on
// any other), Hugging Face GPT-J names and a config.json, plus the optimizer state and the
// trainer's position for an exact resume. Written to a temporary file, flushed and renamed; a
// checksum in the metadata is verified on load, so a corrupt or truncated file is refused.
#include <nax/nax.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "config.h"

namespace gptj {

using NamedTensors = std::vector<std::pair<std::string, nax::Tensor>>;

// Host tensors in f32/f64/bf16/i32, with their dimensions as they are (see to_hf_layout).
void save_safetensors(const std::string& path, const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});
// Tensors keyed by name, as 1-D-or-more host tensors with axes "d0", "d1", ...
std::map<std::string, nax::Tensor> load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// A model tensor as Hugging Face lays it out (heads and head_dim merged into one dimension), and
// back: tensor `name` of a loaded file in the model's named `shape`, checked, as f32.
nax::Tensor to_hf_layout(const nax::Tensor& t);
nax::Tensor from_hf_layout(const std::map<std::string, nax::Tensor>& tensors, const std::string& name, const nax::Shape& shape,
                           const std::string& path);

// Writes `text` to `path` atomically (temporary file, fsync, rename).
void write_file_atomically(const std::string& path, const std::string& text);
std::string read_file(const std::string& path);

// config.json in the form of Hugging Face's GPTJConfig.
std::string hf_config_json(const Config& c);
Config config_from_json(const std::string& text);

// The model tensors of device `s`'s parameters, gathered to global host tensors in Hugging Face
// layout (collective: every device calls it; the result is whole on each).
NamedTensors gather_hf_parameters(nax::Shard& s, const nax::nn::Parameters& params);

}  // namespace gptj
