#include "nax/text/bpe_tokenizer.h"

#include "nax/core/error.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace nax::text {
namespace {

constexpr std::size_t cached_piece_bytes = 64;      // longer pieces are rare: not cached
constexpr std::size_t cache_entries = 1 << 18;      // then the cache starts afresh
constexpr std::size_t progress_every_bytes = 1 << 19;

void encode_piece(const BpeTokenizer::Impl& t, std::string_view piece, std::vector<std::int32_t>& out) {
  if (piece.size() > cached_piece_bytes) {
    t.model->encode(piece, out);
    return;
  }
  std::string key(piece);
  {
    std::lock_guard lock(t.cache_mutex);
    if (auto it = t.cache.find(key); it != t.cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t first = out.size();
  t.model->encode(piece, out);
  std::lock_guard lock(t.cache_mutex);
  if (t.cache.size() >= cache_entries) t.cache.clear();
  t.cache.emplace(std::move(key), std::vector<std::int32_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
}

// A stretch of text between added tokens: the ByteLevel pre-tokenizer, then BPE on each piece.
void encode_segment(const BpeTokenizer::Impl& t, std::string_view segment, std::size_t offset, std::vector<std::int32_t>& out,
                    const std::function<void(std::size_t)>& progress, std::size_t& reported) {
  std::string prefixed;
  std::size_t shift = 0;
  if (t.add_prefix_space && segment.front() != ' ') {
    prefixed.reserve(segment.size() + 1);
    prefixed += ' ';
    prefixed += segment;
    segment = prefixed;
    shift = 1;
  }
  if (!t.splitter) {
    encode_piece(t, segment, out);
    return;
  }
  t.splitter->split(segment, [&](std::size_t begin, std::size_t end) {
    encode_piece(t, segment.substr(begin, end - begin), out);
    const std::size_t done = offset + (end > shift ? end - shift : 0);
    if (progress && done >= reported + progress_every_bytes) {
      reported = done;
      progress(done);
    }
  });
}

// Splits `text` on the added tokens of matchers[level..], encoding what lies between.
void encode_level(const BpeTokenizer::Impl& t, std::string_view text, std::size_t offset, int level, std::vector<std::int32_t>& out,
                  const std::function<void(std::size_t)>& progress, std::size_t& reported) {
  if (text.empty()) return;
  if (level == 2) {
    encode_segment(t, text, offset, out, progress, reported);
    return;
  }
  const AddedTokenMatcher& matcher = level == 0 ? *t.raw_matcher : *t.normalized_matcher;
  std::size_t at = 0, begin = 0;
  const AddedToken* token = nullptr;
  while (matcher.find(text, at, begin, token)) {
    encode_level(t, text.substr(at, begin - at), offset + at, level + 1, out, progress, reported);
    out.push_back(token->id);
    at = begin + token->content.size();
  }
  encode_level(t, text.substr(at), offset + at, level + 1, out, progress, reported);
}

}  // namespace

BpeTokenizer BpeTokenizer::from_file(const std::string& path) {
  return BpeTokenizer(parse_tokenizer_json(read_text_file(path, "tokenizer", io::kTokenizerCaps), path));
}

BpeTokenizer BpeTokenizer::from_json(std::string_view json, const std::string& source) { return BpeTokenizer(parse_tokenizer_json(json, source)); }

std::vector<std::int32_t> BpeTokenizer::encode(std::string_view text) const { return encode(text, {}); }

std::vector<std::int32_t> BpeTokenizer::encode(std::string_view text, const std::function<void(std::size_t)>& progress) const {
  const std::string valid = to_valid_utf8(text);
  std::vector<std::int32_t> out;
  out.reserve(valid.size() / 3);
  std::size_t reported = 0;
  encode_level(*impl_, valid, 0, 0, out, progress, reported);
  if (progress) progress(text.size());
  return out;
}

std::string BpeTokenizer::decode_bytes(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  std::string out;
  for (std::int32_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= t.tokens.size() || !t.has_token[static_cast<std::size_t>(id)]) {
      fail("tokenizer decode", "id {} is not in the vocabulary of {} ({} ids)", id, t.source, t.tokens.size());
    }
    if (skip_special_tokens && t.special[static_cast<std::size_t>(id)]) continue;
    out += t.bytes[static_cast<std::size_t>(id)];
  }
  return out;
}

std::string BpeTokenizer::decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
  return to_valid_utf8(decode_bytes(ids, skip_special_tokens));
}

std::int64_t BpeTokenizer::vocab_size() const { return static_cast<std::int64_t>(impl_->tokens.size()); }

std::optional<std::int32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (auto it = impl_->added_ids.find(key); it != impl_->added_ids.end()) return it->second;
  if (auto it = impl_->model_ids.find(key); it != impl_->model_ids.end()) return it->second;
  return std::nullopt;
}

std::string BpeTokenizer::id_to_token(std::int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= impl_->tokens.size() || !impl_->has_token[static_cast<std::size_t>(id)]) {
    fail("tokenizer", "id {} is not in the vocabulary of {}", id, impl_->source);
  }
  return impl_->tokens[static_cast<std::size_t>(id)];
}

bool BpeTokenizer::is_special(std::int32_t id) const {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->special.size() && impl_->special[static_cast<std::size_t>(id)];
}

}  // namespace nax::text
