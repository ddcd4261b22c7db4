// The byte-level BPE tokenizer (nax/text) against Hugging Face `tokenizers`: the ids and decodings
// in tests/fixtures/tokenizer/reference.json were made by scripts/make_tokenizer_fixtures.py.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nax/core/error.h>
#include <nax/text/bpe_tokenizer.h>
#include <nax/text/token_file.h>

#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

namespace {

using nax::text::BpeTokenizer;
using nlohmann::json;

const std::string fixtures = NAX_TOKENIZER_FIXTURES;

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

const json& reference() {
  static const json ref = json::parse(read(fixtures + "/reference.json"));
  return ref;
}

void check_against_reference(const std::string& name) {
  const auto tok = BpeTokenizer::from_file(fixtures + "/" + name + ".json");
  CHECK(tok.vocab_size() == reference()["vocab_size"].get<std::int64_t>());
  for (const auto& c : reference()[name]) {
    INFO(name << " case " << c["name"].get<std::string>());
    const std::string text = from_hex(c["bytes_hex"]);
    const auto ids = tok.encode(text);
    REQUIRE(ids == c["ids"].get<std::vector<std::int32_t>>());
    CHECK(tok.decode(ids) == from_hex(c["decoded_hex"]));
    CHECK(tok.decode(ids, /*skip_special_tokens=*/true) == from_hex(c["decoded_skip_special_hex"]));
    const auto each = c["each_decoded_hex"].get<std::vector<std::string>>();
    REQUIRE(each.size() == ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      INFO("id " << ids[i] << " at " << i);
      CHECK(tok.decode(std::vector<std::int32_t>{ids[i]}) == from_hex(each[i]));  // lossy: partial characters give U+FFFD
    }
  }
}

std::string fixture_json() { return read(fixtures + "/tokenizer.json"); }

// The fixture tokenizer's JSON with one edit, as text.
std::string edited(const std::function<void(json&)>& edit) {
  json j = json::parse(fixture_json());
  edit(j);
  return j.dump();
}

void require_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    FAIL("no error");
  } catch (const nax::Error& e) {
    const std::string message = e.what();
    INFO(message);
    for (const auto& p : parts) CHECK(message.find(p) != std::string::npos);
  }
}

