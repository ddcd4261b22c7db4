#include "text/byte_level.h"

#include "text/utf8.h"

namespace nax::text {

ByteLevel::ByteLevel() {
  byte_of_code_point_.fill(-1);
  char32_t next_unprintable = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t cp = printable ? static_cast<char32_t>(b) : next_unprintable++;
    append_utf8(chars_[static_cast<std::size_t>(b)], cp);
    byte_of_code_point_[cp] = b;
  }
}

std::optional<std::string> ByteLevel::bytes_of(std::string_view token) const {
  std::string out;
  std::size_t i = 0;
  while (i < token.size()) {
    const char32_t cp = next_code_point(token, i);
    if (cp >= byte_of_code_point_.size() || byte_of_code_point_[cp] < 0) return std::nullopt;
    out += static_cast<char>(byte_of_code_point_[cp]);
  }
  return out;
}

const ByteLevel& byte_level() {
  static const ByteLevel map;
  return map;
}

}  // namespace nax::text
