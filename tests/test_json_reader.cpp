// nax/io/json.h: the one JSON reader, against hand-written documents whose refusals are known:
// each cap (bytes, depth, values) at and past its edge, duplicate keys, invalid UTF-8, numbers past
// a double, text after the value, and every error naming the file and the JSON path.
#include <catch2/catch.hpp>
#include <nax/core/error.h>
#include <nax/io/json.h>
#include <nax/io/output_path.h>
#include <nax/io/read_file.h>

#include <string>

#include "files.h"

namespace {

using Catch::Contains;
using nax::io::FileCaps;
using nax::io::JsonValue;
using nax::io::parse_json;

constexpr FileCaps kSmall{"test file", 1000, 4, 20};

std::string nested(std::size_t n, const std::string& open, const std::string& leaf, const std::string& close) {
  std::string text;
  for (std::size_t i = 0; i < n; ++i) text += open;
  text += leaf;
  for (std::size_t i = 0; i < n; ++i) text += close;
  return text;
}

JsonValue parse(const std::string& text, const FileCaps& caps = kSmall) { return parse_json(text, "f.json", caps, "test"); }

}  // namespace

TEST_CASE("json: values and their paths", "[unit][json]") {
  const JsonValue root = parse(R"({"a": {"b c": [1, -2, 3.5]}, "n": null, "s": "x", "t": true})");
  const JsonValue list = root.at("a").at("b c");
  REQUIRE(list.path() == "a[\"b c\"]");
  REQUIRE(list.size() == 3);
  REQUIRE(list.at(std::size_t{1}).integer(-5, 5) == -2);
  REQUIRE(list.at(std::size_t{2}).path() == "a[\"b c\"][2]");
  REQUIRE(list.at(std::size_t{2}).number(0, 4) == 3.5);
  REQUIRE(root.at("s").string() == "x");
  REQUIRE(root.at("t").boolean());
  REQUIRE(root.find("n"));
  REQUIRE(!root.given("n"));
  REQUIRE(!root.find("zz"));
  REQUIRE_THROWS_WITH(root.at("zz"), Contains("test: 'f.json': field 'zz' is missing"));
  REQUIRE_THROWS_WITH(list.at(std::size_t{2}).integer(0, 9), Contains("field 'a[\"b c\"][2]' is 3.5, not an integer"));
  REQUIRE_THROWS_WITH(list.at(std::size_t{0}).integer(2, 9), Contains("is 1, outside [2, 9]"));
  REQUIRE_THROWS_WITH(root.at("s").integer(0, 9), Contains("field 's' is \"x\", not an integer"));
  REQUIRE_THROWS_WITH(root.at("a").string(), Contains("field 'a' is an object, not a string"));
  REQUIRE_THROWS_WITH(root.at("s").at("k"), Contains("field 's' is \"x\", not an object"));
  REQUIRE_THROWS_WITH(parse("[1]").at("k"), Contains("'f.json' is an array, not an object"));
}

TEST_CASE("json: integers at the edges of their types", "[unit][json]") {
  // The parser keeps every non-negative integer unsigned: 0 must still meet a lower bound of 1.
  REQUIRE_THROWS_WITH(parse("0").integer(1, 5), Contains("is 0, outside [1, 5]"));
  REQUIRE(parse("9223372036854775807").integer(0, INT64_MAX) == INT64_MAX);
  REQUIRE_THROWS_WITH(parse("9223372036854775808").integer(0, INT64_MAX), Contains("outside"));
  REQUIRE_THROWS_WITH(parse("18446744073709551615").integer(-1, 5), Contains("outside"));
  REQUIRE_THROWS_WITH(parse("18446744073709551616").integer(0, 5), Contains("not an integer"));  // past u64: a double
  REQUIRE(parse("-9223372036854775808").integer(INT64_MIN, 0) == INT64_MIN);
  REQUIRE_THROWS_WITH(parse("5").integer(-10, -1), Contains("outside [-10, -1]"));
  REQUIRE_THROWS_WITH(parse("1e400"), Contains("'f.json' is not valid JSON") && Contains("number overflow"));
  REQUIRE_THROWS_WITH(parse("-1e400"), Contains("number overflow"));
  REQUIRE(parse("1e308").number(0, 1e308) == 1e308);
}

