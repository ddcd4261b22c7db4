// bench_tokenizer: encode and decode throughput of nax::text::BpeTokenizer in MB of text per second,
// one thread. The text: --text FILE, or by default this repository's own docs and sources (English
// and C++, what a code model trains on) repeated up to --mb megabytes. Encoding is timed on a fresh
// tokenizer (cold: its piece cache empty) and then again (warm); the median of --reps runs each.
//
//   build/bin/bench_tokenizer [--tokenizer tests/fixtures/tokenizer/tokenizer.json] [--text FILE]
//                             [--mb 4] [--reps 3] [--json FILE]
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nax/text/bpe_tokenizer.h>
#include <sstream>

#include "bench_util.h"

namespace {

struct Options {
  std::string tokenizer = NAX_SOURCE_DIR "/tests/fixtures/tokenizer/tokenizer.json";
  std::string text;
  std::int64_t mb = 4;
  int reps = 3;
  std::string json;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--tokenizer") o.tokenizer = bench::flag_value(argc, argv, i);
    else if (arg == "--text") o.text = bench::flag_value(argc, argv, i);
    else if (arg == "--mb") o.mb = bench::parse_integer(bench::flag_value(argc, argv, i), arg);
    else if (arg == "--reps") o.reps = static_cast<int>(bench::parse_integer(bench::flag_value(argc, argv, i), arg));
    else if (arg == "--json") o.json = bench::flag_value(argc, argv, i);
    else nax::fail("bench_tokenizer", "unknown argument '{}' (usage: see the file's first lines)", arg);
  }
  if (o.mb < 1 || o.reps < 1) nax::fail("bench_tokenizer", "--mb and --reps must be positive");
  return o;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) nax::fail("bench_tokenizer", "cannot read '{}'", path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The repository's Markdown and C++ files, in a fixed order.
std::string repository_text() {
  std::vector<std::filesystem::path> files;
  for (const char* dir : {"docs", "src", "include", "examples", "tests"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(std::filesystem::path(NAX_SOURCE_DIR) / dir)) {
      const auto ext = e.path().extension();
      if (e.is_regular_file() && (ext == ".md" || ext == ".cpp" || ext == ".h")) files.push_back(e.path());
    }
  }
  files.push_back(std::filesystem::path(NAX_SOURCE_DIR) / "README.md");
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) text += read_file(f);
  return text;
}

std::string bench_text(const Options& o) {
  const std::string source = o.text.empty() ? repository_text() : read_file(o.text);
  if (source.empty()) nax::fail("bench_tokenizer", "the text is empty");
  const std::size_t bytes = static_cast<std::size_t>(o.mb) << 20;
  std::string text;
  text.reserve(bytes + source.size());
  while (text.size() < bytes) text += source;
  text.resize(bytes);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const std::string text = bench_text(o);
    const double mb = static_cast<double>(text.size()) * 1e-6;
    std::vector<double> cold, warm, decode;
    std::size_t count = 0;
    for (int r = 0; r < o.reps; ++r) {
      const auto tokenizer = nax::text::BpeTokenizer::from_file(o.tokenizer);
      std::vector<std::int32_t> ids;
      cold.push_back(bench::seconds_of([&] { ids = tokenizer.encode(text); }));
      warm.push_back(bench::seconds_of([&] { ids = tokenizer.encode(text); }));
      std::string back;
      decode.push_back(bench::seconds_of([&] { back = tokenizer.decode(ids); }));
      count = ids.size();
    }
    const double cold_mbs = mb / bench::median(cold), warm_mbs = mb / bench::median(warm), decode_mbs = mb / bench::median(decode);
    fmt::print("bench_tokenizer: {:.1f} MB of {}, {} tokens ({:.2f} bytes/token), tokenizer {}\n", mb,
               o.text.empty() ? "this repository's docs and sources" : o.text, count, static_cast<double>(text.size()) / count, o.tokenizer);
    fmt::print("  encode, cold cache  {:8.1f} MB/s\n  encode, warm cache  {:8.1f} MB/s\n  decode              {:8.1f} MB/s\n", cold_mbs,
               warm_mbs, decode_mbs);
    if (!o.json.empty()) {
      bench::JsonObject j;
      j.add("bench", "tokenizer").add("mb", mb).add("tokens", static_cast<std::int64_t>(count)).add("encode_cold_mb_per_s", cold_mbs);
      j.add("encode_warm_mb_per_s", warm_mbs).add("decode_mb_per_s", decode_mbs).add("tokenizer", o.tokenizer);
      bench::write_text_file(o.json, j.str() + "\n");
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
