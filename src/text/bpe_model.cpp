#include "text/bpe_model.h"

#include <queue>

#include "nax/core/error.h"
#include "text/byte_level.h"

namespace nax::text {

BpeModel::BpeModel(const std::unordered_map<std::string, std::int32_t>& vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   Options options, const std::string& where)
    : vocab_(vocab), options_(options) {
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_level().char_of(static_cast<unsigned char>(b)));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
  merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto l = vocab_.find(left), r = vocab_.find(right), m = vocab_.find(left + right);
    if (l == vocab_.end() || r == vocab_.end() || m == vocab_.end()) {
      fail(where, "field 'model.merges[{}]': merge \"{} {}\" uses or makes a token missing from 'model.vocab'", rank, left, right);
    }
    // A repeated merge takes its last rank, as in `tokenizers` (a map built in order).
    merges_.insert_or_assign(pair_key(l->second, r->second), Merge{static_cast<std::int32_t>(rank), m->second});
  }
}

const BpeModel::Merge* BpeModel::find_merge(std::int32_t left, std::int32_t right) const {
  auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::encode(std::string_view piece, std::vector<std::int32_t>& out) const {
  if (options_.ignore_merges) {
    std::string chars;
    for (char c : piece) chars += byte_level().char_of(static_cast<unsigned char>(c));
    if (auto it = vocab_.find(chars); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Symbols in a doubly linked list over the piece's bytes.
  struct Symbol {
    std::int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  bool last_unknown = false;
  for (char c : piece) {
    std::int32_t id = byte_ids_[static_cast<unsigned char>(c)];
    if (id < 0) {
      if (!options_.unk_id || (options_.fuse_unk && last_unknown)) continue;
      id = *options_.unk_id;
      last_unknown = true;
    } else {
      last_unknown = false;
    }
    const int i = static_cast<int>(symbols.size());
    symbols.push_back({id, i - 1, i + 1, true});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  // Candidate merges by (rank, position); stale ones are skipped when popped.
  struct Candidate {
    std::int32_t rank, pos, result;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push = [&](int pos) {
    const int next = symbols[static_cast<std::size_t>(pos)].next;
    if (next < 0) return;
    if (const Merge* m = find_merge(symbols[static_cast<std::size_t>(pos)].id, symbols[static_cast<std::size_t>(next)].id)) {
      queue.push({m->rank, pos, m->result});
    }
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<std::size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<std::size_t>(left.next)];
    const Merge* m = find_merge(left.id, right.id);
    if (m == nullptr || m->result != top.result) continue;  // this pair changed since it was queued
    left.id = m->result;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<std::size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.alive) out.push_back(s.id);
  }
}

}  // namespace nax::text
