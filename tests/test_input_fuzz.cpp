// Every kind of JSON file nax reads, mutated the ways a hostile file would be, through the reader
// nax uses for that kind: config.json, model.safetensors.index.json, tokenizer.json, a step's
// manifest.json and trainer.json, a safetensors header and a cost model. Each mutation of a valid
// file either loads or is refused with a nax::Error naming the file; the mutations that no valid
// file of any kind may hold (100,000 levels of nesting, a key given twice, invalid UTF-8, a number
// beyond a double) must be refused. A crash, a hang or another exception fails the test.
#include <catch2/catch.hpp>
#include <nax/nax.h>
#include <nax/global/cost_model.h>
#include <nax/text/bpe_tokenizer.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "checkpoint.h"
#include "files.h"
#include "step_files.h"

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// A file kind: a valid document and the reader nax applies to it, given the text (the reader
// writes it where the kind lives and returns the path its errors name).
struct Kind {
  std::string name;
  json valid;
  std::function<std::string(const std::string& text)> read;
};

// A mutation: the valid document and a random engine in, the text out (raw, so that it can hold
// what no DOM can) and whether every reader must refuse it.
struct Mutation {
  std::string name;
  bool must_refuse;
  std::function<std::string(const json& valid, std::mt19937_64& rng)> make;
};

const std::string kMarker = "\x01marker\x01";

// The JSON pointers of every value (containers too, not the root) of `j`.
void pointers(const json& j, const json::json_pointer& at, std::vector<json::json_pointer>& out) {
  if (!at.empty()) out.push_back(at);
  if (j.is_object())
    for (const auto& [k, v] : j.items()) pointers(v, at / k, out);
  else if (j.is_array())
    for (std::size_t i = 0; i < j.size(); ++i) pointers(j[i], at / i, out);
}

// Pointers whose value satisfies `keep`.
std::vector<json::json_pointer> where(const json& j, const std::function<bool(const json&)>& keep) {
  std::vector<json::json_pointer> all, kept;
  pointers(j, {}, all);
  for (const auto& p : all)
    if (keep(j[p])) kept.push_back(p);
  return kept;
}

// `valid` with the value at a random pointer of `candidates` replaced by the raw text `raw`.
std::string replace_value(const json& valid, const std::vector<json::json_pointer>& candidates, const std::string& raw, std::mt19937_64& rng) {
  json j = valid;
  j[candidates[rng() % candidates.size()]] = kMarker;
  std::string text = j.dump();
  const std::string quoted = json(kMarker).dump();
  return text.replace(text.find(quoted), quoted.size(), raw);
}

std::string deep(std::size_t n, bool objects) {
  std::string text;
  for (std::size_t i = 0; i < n; ++i) text += objects ? "{\"k\":" : "[";
  text += "0";
  for (std::size_t i = 0; i < n; ++i) text += objects ? "}" : "]";
  return text;
}

