#include "text/added_tokens.h"

#include <algorithm>

namespace nax::text {

AddedTokenMatcher::AddedTokenMatcher(const std::vector<const AddedToken*>& tokens) {
  for (const AddedToken* t : tokens) {
    if (t->content.empty()) continue;
    by_first_byte_[static_cast<unsigned char>(t->content[0])].push_back(t);
    ++count_;
  }
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
  }
}

bool AddedTokenMatcher::find(std::string_view text, std::size_t from, std::size_t& begin, const AddedToken*& token) const {
  if (count_ == 0) return false;
  for (std::size_t p = from; p < text.size(); ++p) {
    for (const AddedToken* t : by_first_byte_[static_cast<unsigned char>(text[p])]) {
      if (text.compare(p, t->content.size(), t->content) == 0) {
        begin = p;
        token = t;
        return true;
      }
    }
  }
  return false;
}

}  // namespace nax::text