std::string temp_dir() {
  auto dir = std::filesystem::temp_directory_path() / ("nax_tokenizer_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace

TEST_CASE("tokenizer: ids and decodings equal Hugging Face tokenizers'", "[tokenizer]") {
  check_against_reference("tokenizer");
}

TEST_CASE("tokenizer: with add_prefix_space, ids equal Hugging Face tokenizers'", "[tokenizer]") {
  check_against_reference("tokenizer_prefix");
}

TEST_CASE("tokenizer: decode_bytes(encode(text)) gives valid text back exactly", "[tokenizer]") {
  const auto tok = BpeTokenizer::from_file(fixtures + "/tokenizer.json");
  for (const auto& c : reference()["tokenizer"]) {
    const std::string text = from_hex(c["bytes_hex"]);
    const std::string back = tok.decode_bytes(tok.encode(text));
    if (c["name"] == "invalid_utf8" || c["name"] == "invalid_at_end") {
      CHECK(back != text);  // invalid UTF-8 was replaced by U+FFFD before encoding
      CHECK(back.find("\xEF\xBF\xBD") != std::string::npos);
    } else {
      CHECK(back == text);
    }
  }
  // Every single byte and a few longer texts of all kinds.
  for (int b = 0; b < 128; ++b) {
    const std::string s(1, static_cast<char>(b));
    CHECK(tok.decode_bytes(tok.encode(s)) == s);
  }
  const std::string mixed = "  Tabs\tand\r\nCRLF,  <|endoftext|><|endoftext|>x  \xF0\x9F\x98\x80\xF0\x9F\x98\x80 \xE4\xBD\xA0\xE5\xA5\xBD  42abc  ";
  CHECK(tok.decode_bytes(tok.encode(mixed)) == mixed);
  CHECK(tok.decode(tok.encode(mixed)) == mixed);
}

TEST_CASE("tokenizer: special and added tokens", "[tokenizer]") {
  const auto tok = BpeTokenizer::from_file(fixtures + "/tokenizer.json");
  const auto eot = tok.token_to_id("<|endoftext|>");
  REQUIRE(eot.has_value());
  CHECK(tok.is_special(*eot));
  const auto extra = tok.token_to_id("<|extratoken_1|>");
  REQUIRE(extra.has_value());
  CHECK_FALSE(tok.is_special(*extra));
  CHECK(tok.encode("<|endoftext|>") == std::vector<std::int32_t>{*eot});
  CHECK(tok.id_to_token(*eot) == "<|endoftext|>");
  CHECK(tok.decode(std::vector<std::int32_t>{*eot, *extra}, true) == "<|extratoken_1|>");
  CHECK_FALSE(tok.token_to_id("no such token").has_value());
}

// Added tokens decode as `tokenizers` 0.23.3 decodes them (checked there by hand): one whose
// characters are all byte-level ones ("ü" is byte 0xFC's) stands for those bytes, so "<|ü|>"
// decodes to invalid UTF-8, replaced; one with other characters stands for its own UTF-8.
TEST_CASE("tokenizer: added tokens with non-ASCII characters decode as tokenizers does", "[tokenizer]") {
  const auto tok = BpeTokenizer::from_json(edited([](json& j) {
    j["added_tokens"].push_back({{"id", 1001}, {"content", "<|\u00fc|>"}, {"special", false}, {"normalized", true}});
    j["added_tokens"].push_back({{"id", 1002}, {"content", "<|\u65e5\u672c|>"}, {"special", false}, {"normalized", true}});
    j["added_tokens"].push_back({{"id", 1003}, {"content", "[SP\u00c9CIAL]"}, {"special", true}, {"normalized", false}});
  }));
  CHECK(tok.vocab_size() == 1004);
  const auto a = tok.encode("a<|\u00fc|>b");
  CHECK(a == std::vector<std::int32_t>{65, 1001, 66});
  CHECK(tok.decode(a) == "a<|\xEF\xBF\xBD|>b");
  const auto x = tok.encode("x<|\u65e5\u672c|>y");
  CHECK(x == std::vector<std::int32_t>{88, 1002, 89});
  CHECK(tok.decode(x) == "x<|\u65e5\u672c|>y");
  const auto q = tok.encode("q[SP\u00c9CIAL]r");
  CHECK(q == std::vector<std::int32_t>{81, 1003, 82});
  CHECK(tok.decode(q) == "q[SP\xEF\xBF\xBD" "CIAL]r");
  CHECK(tok.decode(q, true) == "qr");
}

TEST_CASE("tokenizer: one tokenizer encodes from several threads at once", "[tokenizer]") {
  const auto tok = BpeTokenizer::from_file(fixtures + "/tokenizer.json");
  std::vector<std::string> texts;
  std::vector<std::vector<std::int32_t>> want;
  for (const auto& c : reference()["tokenizer"]) {
    texts.push_back(from_hex(c["bytes_hex"]));
    want.push_back(c["ids"].get<std::vector<std::int32_t>>());
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (std::size_t i = 0; i < texts.size(); ++i) mismatches[static_cast<std::size_t>(t)] += tok.encode(texts[i]) != want[i];
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches == std::vector<int>(4, 0));
}

TEST_CASE("tokenizer: bad files and fields are errors naming the file and the field", "[tokenizer]") {
  require_error([] { BpeTokenizer::from_file("/nonexistent/tokenizer.json"); }, {"/nonexistent/tokenizer.json", "cannot read"});
  require_error([] { BpeTokenizer::from_json("{\"model\": ", "bad.json"); }, {"bad.json", "not valid JSON"});
  require_error([] { BpeTokenizer::from_json("[1, 2]", "list.json"); }, {"list.json", "not a JSON object"});
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j["model"]["type"] = "WordPiece"; }), "t.json"); },
                {"t.json", "model.type", "WordPiece"});
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }), "t.json"); },
                {"t.json", "pre_tokenizer.type", "Whitespace"});
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j["normalizer"] = {{"type", "NFC"}}; }), "t.json"); },
                {"t.json", "normalizer.type", "NFC"});
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }), "t.json"); },
                {"t.json", "decoder.type"});
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j.erase("decoder"); }), "t.json"); }, {"t.json", "'decoder'", "missing"});
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j["post_processor"] = {{"type", "TemplateProcessing"}}; }), "t.json"); },
                {"t.json", "post_processor.type", "TemplateProcessing"});
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j["model"]["dropout"] = 0.1; }), "t.json"); }, {"t.json", "model.dropout"});
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j["model"]["byte_fallback"] = true; }), "t.json"); },
                {"t.json", "model.byte_fallback"});
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j["model"].erase("vocab"); }), "t.json"); }, {"t.json", "model.vocab"});
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j["model"]["merges"][5] = json::array({"zzqq", "x"}); }), "t.json"); },
                {"t.json", "model.merges[5]"});
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j["model"]["merges"][2] = 7; }), "t.json"); }, {"t.json", "model.merges[2]"});
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j["added_tokens"][0]["lstrip"] = true; }), "t.json"); },
                {"t.json", "added_tokens[0].lstrip"});
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j["truncation"] = {{"max_length", 8}}; }), "t.json"); },
                {"t.json", "truncation"});
  const auto tok = BpeTokenizer::from_file(fixtures + "/tokenizer.json");
  require_error([&] { tok.decode(std::vector<std::int32_t>{5, 100000}); }, {"decode", "100000"});
  require_error([&] { tok.decode(std::vector<std::int32_t>{-1}); }, {"decode", "-1"});
}