std::vector<Mutation> mutations() {
  auto any = [](const json&) { return true; };
  return {
      {"nesting 100000 deep", true,
       [=](const json& v, std::mt19937_64& rng) { return replace_value(v, where(v, any), deep(100'000, rng() % 2), rng); }},
      {"a number beyond a double", true,
       [](const json& v, std::mt19937_64& rng) {
         auto numbers = where(v, [](const json& x) { return x.is_number(); });
         if (numbers.empty()) numbers = where(v, [](const json&) { return true; });
         return replace_value(v, numbers, rng() % 2 ? "1e400" : "-1e999", rng);
       }},
      {"a key given twice", true,
       [](const json& v, std::mt19937_64& rng) {
         std::vector<json::json_pointer> objects = where(v, [](const json& x) { return x.is_object() && !x.empty(); });
         json j = v;
         json* object = &j;
         if (!objects.empty() && rng() % 4 != 0) object = &j[objects[rng() % objects.size()]];
         auto it = object->begin();
         std::advance(it, static_cast<std::ptrdiff_t>(rng() % object->size()));
         const std::string member = json(it.key()).dump() + ":" + it.value().dump();
         (*object)[kMarker] = 0;
         std::string text = j.dump();
         const std::string placeholder = json(kMarker).dump() + ":0";
         return text.replace(text.find(placeholder), placeholder.size(), member);
       }},
      {"invalid UTF-8 in a string", true,
       [](const json& v, std::mt19937_64& rng) {
         static const std::vector<std::string> bad{"\xff", "\xc3\x28", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "\xc0\xaf"};
         auto strings = where(v, [](const json& x) { return x.is_string(); });
         return replace_value(v, strings, "\"ab" + bad[rng() % bad.size()] + "cd\"", rng);
       }},
      {"a value of another type", false,
       [=](const json& v, std::mt19937_64& rng) {
         static const std::vector<std::string> values{"\"7\"", "[]", "{}", "null", "true", "-1", "0", "2.5", "[[1]]", "{\"k\":{}}", "\"\""};
         return replace_value(v, where(v, any), values[rng() % values.size()], rng);
       }},
      {"an integer at the edge of its type", false,
       [](const json& v, std::mt19937_64& rng) {
         static const std::vector<std::string> values{"18446744073709551615", "18446744073709551616", "9223372036854775808", "-9223372036854775809",
                                                      "2147483647", "2147483648", "-2147483649", "4294967296", "1e308", "99999999999999999999"};
         auto numbers = where(v, [](const json& x) { return x.is_number(); });
         if (numbers.empty()) numbers = where(v, [](const json&) { return true; });
         return replace_value(v, numbers, values[rng() % values.size()], rng);
       }},
      {"bytes changed", false,
       [](const json& v, std::mt19937_64& rng) {
         std::string text = v.dump();
         for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) text[rng() % text.size()] = static_cast<char>(rng() % 256);
         return text;
       }},
  };
}

std::string fixture(const std::string& path) { return nax::testing::file_bytes(std::string(NAX_SOURCE_FIXTURES) + "/" + path); }

std::vector<Kind> kinds(const std::string& dir) {
  std::vector<Kind> out;
  out.push_back({"config.json", json::parse(fixture("hf_gptj/config.json")),
                 [](const std::string& text) { gptj::config_from_json(text, "fuzz/config.json"); return std::string("fuzz/config.json"); }});
  out.push_back({"tokenizer.json", json::parse(fixture("tokenizer/tokenizer.json")), [](const std::string& text) {
                   nax::text::BpeTokenizer::from_json(text, "fuzz/tokenizer.json");
                   return std::string("fuzz/tokenizer.json");
                 }});
  const std::string hf = dir + "/hf";  // the fixture's shards, the index rewritten each time
  fs::create_directories(hf);
  for (const char* shard : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"})
    fs::copy_file(std::string(NAX_SOURCE_FIXTURES) + "/hf_gptj/" + shard, hf + "/" + shard);
  out.push_back({"model.safetensors.index.json", json::parse(fixture("hf_gptj/model.safetensors.index.json")), [hf](const std::string& text) {
                   nax::testing::replace_file(hf + "/model.safetensors.index.json", text);
                   nax::checkpoint::SafetensorsFolder folder(hf, nax::checkpoint::ChecksumPolicy::if_present);
                   return hf + "/model.safetensors.index.json";
                 }});
  const std::string run = dir + "/run";  // a committed step holding one file, its manifest rewritten each time
  std::string step;
  {
    nax::checkpoint::RunFolder folder(run);
    const std::string tmp = folder.begin_step(3);
    nax::io::write_file_atomically(tmp + "/config.json", fixture("hf_gptj/config.json"));
    folder.commit_step(tmp, 3);
    step = nax::checkpoint::step_folder(run, 3);
  }
  out.push_back({"manifest.json", json::parse(nax::testing::file_bytes(step + "/manifest.json")), [step](const std::string& text) {
                   nax::testing::replace_file(step + "/manifest.json", text);
                   nax::checkpoint::verify_step_folder(step);
                   return step + "/manifest.json";
                 }});
  const json record = {{"config", {{"name", "tiny"}, {"vocab", 256}, {"d_model", 32}, {"n_layers", 2}, {"n_heads", 4}, {"d_ff", 128},
                                   {"rotary_dims", 4}, {"max_seq", 2048}, {"layer_norm_eps", 1e-5}}},
                       {"steps", 10}, {"lr", 0.003}, {"seed", 0}, {"data", {{{"bytes", 1234}, {"checksum", "0123456789abcdef"}}}}};
  out.push_back({"trainer.json", json::parse(gptj::trainer_json(3, 3, record)), [](const std::string& text) {
                   gptj::trainer_state_from_json(text, "fuzz/trainer.json");
                   return std::string("fuzz/trainer.json");
                 }});
  const std::string st = dir + "/t.safetensors";  // a header rewritten in front of the same data
  nax::checkpoint::save_safetensors(st, {{"w", nax::random_normal(nax::Shape{{"a", 3}, {"b", 2}}, 1, "w")},
                                         {"i", nax::from_vector(nax::Shape{{"n", 2}}, std::vector<std::int32_t>{1, 2})}});
  const std::string st_bytes = nax::testing::file_bytes(st);
  std::uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | static_cast<unsigned char>(st_bytes[static_cast<std::size_t>(i)]);
  const std::string data = st_bytes.substr(8 + header_length);
  json header = json::parse(st_bytes.substr(8, header_length));
  header["__metadata__"].erase("nax.checksum");  // a file nax did not write: the parse, not the checksum, meets the mutations
  out.push_back({"safetensors header", header, [st, data](const std::string& text) {
                   std::string bytes(8, '\0');
                   for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
                   nax::testing::replace_file(st, bytes + text + data);
                   nax::checkpoint::SafetensorsReader reader(st, nax::checkpoint::ChecksumPolicy::if_present);
                   return st;
                 }});
  out.push_back({"cost model", json::parse(R"({"links": {"ib": {"latency_us": 10, "bandwidth_GBps": 25}}, "mesh_axes": {"dp": "ib"},
                                               "default": "ib", "memory_GBps": 20})"),
                 [](const std::string& text) { nax::CostModel::parse(text, "fuzz/cost.json"); return std::string("fuzz/cost.json"); }});
  return out;
}

// The path the reader's errors name; the reader run once on `text` to find it.
std::string path_of(const Kind& kind) {
  try {
    return kind.read(kind.valid.dump());
  } catch (const std::exception& e) {
    FAIL("the valid " << kind.name << " is refused: " << e.what());
  }
  return {};
}

}  // namespace

TEST_CASE("input fuzz: every JSON file kind, mutated, loads or is refused naming the file", "[unit][fuzz][json]") {
  const std::string dir = nax::testing::scratch_dir("input_fuzz");
  fs::create_directories(dir);
  const int per_mutation = 150;
  std::mt19937_64 rng(2024);
  for (const Kind& kind : kinds(dir)) {
    const std::string path = path_of(kind);
    int refused = 0, loaded = 0;
    for (const Mutation& m : mutations())
      for (int i = 0; i < per_mutation; ++i) {
        const std::string text = m.make(kind.valid, rng);
        INFO(kind.name << ", " << m.name << " #" << i << ": " << text.substr(0, 300));
        try {
          kind.read(text);
          ++loaded;
          REQUIRE(!m.must_refuse);
        } catch (const nax::Error& e) {
          ++refused;
          REQUIRE_THAT(e.what(), Catch::Contains(path));
        }
      }
    INFO(kind.name << ": " << refused << " refused, " << loaded << " loaded");
    REQUIRE(refused >= 4 * per_mutation);  // the four kinds of mutation that must be refused, at least
  }
  fs::remove_all(dir);
}
