#pragma once
// Added tokens (e.g. <|endoftext|>) are found in the text before pre-tokenization: the leftmost
// occurrence, the longest there, as `tokenizers`' added vocabulary does.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nax::text {

struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool special = false;
  bool normalized = false;
};

class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(const std::vector<const AddedToken*>& tokens);
  bool empty() const { return count_ == 0; }
  // The leftmost-longest token in text[from..]: true with its offset, or false.
  bool find(std::string_view text, std::size_t from, std::size_t& begin, const AddedToken*& token) const;

 private:
  std::array<std::vector<const AddedToken*>, 256> by_first_byte_;  // longest first
  std::size_t count_ = 0;
};

}  // namespace nax::text