TEST_CASE("tokenizer: ids are checked before a table is made of them", "[tokenizer]") {
  auto token_with_id = [](json& j, std::int64_t id) {  // the vocabulary's token of id 5 given `id`
    for (auto& [token, value] : j["model"]["vocab"].items())
      if (value == 5) value = id;
  };
  for (std::int64_t id : {std::int64_t{2147483647}, std::int64_t{2147483646}, std::int64_t{16777216}, std::int64_t{-1}}) {
    INFO(id);
    require_error([&] { BpeTokenizer::from_json(edited([&](json& j) { token_with_id(j, id); }), "t.json"); },
                  {"t.json", "model.vocab", fmt::format("is {}, outside [0, 16777215]", id)});
  }
  // Below 2^24, but a table of ten million entries for 1001 tokens: refused, whichever command reads it.
  require_error([&] { BpeTokenizer::from_json(edited([&](json& j) { token_with_id(j, 10'000'000); }), "t.json"); },
                {"t.json", "is 10000000, but the file has only 1001 tokens: ids are expected below 3026"});
  CHECK(BpeTokenizer::from_json(edited([&](json& j) { token_with_id(j, 3025); })).vocab_size() == 3026);  // holes, within the cap
  require_error([&] { BpeTokenizer::from_json(edited([&](json& j) { token_with_id(j, 6); }), "t.json"); }, {"t.json", "is 6, the id of token"});
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j["added_tokens"][1]["id"] = 2147483647; }), "t.json"); },
                {"t.json", "added_tokens[1].id", "outside [0, 16777215]"});
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j["added_tokens"][1]["id"] = 7; }), "t.json"); },
                {"t.json", "added_tokens[1].id", "is 7, the id of token"});
  CHECK_NOTHROW(BpeTokenizer::from_json(edited([](json& j) { j["added_tokens"][0]["id"] = j["model"]["vocab"]["<|endoftext|>"]; })));
  require_error([] { BpeTokenizer::from_json(edited([](json& j) { j["added_tokens"][1]["content"] = std::string(300, 'x'); }), "t.json"); },
                {"t.json", "added_tokens[1].content", "has 300 bytes, more than the 256"});
  require_error([] { BpeTokenizer::from_json("{\"model\": {\"vocab\": {\"a\": 1, \"a\": 2}}}", "t.json"); }, {"t.json", "model.vocab.a", "given twice"});
}