TEST_CASE("json: the caps, each at its edge and past it", "[unit][json]") {
  REQUIRE_NOTHROW(parse(nested(4, "[", "1", "]")));
  REQUIRE_THROWS_WITH(parse(nested(5, "[", "1", "]")),
                      Contains("'f.json': the JSON nests deeper than 4 levels, the cap for a test file (at '[0][0][0][0]')"));
  REQUIRE_THROWS_WITH(parse(nested(5, "{\"k\":", "1", "}")), Contains("nests deeper than 4 levels") && Contains("at 'k.k.k.k'"));
  const FileCaps deep_ok{"test file", 10'000'000, 200'000, 1'000'000};
  for (const auto& [open, close] : {std::pair{"[", "]"}, std::pair{"{\"a\":", "}"}}) {
    REQUIRE_NOTHROW(parse(nested(100'000, open, "1", close), deep_ok));  // no recursion: the stack does not care
    REQUIRE_THROWS_WITH(parse(nested(100'000, open, "1", close), nax::io::kModelConfigCaps), Contains("nests deeper than 16 levels"));
  }
  std::string twenty = "[";
  for (int i = 0; i < 19; ++i) twenty += i ? ",0" : "0";
  REQUIRE_NOTHROW(parse(twenty + "]"));  // 19 numbers and the array: 20 values
  REQUIRE_THROWS_WITH(parse(twenty + ",0]"), Contains("holds more than 20 JSON values, the cap for a test file"));
  REQUIRE_THROWS_WITH(parse("\"" + std::string(1000, 'x') + "\""), Contains("has 1002 bytes, over the cap of 1000 bytes for a test file"));
}

TEST_CASE("json: what parsers otherwise accept or resolve silently", "[unit][json]") {
  REQUIRE_THROWS_WITH(parse(R"({"a": 1, "b": {"c": 1, "c": 2}})"), Contains("'f.json': field 'b.c' is given twice"));
  REQUIRE_THROWS_WITH(parse("{\"a\": \"\xff\"}"), Contains("not valid JSON") && Contains("in 'a'") && Contains("UTF-8"));
  REQUIRE_THROWS_WITH(parse("{\"\xc3\x28\": 1}"), Contains("not valid JSON") && Contains("UTF-8"));
  REQUIRE_THROWS_WITH(parse("\"\xed\xa0\x80\""), Contains("UTF-8"));  // a surrogate, encoded
  REQUIRE_THROWS_WITH(parse(R"("\ud800")"), Contains("surrogate"));
  REQUIRE_THROWS_WITH(parse("{} x"), Contains("not valid JSON (byte 4)"));
  REQUIRE_THROWS_WITH(parse(""), Contains("not valid JSON"));
  REQUIRE_THROWS_WITH(parse("[NaN]"), Contains("not valid JSON"));
  REQUIRE(parse(R"({"a": "\u0000"})").at("a").string() == std::string(1, '\0'));
}

TEST_CASE("json: files, read only when regular and within the cap", "[unit][json]") {
  const std::string dir = nax::testing::scratch_dir("json_reader");
  std::filesystem::create_directories(dir);
  nax::testing::replace_file(dir + "/ok.json", R"({"k": 7})");
  REQUIRE(nax::io::read_json(dir + "/ok.json", kSmall, "test").at("k").integer(0, 9) == 7);
  nax::testing::replace_file(dir + "/big.json", std::string(2000, ' ') + "{}");
  REQUIRE_THROWS_WITH(nax::io::read_json(dir + "/big.json", kSmall, "test"),
                      Contains("test: '" + dir + "/big.json' has 2002 bytes, over the cap of 1000 bytes for a test file"));
  REQUIRE_THROWS_WITH(nax::io::read_json(dir, kSmall, "test"), Contains("is a folder"));
  REQUIRE_THROWS_WITH(nax::io::read_json("/dev/zero", kSmall, "test"), Contains("not a regular file"));
  REQUIRE_THROWS_WITH(nax::io::read_json(dir + "/missing.json", kSmall, "test"), Contains("cannot read"));
  REQUIRE_THROWS_WITH(nax::io::read_file(dir + "/big.json", nax::io::kManifestCaps.max_bytes / 1024), Contains("more than the 1024 bytes"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("output paths are checked before the work", "[unit][json]") {
  const std::string dir = nax::testing::scratch_dir("output_path");
  std::filesystem::create_directories(dir);
  nax::testing::replace_file(dir + "/file", "x");
  REQUIRE_NOTHROW(nax::io::check_writable(dir + "/new.json", "--json"));
  REQUIRE_NOTHROW(nax::io::check_writable(dir + "/file", "--json"));
  REQUIRE_THROWS_WITH(nax::io::check_writable(dir + "/file/x.json", "--json"), Contains("--json: cannot write '" + dir + "/file/x.json'"));
  REQUIRE_THROWS_WITH(nax::io::check_writable(dir + "/none/x.json", "--trace"), Contains("--trace: cannot write"));
  REQUIRE_THROWS_WITH(nax::io::check_writable(dir, "--metrics"), Contains("is a folder"));
  std::filesystem::remove_all(dir);
}
