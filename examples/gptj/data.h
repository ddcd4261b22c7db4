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
  // The files tokenized with a Hugging Face tokenizer.json (nax::text, docs/tokenizer.md), each
  // once into a cached token file (FILE.tokens, or in `cache_dir`), with a progress line unless
  // `quiet`; files are joined by <|endoftext|> where the tokenizer has it.
  static TextData load_tokenized(const std::vector<std::string>& files, const std::string& tokenizer, const std::string& cache_dir = "",
                                 bool quiet = false, double heldout_fraction = 0.1);
  // 256 for bytes, else the tokenizer's.
  std::int64_t vocab_size() const { return vocab_; }

  enum class Split { train, heldout };
  // Global batch `index` of a split: inputs and next-token targets, i32 [batch, seq] each.
  std::pair<nax::Tensor, nax::Tensor> batch(Split split, std::int64_t index, std::int64_t batch, std::int64_t seq,
                                            std::uint64_t seed) const;
  std::size_t size(Split split) const { return split == Split::train ? train_.size() : heldout_.size(); }

 private:
  static TextData from_tokens(const std::vector<std::int32_t>& tokens, std::int64_t vocab, double heldout_fraction);

  std::vector<std::int32_t> train_, heldout_;
  std::int64_t vocab_ = 256;
};

}  // namespace gptj
