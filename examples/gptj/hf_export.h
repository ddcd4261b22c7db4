#pragma once
// `gptj convert`: a model folder (a nax step folder or a Hugging Face GPT-J folder) written as a
// Hugging Face folder in a chosen dtype, sharded above a size (docs/hf-import.md).
#include <cstdint>
#include <string>
#include <vector>

namespace gptj {

struct ConvertOptions {
  std::string from;             // a run folder, step folder or Hugging Face folder
  std::string out;              // a new or empty folder
  std::string dtype = "F32";    // F32, BF16 or F16 (nax::checkpoint::parse_stored_dtype)
  std::uint64_t max_file_bytes = 10ull << 30;  // above this, shards and model.safetensors.index.json (transformers' default: 10 GB)
  bool allow_nonfinite = false;  // weights holding NaN or infinities are refused unless set
};

// Writes out/config.json and the weights, one tensor at a time; returns the files written.
std::vector<std::string> convert(const ConvertOptions& options);

}  // namespace gptj
