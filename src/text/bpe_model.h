#pragma once
// The BPE model of a byte-level tokenizer: a piece's bytes start as one symbol each (the token of
// the byte's character), then the adjacent pair of lowest merge rank is merged, leftmost first,
// until no pair has a merge: the algorithm and tie-breaking of `tokenizers`' BPE.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nax::text {

class BpeModel {
 public:
  struct Options {
    std::optional<std::int32_t> unk_id;  // for bytes whose character is not in the vocabulary (else dropped)
    bool fuse_unk = false;               // consecutive unknown bytes give one unk_id
    bool ignore_merges = false;          // a piece that is a token is that token, merges or not
  };
  // `vocab`: token (byte-level characters) -> id; `merges` in rank order. A merge whose parts or
  // result are not tokens is an error naming `where`.
  BpeModel(const std::unordered_map<std::string, std::int32_t>& vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           Options options, const std::string& where);

  // Appends the ids of `piece` (raw bytes) to `out`.
  void encode(std::string_view piece, std::vector<std::int32_t>& out) const;

 private:
  struct Merge {
    std::int32_t rank;
    std::int32_t result;
  };
  static std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }
  const Merge* find_merge(std::int32_t left, std::int32_t right) const;

  std::unordered_map<std::string, std::int32_t> vocab_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::int32_t byte_ids_[256];  // -1: the byte's character is not a token
  Options options_;
};

}  // namespace nax::text
