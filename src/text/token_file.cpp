#include "nax/text/token_file.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "nax/io/files.h"
#include "nax/core/error.h"
#include "nax/io/read_file.h"
#include "text/tokenizer_impl.h"

namespace nax::text {
namespace {

constexpr char magic[8] = {'N', 'A', 'X', 'T', 'O', 'K', 'S', '1'};
constexpr std::size_t header_bytes = 8 + 4 + 4 + 8 + 8 + 8;

// FNV-1a, 64 bits: a cache key, not a checksum against malice.
std::uint64_t fnv1a(std::string_view bytes, std::uint64_t h = 1469598103934665603ull) {
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

template <typename T>
void put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(bytes, sizeof(T));
}

template <typename T>
T get(const std::string& in, std::size_t& at) {
  T value;
  std::memcpy(&value, in.data() + at, sizeof(T));
  at += sizeof(T);
  return value;
}

}  // namespace

std::string read_text_file(const std::string& path, std::string_view what, const io::FileCaps& caps) {
  try {
    return io::read_file(path, caps);
  } catch (const Error& e) {
    std::string_view message = e.what();
    if (message.starts_with("read_file: ")) message.remove_prefix(11);  // `what` names the op instead
    fail(what, "{}", message);
  }
}

void write_token_file(const std::string& path, const std::vector<std::int32_t>& tokens, std::int64_t vocab_size, std::uint64_t key) {
  const std::uint32_t width = vocab_size <= 65536 ? 2 : 4;
  std::string out;
  out.reserve(header_bytes + tokens.size() * width);
  out.append(magic, sizeof magic);
  put<std::uint32_t>(out, width);
  put<std::uint32_t>(out, 0);
  put<std::uint64_t>(out, tokens.size());
  put<std::uint64_t>(out, static_cast<std::uint64_t>(vocab_size));
  put<std::uint64_t>(out, key);
  for (std::int32_t t : tokens) {
    if (t < 0 || t >= vocab_size) fail("token file", "token {} is outside the vocabulary ({} ids) for '{}'", t, vocab_size, path);
    if (width == 2) {
      put<std::uint16_t>(out, static_cast<std::uint16_t>(t));
    } else {
      put<std::uint32_t>(out, static_cast<std::uint32_t>(t));
    }
  }
  // Atomic: readers see the old file or the whole new one, never a part.
  io::write_file_atomically(path, out);
}

TokenFile read_token_file(const std::string& path) {
  const std::string in = read_text_file(path, "token file", io::kTokenFileCaps);
  if (in.size() < header_bytes || std::memcmp(in.data(), magic, sizeof magic) != 0) fail("token file", "'{}' is not a nax token file", path);
  std::size_t at = sizeof magic;
  TokenFile f;
  f.bytes_per_token = static_cast<int>(get<std::uint32_t>(in, at));
  get<std::uint32_t>(in, at);
  const auto count = get<std::uint64_t>(in, at);
  const auto vocab = get<std::uint64_t>(in, at);
  f.key = get<std::uint64_t>(in, at);
  if (f.bytes_per_token != 2 && f.bytes_per_token != 4) fail("token file", "'{}': {} bytes per token (expected 2 or 4)", path, f.bytes_per_token);
  if (vocab == 0 || vocab > static_cast<std::uint64_t>(io::kMaxTokenIds))
    fail("token file", "'{}': vocabulary size {} outside [1, {}]", path, vocab, io::kMaxTokenIds);
  f.vocab_size = static_cast<std::int64_t>(vocab);
  const std::uint64_t payload = in.size() - header_bytes, width = static_cast<std::uint64_t>(f.bytes_per_token);
  if (payload % width != 0 || count != payload / width)  // a division: no count can overflow it
    fail("token file", "'{}' is truncated: {} bytes for {} tokens of {} bytes", path, in.size(), count, f.bytes_per_token);
  f.tokens.resize(count);
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::uint32_t t = f.bytes_per_token == 2 ? get<std::uint16_t>(in, at) : get<std::uint32_t>(in, at);
    if (t >= vocab) fail("token file", "'{}': token {} is {}, outside the vocabulary of {} ids", path, i, t, vocab);
    f.tokens[i] = static_cast<std::int32_t>(t);
  }
  return f;
}

std::uint64_t tokenizer_file_key(const std::string& tokenizer_path) { return fnv1a(read_text_file(tokenizer_path, "tokenizer", io::kTokenizerCaps)); }

std::vector<std::int32_t> tokenize_file(const BpeTokenizer& tokenizer, std::uint64_t tokenizer_key, const std::string& text_path,
                                        std::string cache_path, const TokenizeProgress& progress) {
  if (cache_path.empty()) cache_path = text_path + ".tokens";
  const std::string text = read_text_file(text_path, "tokenize", io::kTrainingTextCaps);
  const std::uint64_t key = fnv1a(text, tokenizer_key);
  if (std::filesystem::exists(cache_path)) {
    try {
      TokenFile cached = read_token_file(cache_path);
      if (cached.key == key && cached.vocab_size == tokenizer.vocab_size()) return std::move(cached.tokens);
    } catch (const Error&) {
      // a foreign or damaged cache is rewritten below
    }
  }
  std::uint64_t count = 0;
  auto tokens = tokenizer.encode(text, [&](std::size_t done) {
    if (progress && done < text.size()) progress(done, text.size(), count);
  });
  count = tokens.size();
  if (progress) progress(text.size(), text.size(), count);
  write_token_file(cache_path, tokens, tokenizer.vocab_size(), key);
  return tokens;
}

void print_tokenize_progress(std::uint64_t bytes_done, std::uint64_t bytes_total, std::uint64_t tokens) {
  const bool done = bytes_done >= bytes_total;
  fmt::print(stderr, "\rtokenize: {:.1f} of {:.1f} MB{}{}", bytes_done * 1e-6, bytes_total * 1e-6,
             done ? fmt::format(", {} tokens", tokens) : std::string(), done ? "\n" : "");
}

}  // namespace nax::text
