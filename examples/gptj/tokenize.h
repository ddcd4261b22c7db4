#pragma once
// gptj tokenize: a Hugging Face tokenizer.json on a text (ids as JSON) or on a training file (a
// cached token file, docs/tokenizer.md).
#include <string>

namespace gptj {

struct TokenizeOptions {
  std::string tokenizer;  // tokenizer.json
  std::string text;       // --text: print its ids
  bool has_text = false;
  std::string data;  // --data: tokenize this file into a token file
  std::string out;   // the token file (default: data + ".tokens")
  bool quiet = false;
};

// Prints the ids of `text` as a JSON list, or tokenizes `data` (with a progress line) and prints
// what it wrote.
void tokenize_command(const TokenizeOptions& o);

}  // namespace gptj
