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

// Host tensors in f32/f64/bf16/i32. `shapes` (optional) gives the 2-D shape to record for a tensor
// whose named shape has more axes (Hugging Face stores [heads*head_dim, embed]).
void save_safetensors(const std::string& path, const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});
// Tensors keyed by name, as 1-D-or-more host tensors with axes "d0", "d1", ...
std::map<std::string, nax::Tensor> load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// Writes `text` to `path` atomically (temporary file, fsync, rename).
void write_file_atomically(const std::string& path, const std::string& text);
std::string read_file(const std::string& path);

// config.json in the form of Hugging Face's GPTJConfig.
std::string hf_config_json(const Config& c);
Config config_from_json(const std::string& text);

}  // namespace gptj
