#pragma once
// GPT-2's byte-to-unicode map: every byte is shown as a printable character, so that BPE tokens are
// strings. The printable bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves,
// the other 68 for U+0100 onwards, in byte order.
#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace nax::text {

class ByteLevel {
 public:
  ByteLevel();
  // The character (UTF-8) that stands for byte b.
  const std::string& char_of(unsigned char b) const { return chars_[b]; }
  // The bytes a token's characters stand for, or nothing when one is not a byte-level character.
  std::optional<std::string> bytes_of(std::string_view token) const;

 private:
  std::array<std::string, 256> chars_;
  std::array<int, 512> byte_of_code_point_{};  // -1: not a byte-level character
};

const ByteLevel& byte_level();

}  // namespace nax::text
