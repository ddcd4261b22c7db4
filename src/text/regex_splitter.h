#pragma once
// Splits valid UTF-8 text into the pieces a pattern matches and the gaps between them (in order,
// nothing dropped), as `tokenizers`' Split with behaviour "Isolated" does. PCRE2 in UTF and UCP
// mode (Unicode properties for \p{L}, \p{N}, \s), JIT-compiled where the platform has it.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace nax::text {

// GPT-2's pre-tokenization pattern (Hugging Face's ByteLevel pre-tokenizer).
inline constexpr std::string_view gpt2_pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class RegexSplitter {
 public:
  // `where` names the pattern's origin in errors (e.g. the file and field).
  RegexSplitter(std::string_view pattern, const std::string& where);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Calls piece(begin, end) for each piece of `text`, in order; they cover the text.
  template <typename F>
  void split(std::string_view text, F&& piece) const;

 private:
  // The next match at or after `start`: true and [begin, end), or false.
  bool find(std::string_view text, std::size_t start, void* match_data, std::size_t& begin, std::size_t& end) const;
  void* new_match_data() const;
  static void free_match_data(void* match_data);

  void* code_ = nullptr;  // pcre2_code_8
};

template <typename F>
void RegexSplitter::split(std::string_view text, F&& piece) const {
  std::unique_ptr<void, void (*)(void*)> data(new_match_data(), &RegexSplitter::free_match_data);
  std::size_t gap = 0, search = 0, begin = 0, end = 0;
  while (search < text.size() && find(text, search, data.get(), begin, end)) {
    if (end == begin) {  // an empty match is no piece: search again from the next character
      search = begin + 1;
      while (search < text.size() && (static_cast<unsigned char>(text[search]) & 0xC0) == 0x80) ++search;
      continue;
    }
    if (begin > gap) piece(gap, begin);
    piece(begin, end);
    gap = search = end;
  }
  if (gap < text.size()) piece(gap, text.size());
}

}  // namespace nax::text
