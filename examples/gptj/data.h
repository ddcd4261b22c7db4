#pragma once
// Byte-level tokenizer and a deterministic loader over text files: the global batch of a step is
// a pure function of (seed, step), then cut over dp, so data order does not depend on the mesh.
#include <nax/nax.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gptj {

// Token = byte (vocab 256).
std::vector<std::int32_t> encode(const std::string& text);
std::string decode(const std::vector<std::int32_t>& tokens);

class TextData {
 public:
  // Reads and concatenates the files; the last `heldout_fraction` of the tokens is held out.
  static TextData load(const std::vector<std::string>& files, double heldout_fraction = 0.1);
  static TextData from_text(const std::string& text, double heldout_fraction = 0.1);

  enum class Split { train, heldout };
  // Global batch `index` of a split: inputs and next-token targets, i32 [batch, seq] each.
  std::pair<nax::Tensor, nax::Tensor> batch(Split split, std::int64_t index, std::int64_t batch, std::int64_t seq,
                                            std::uint64_t seed) const;
  std::size_t size(Split split) const { return split == Split::train ? train_.size() : heldout_.size(); }

 private:
  std::vector<std::int32_t> train_, heldout_;
};

}  // namespace gptj
