#include "tokenize.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nax/core/error.h>
#include <nax/text/bpe_tokenizer.h>
#include <nax/text/token_file.h>

namespace gptj {

void tokenize_command(const TokenizeOptions& o) {
  if (o.tokenizer.empty()) nax::fail("gptj tokenize", "needs --tokenizer FILE (a Hugging Face tokenizer.json)");
  if (o.has_text == !o.data.empty()) nax::fail("gptj tokenize", "needs one of --text TEXT and --data FILE");
  const auto tokenizer = nax::text::BpeTokenizer::from_file(o.tokenizer);
  if (o.has_text) {
    fmt::print("[{}]\n", fmt::join(tokenizer.encode(o.text), ", "));
    return;
  }
  const std::string out = o.out.empty() ? o.data + ".tokens" : o.out;
  const auto tokens = nax::text::tokenize_file(tokenizer, nax::text::tokenizer_file_key(o.tokenizer), o.data, out,
                                               o.quiet ? nax::text::TokenizeProgress{} : nax::text::print_tokenize_progress);
  fmt::print("{}: {} tokens, vocabulary {}, {} bytes per token\n", out, tokens.size(), tokenizer.vocab_size(),
             tokenizer.vocab_size() <= 65536 ? 2 : 4);
}

}  // namespace gptj
