#pragma once
// What a BpeTokenizer holds: the parts of a tokenizer.json that encoding and decoding use.
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "nax/io/caps.h"
#include "nax/text/bpe_tokenizer.h"
#include "text/added_tokens.h"
#include "text/bpe_model.h"
#include "text/regex_splitter.h"

namespace nax::text {

struct BpeTokenizer::Impl {
  std::string source;            // the file, for errors
  bool add_prefix_space = false;  // ByteLevel pre-tokenizer: a space before each text segment
  std::unique_ptr<RegexSplitter> splitter;  // null: no regex split (use_regex false)
  std::unique_ptr<BpeModel> model;
  std::vector<AddedToken> added;
  std::unique_ptr<AddedTokenMatcher> raw_matcher;         // added tokens matched on the raw text
  std::unique_ptr<AddedTokenMatcher> normalized_matcher;  // then those matched on normalized text
  std::vector<std::string> tokens;  // id -> token ("" for ids that are none)
  std::vector<std::string> bytes;   // id -> the bytes decoding gives for it
  std::vector<bool> has_token;
  std::vector<bool> special;
  std::unordered_map<std::string, std::int32_t> added_ids;
  std::unordered_map<std::string, std::int32_t> model_ids;

  // Pieces already encoded (most words repeat): piece bytes -> ids.
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache;
};

// Reads a tokenizer.json's text into an Impl; errors name `source` and the field.
std::shared_ptr<BpeTokenizer::Impl> parse_tokenizer_json(std::string_view json, const std::string& source);

// A regular file's bytes (nax::io::read_file: a folder or FIFO is refused, and a file above the
// kind's cap); errors start with `what`.
std::string read_text_file(const std::string& path, std::string_view what, const io::FileCaps& caps);

}  // namespace nax::text
