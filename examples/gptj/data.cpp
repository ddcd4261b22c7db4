#include "data.h"

#include <fmt/format.h>
#include <nax/io/read_file.h>

#include <nax/text/token_file.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace gptj {

std::vector<std::int32_t> encode(const std::string& text) {
  std::vector<std::int32_t> out;
  out.reserve(text.size());
  for (unsigned char c : text) out.push_back(c);
  return out;
}

std::string decode(const std::vector<std::int32_t>& tokens) {
  std::string out;
  for (auto t : tokens) out.push_back(static_cast<char>(t >= 0 && t < 256 ? t : '?'));
  return out;
}

namespace {

// The text, its tokens (4 bytes each) and their split into training and held-out copies are in
// memory together, about 9 bytes per byte of text: a corpus that cannot fit is refused before it is read.
void check_text_fits(const std::vector<std::string>& files) {
  std::uint64_t bytes = 0;
  for (const auto& path : files) {
    std::error_code ec;
    const auto n = std::filesystem::file_size(path, ec);
    if (!ec) bytes += n;
  }
  const double need = 9.0 * static_cast<double>(bytes), have = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  if (need > have)
    nax::fail("data", "--data: {} bytes of text need about {:.1f} GB in memory as tokens, more than this machine's {:.1f} GB", bytes, need * 1e-9,
              have * 1e-9);
}

}  // namespace

TextData TextData::load(const std::vector<std::string>& files, double heldout_fraction) {
  if (files.empty()) nax::fail("data", "no text files given (--data FILE...)");
  check_text_fits(files);
  std::string text;
  for (const auto& path : files) {
    std::string contents;
    try {
      contents = nax::io::read_file(path, nax::io::kTrainingTextCaps);  // regular files only: a folder or a FIFO is refused
    } catch (const nax::Error& e) {
      nax::fail("data", "{}", e.what());
    }
    if (contents.empty()) nax::fail("data", "--data '{}' is empty", path);
    text += contents;
    text += '\n';
  }
  return from_text(text, heldout_fraction);
}

TextData TextData::from_text(const std::string& text, double heldout_fraction) { return from_tokens(encode(text), 256, heldout_fraction); }

TextData TextData::load_tokenized(const std::vector<std::string>& files, const std::string& tokenizer_path, const std::string& cache_dir,
                                  bool quiet, double heldout_fraction) {
  if (files.empty()) nax::fail("data", "no text files given (--data FILE...)");
  check_text_fits(files);
  const auto tokenizer = nax::text::BpeTokenizer::from_file(tokenizer_path);
  const auto key = nax::text::tokenizer_file_key(tokenizer_path);
  const auto end_of_text = tokenizer.token_to_id("<|endoftext|>");
  std::vector<std::int32_t> tokens;
  for (const auto& path : files) {
    if (!std::filesystem::is_regular_file(path)) nax::fail("data", "cannot read '{}'", path);
    std::string cache;
    if (!cache_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(cache_dir, ec);
      if (ec || !std::filesystem::is_directory(cache_dir)) nax::fail("data", "--token-cache: cannot create folder '{}': {}", cache_dir, ec ? ec.message() : "not a folder");
      cache = (std::filesystem::path(cache_dir) / (std::filesystem::path(path).filename().string() + ".tokens")).string();
    }
    const auto file_tokens = nax::text::tokenize_file(tokenizer, key, path, cache, quiet ? nax::text::TokenizeProgress{} : nax::text::print_tokenize_progress);
    if (!tokens.empty() && end_of_text) tokens.push_back(*end_of_text);
    tokens.insert(tokens.end(), file_tokens.begin(), file_tokens.end());
  }
  return from_tokens(tokens, tokenizer.vocab_size(), heldout_fraction);
}

TextData TextData::from_tokens(const std::vector<std::int32_t>& tokens, std::int64_t vocab, double heldout_fraction) {
  TextData d;
  d.vocab_ = vocab;
  const auto heldout = static_cast<std::size_t>(static_cast<double>(tokens.size()) * heldout_fraction);
  d.train_.assign(tokens.begin(), tokens.end() - static_cast<std::ptrdiff_t>(heldout));
  d.heldout_.assign(tokens.end() - static_cast<std::ptrdiff_t>(heldout), tokens.end());
  return d;
}

std::pair<nax::Tensor, nax::Tensor> TextData::batch(Split split, std::int64_t index, std::int64_t batch, std::int64_t seq,
                                                    std::uint64_t seed) const {
  const auto& tokens = split == Split::train ? train_ : heldout_;
  const auto window = static_cast<std::size_t>(seq + 1);
  if (tokens.size() < window)
    nax::fail("data", "the {} split has {} tokens, fewer than seq + 1 = {} (give more text or a shorter --seq)",
              split == Split::train ? "training" : "held-out", tokens.size(), window);
  const auto key = nax::rng::make_key(seed, split == Split::train ? "data.train" : "data.heldout");
  std::vector<std::int32_t> inputs, targets;
  for (std::int64_t b = 0; b < batch; ++b) {
    std::uint32_t words[4];
    nax::rng::philox(key, static_cast<std::uint64_t>(index * batch + b), words);
    const std::uint64_t r = (static_cast<std::uint64_t>(words[0]) << 32) | words[1];
    const std::size_t start = r % (tokens.size() - window + 1);
    inputs.insert(inputs.end(), tokens.begin() + static_cast<std::ptrdiff_t>(start), tokens.begin() + static_cast<std::ptrdiff_t>(start + window - 1));
    targets.insert(targets.end(), tokens.begin() + static_cast<std::ptrdiff_t>(start + 1), tokens.begin() + static_cast<std::ptrdiff_t>(start + window));
  }
  const nax::Shape shape{{"batch", batch}, {"seq", seq}};
  return {nax::from_vector(shape, inputs), nax::from_vector(shape, targets)};
}

}  // namespace gptj
