#include "text/added_tokens.h"

namespace nax::text {

AddedTokenMatcher::AddedTokenMatcher(const std::vector<const AddedToken*>& tokens) {
  first_.fill(-1);
  for (const AddedToken* t : tokens) {
    if (t->content.empty()) continue;
    const auto head = static_cast<unsigned char>(t->content[0]);
    if (first_[head] < 0) {
      first_[head] = static_cast<std::int32_t>(nodes_.size());
      nodes_.push_back({-1, -1, head, nullptr});
    }
    std::int32_t node = first_[head];
    for (std::size_t i = 1; i < t->content.size(); ++i) {
      const auto byte = static_cast<unsigned char>(t->content[i]);
      const std::int32_t next = child_of(node, byte);
      node = next >= 0 ? next : add_child(node, byte);
    }
    if (nodes_[static_cast<std::size_t>(node)].token == nullptr) nodes_[static_cast<std::size_t>(node)].token = t;  // the first of equal tokens
    ++count_;
  }
}

std::int32_t AddedTokenMatcher::child_of(std::int32_t node, unsigned char byte) const {
  for (std::int32_t c = nodes_[static_cast<std::size_t>(node)].child; c >= 0; c = nodes_[static_cast<std::size_t>(c)].sibling)
    if (nodes_[static_cast<std::size_t>(c)].byte == byte) return c;
  return -1;
}

std::int32_t AddedTokenMatcher::add_child(std::int32_t node, unsigned char byte) {
  const auto index = static_cast<std::int32_t>(nodes_.size());
  nodes_.push_back({-1, nodes_[static_cast<std::size_t>(node)].child, byte, nullptr});
  nodes_[static_cast<std::size_t>(node)].child = index;
  return index;
}

bool AddedTokenMatcher::find(std::string_view text, std::size_t from, std::size_t& begin, const AddedToken*& token) const {
  if (count_ == 0) return false;
  for (std::size_t p = from; p < text.size(); ++p) {
    const AddedToken* longest = nullptr;
    for (std::int32_t node = first_[static_cast<unsigned char>(text[p])], q = 0; node >= 0;) {
      if (nodes_[static_cast<std::size_t>(node)].token != nullptr) longest = nodes_[static_cast<std::size_t>(node)].token;
      if (p + static_cast<std::size_t>(++q) >= text.size()) break;
      node = child_of(node, static_cast<unsigned char>(text[p + static_cast<std::size_t>(q)]));
    }
    if (longest != nullptr) {
      begin = p;
      token = longest;
      return true;
    }
  }
  return false;
}

}  // namespace nax::text
