#pragma once
// nax::text::BpeTokenizer: the byte-level BPE tokenizer of GPT-2 and GPT-J, read from a Hugging Face
// tokenizer.json, with ids identical to the `tokenizers` library's (docs/tokenizer.md).
//
//   auto tok = nax::text::BpeTokenizer::from_file("tokenizer.json");
//   std::vector<std::int32_t> ids = tok.encode("Hello world<|endoftext|>");
//   std::string text = tok.decode(ids);
//
// Input is bytes: invalid UTF-8 is first replaced, each maximal invalid subpart by U+FFFD, as
// Python's bytes.decode("utf-8", errors="replace") does before `tokenizers` sees the text. Decoding
// is lossy in the same way (ids whose bytes do not form UTF-8 give U+FFFD); decode_bytes is exact.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nax::text {

class BpeTokenizer {
 public:
  // Reads a tokenizer.json; a missing file, invalid JSON or an unsupported model, normalizer,
  // pre-tokenizer, post-processor or decoder is a nax::Error naming the file and the field.
  static BpeTokenizer from_file(const std::string& path);
  // The same from the file's text; `source` names it in errors.
  static BpeTokenizer from_json(std::string_view json, const std::string& source = "<tokenizer json>");

  // Ids of `text` (bytes). Added and special tokens (e.g. <|endoftext|>) in the text are matched
  // first, as `tokenizers` does.
  std::vector<std::int32_t> encode(std::string_view text) const;
  // The same, calling progress(bytes of `text` done) every few hundred KB (for large files).
  std::vector<std::int32_t> encode(std::string_view text, const std::function<void(std::size_t)>& progress) const;
  // The text of `ids`, invalid UTF-8 replaced by U+FFFD (what `tokenizers` decode returns);
  // unknown ids are an error.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special_tokens = false) const;
  // The exact bytes of `ids` (the round trip of any valid UTF-8 text).
  std::string decode_bytes(std::span<const std::int32_t> ids, bool skip_special_tokens = false) const;

  // One more than the largest id, added tokens included.
  std::int64_t vocab_size() const;
  std::optional<std::int32_t> token_to_id(std::string_view token) const;
  // The token's string as in tokenizer.json (byte-level characters for the model's tokens).
  std::string id_to_token(std::int32_t id) const;
  bool is_special(std::int32_t id) const;

  struct Impl;

 private:
  explicit BpeTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace nax::text