TEST_CASE("tokenizer: added tokens sharing their first bytes are matched leftmost, then longest", "[tokenizer]") {
  const auto tok = BpeTokenizer::from_json(edited([](json& j) {
    for (int i = 0; i < 3000; ++i)  // many tokens on one path of the trie
      j["added_tokens"].push_back({{"id", 1001 + i}, {"content", fmt::format("<|t{}|>", i)}, {"special", true}, {"normalized", false}});
    j["added_tokens"].push_back({{"id", 4001}, {"content", "<|t1|>x"}, {"special", true}, {"normalized", false}});
  }));
  CHECK(tok.encode("<|t12|>") == std::vector<std::int32_t>{1013});
  CHECK(tok.encode("<|t1|>x<|t1|>") == std::vector<std::int32_t>{4001, 1002});
  CHECK(tok.encode("<|t2999|><|t").front() == 4000);
}

TEST_CASE("tokenizer: merges written as \"left right\" strings (tokenizers before 0.20) read the same", "[tokenizer]") {
  const std::string old_style = edited([](json& j) {
    for (auto& m : j["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  });
  const auto a = BpeTokenizer::from_file(fixtures + "/tokenizer.json");
  const auto b = BpeTokenizer::from_json(old_style);
  for (const auto& c : reference()["tokenizer"]) CHECK(b.encode(from_hex(c["bytes_hex"])) == c["ids"].get<std::vector<std::int32_t>>());
  CHECK(a.vocab_size() == b.vocab_size());
}

TEST_CASE("token files: uint16 and uint32 round trips, atomic writes, refusals", "[tokenizer]") {
  const std::string dir = temp_dir();
  const std::vector<std::int32_t> small{0, 1, 999, 65535, 7};
  nax::text::write_token_file(dir + "/small.tokens", small, 65536, 42);
  auto f = nax::text::read_token_file(dir + "/small.tokens");
  CHECK(f.bytes_per_token == 2);
  CHECK(f.tokens == small);
  CHECK(f.key == 42);
  CHECK(std::filesystem::file_size(dir + "/small.tokens") == 40 + 2 * small.size());
  const std::vector<std::int32_t> large{0, 65536, 50399, 100000};
  nax::text::write_token_file(dir + "/large.tokens", large, 100001, 7);
  f = nax::text::read_token_file(dir + "/large.tokens");
  CHECK(f.bytes_per_token == 4);
  CHECK(f.tokens == large);
  CHECK(f.vocab_size == 100001);
  for (const auto& entry : std::filesystem::directory_iterator(dir)) CHECK(entry.path().string().find(".tmp") == std::string::npos);

  require_error([&] { nax::text::write_token_file(dir + "/bad.tokens", {3, 70000}, 65536, 0); }, {"70000", "bad.tokens"});
  std::filesystem::resize_file(dir + "/large.tokens", 40 + 4 * 3);
  require_error([&] { nax::text::read_token_file(dir + "/large.tokens"); }, {"large.tokens", "truncated"});
  require_error([&] { nax::text::read_token_file(fixtures + "/tokenizer.json"); }, {"tokenizer.json", "not a nax token file"});
  require_error([&] { nax::text::read_token_file(dir + "/missing.tokens"); }, {"missing.tokens", "cannot read"});
  // Forged headers: a count whose bytes overflow, a token beyond the vocabulary, a vocabulary of 0.
  auto forged = [&](std::size_t at, std::uint64_t value) {  // a fresh file with one u64 of its header replaced
    nax::text::write_token_file(dir + "/f.tokens", small, 65536, 42);
    std::fstream f(dir + "/f.tokens", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(reinterpret_cast<const char*>(&value), sizeof value);
  };
  forged(16, std::uint64_t{1} << 63);  // the count: 2^63 tokens of 2 bytes would overflow to 0
  require_error([&] { nax::text::read_token_file(dir + "/f.tokens"); }, {"f.tokens", "truncated"});
  forged(24, 1000);  // the vocabulary, below token 3 = 65535
  require_error([&] { nax::text::read_token_file(dir + "/f.tokens"); }, {"f.tokens", "token 3 is 65535, outside the vocabulary of 1000 ids"});
  forged(24, 0);
  require_error([&] { nax::text::read_token_file(dir + "/f.tokens"); }, {"f.tokens", "vocabulary size 0"});
  std::filesystem::remove_all(dir);
}

TEST_CASE("token files: tokenize_file writes the cache once and rewrites it when the text changes", "[tokenizer]") {
  const std::string dir = temp_dir();
  const std::string tokenizer_path = fixtures + "/tokenizer.json";
  const auto tok = BpeTokenizer::from_file(tokenizer_path);
  const auto key = nax::text::tokenizer_file_key(tokenizer_path);
  std::string text;
  for (const auto& c : reference()["tokenizer"]) text += from_hex(c["bytes_hex"]) + "\n";
  for (int i = 0; i < 9; ++i) text += text;  // ~600 KB: at least one progress report
  { std::ofstream(dir + "/train.txt", std::ios::binary) << text; }
  int reports = 0;
  const auto first = nax::text::tokenize_file(tok, key, dir + "/train.txt", "", [&](std::uint64_t, std::uint64_t total, std::uint64_t) {
    CHECK(total == text.size());
    ++reports;
  });
  CHECK(first == tok.encode(text));
  CHECK(reports >= 2);
  REQUIRE(std::filesystem::exists(dir + "/train.txt.tokens"));
  CHECK(nax::text::read_token_file(dir + "/train.txt.tokens").tokens == first);
  reports = 0;
  const auto second = nax::text::tokenize_file(tok, key, dir + "/train.txt", "", [&](std::uint64_t, std::uint64_t, std::uint64_t) { ++reports; });
  CHECK(second == first);
  CHECK(reports == 0);  // read from the cache
  { std::ofstream(dir + "/train.txt", std::ios::binary) << "a different text"; }
  const auto third = nax::text::tokenize_file(tok, key, dir + "/train.txt");
  CHECK(third == tok.encode("a different text"));
  CHECK(nax::text::read_token_file(dir + "/train.txt.tokens").tokens == third);
  std::filesystem::remove_all(dir);
}

// GPT-2's own tokenizer.json, where one is on this machine (nothing is downloaded): set
// NAX_GPT2_TOKENIZER to its path.
TEST_CASE("tokenizer: GPT-2's tokenizer.json, where available", "[tokenizer]") {
  const char* path = std::getenv("NAX_GPT2_TOKENIZER");
  if (path == nullptr || !std::filesystem::exists(path)) {
    WARN("skipped: set NAX_GPT2_TOKENIZER to GPT-2's tokenizer.json to check it");
    return;
  }
  const auto tok = BpeTokenizer::from_file(path);
  CHECK(tok.vocab_size() == 50257);
  CHECK(tok.encode("Hello world") == std::vector<std::int32_t>{15496, 995});
  CHECK(tok.encode("<|endoftext|>") == std::vector<std::int32_t>{50256});
  const std::string text = "It's 2026: caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80   spaces\n\n";
  CHECK(tok.decode(tok.encode(text)) == text);
}
