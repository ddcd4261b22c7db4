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

// A trie of the tokens' bytes: finding a token costs at most the longest token's length per
// position of the text, however many tokens share their first bytes.
class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(const std::vector<const AddedToken*>& tokens);
  bool empty() const { return count_ == 0; }
  // The leftmost-longest token in text[from..]: true with its offset, or false.
  bool find(std::string_view text, std::size_t from, std::size_t& begin, const AddedToken*& token) const;

 private:
  struct Node {
    std::int32_t child = -1, sibling = -1;  // the first node one byte longer; the next with the same parent
    unsigned char byte = 0;
    const AddedToken* token = nullptr;  // the token that ends here, if any
  };
  std::int32_t child_of(std::int32_t node, unsigned char byte) const;
  std::int32_t add_child(std::int32_t node, unsigned char byte);

  std::array<std::int32_t, 256> first_{};  // the node of each first byte, or -1
  std::vector<Node> nodes_;
  std::size_t count_ = 0;
};

}  // namespace nax::text
