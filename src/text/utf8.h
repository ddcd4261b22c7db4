#pragma once
// UTF-8 helpers of the tokenizer.
#include <string>
#include <string_view>

namespace nax::text {

// `bytes` with each maximal invalid subpart replaced by U+FFFD (Unicode's recommended practice,
// which Python's errors="replace" and Rust's String::from_utf8_lossy follow); valid text unchanged.
std::string to_valid_utf8(std::string_view bytes);
// Appends the UTF-8 encoding of code point `cp`.
void append_utf8(std::string& out, char32_t cp);
// The code point starting at text[i] (valid UTF-8), advancing i past it.
char32_t next_code_point(std::string_view text, std::size_t& i);

}  // namespace nax::text
