#pragma once
// Token files: a text tokenized once and cached, as llm.c and nanoGPT do (docs/tokenizer.md).
// Layout, little-endian: the 8 bytes "NAXTOKS1", u32 bytes per token (2 when the vocabulary fits
// in uint16, else 4), u32 reserved (0), u64 token count, u64 vocabulary size, u64 key (a hash of
// the tokenizer file and of the text), then the tokens.
#include <nax/text/bpe_tokenizer.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace nax::text {

struct TokenFile {
  std::vector<std::int32_t> tokens;
  std::int64_t vocab_size = 0;
  std::uint64_t key = 0;
  int bytes_per_token = 0;
};

// Writes `tokens` to `path` atomically (a temporary file beside it, then a rename).
void write_token_file(const std::string& path, const std::vector<std::int32_t>& tokens, std::int64_t vocab_size, std::uint64_t key);
// Reads a token file; a missing, truncated or foreign file is a nax::Error naming it.
TokenFile read_token_file(const std::string& path);

// Progress of tokenize_file: bytes of text done and in all, tokens so far.
using TokenizeProgress = std::function<void(std::uint64_t bytes_done, std::uint64_t bytes_total, std::uint64_t tokens)>;

// The tokens of the text file `text_path`: read from `cache_path` (default: text_path + ".tokens")
// when it holds this text tokenized by this tokenizer, else tokenized (chunks of lines, reporting
// to `progress`) and written there. `tokenizer_key` identifies the tokenizer (tokenizer_file_key).
std::vector<std::int32_t> tokenize_file(const BpeTokenizer& tokenizer, std::uint64_t tokenizer_key, const std::string& text_path,
                                        std::string cache_path = "", const TokenizeProgress& progress = {});
// A key for a tokenizer file: the hash of its bytes.
std::uint64_t tokenizer_file_key(const std::string& tokenizer_path);
// The progress line tokenize_file's callers print (on stderr, rewritten in place).
void print_tokenize_progress(std::uint64_t bytes_done, std::uint64_t bytes_total, std::uint64_t tokens);

}  // namespace nax::text
