// nax/checkpoint/: safetensors files validated field by field, the checksum over header and data,
// run folders whose step folders are each one unit, the writer's lock, and named global tensors
// saved on one mesh and loaded on another.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <fstream>
#include <random>

#include "files.h"
#include "helpers.h"

using namespace nax;
using namespace nax::checkpoint;
using namespace nax::io;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

std::string scratch(const std::string& name) {
  const std::string dir = testing::scratch_dir("ckpt_" + name);
  fs::create_directories(dir);
  return dir;
}

// `open` n times, `leaf`, `close` n times: JSON nested n deep.
std::string nested(int n, const std::string& open, const std::string& leaf, const std::string& close) {
  std::string text;
  for (int i = 0; i < n; ++i) text += open;
  text += leaf;
  for (int i = 0; i < n; ++i) text += close;
  return text;
}

// A file with this header text (which must hold "nax.checksum":"0000000000000000") and data, its
// checksum filled in as the writer does: so that the loader's other checks are what refuses it.
std::string sealed(const std::string& header, const std::string& data) {
  std::string length(8, '\0');
  for (int i = 0; i < 8; ++i) length[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  std::string file = length + header + data;
  const std::string zeros = "\"nax.checksum\":\"0000000000000000\"";
  const auto at = file.find(zeros);
  if (at == std::string::npos) return file;
  Checksum sum;
  sum.update(file.data(), file.size());
  file.replace(at + zeros.size() - 17, 16, sum.hex());
  return file;
}

std::string header_with(const std::string& tensors) {
  return fmt::format("{{{}{}\"__metadata__\":{{\"nax.checksum\":\"0000000000000000\"}}}}", tensors, tensors.empty() ? "" : ",");
}

}  // namespace

TEST_CASE("checkpoint: safetensors round trip of every dtype, one tensor at a time", "[unit][checkpoint]") {
  const std::string dir = scratch("roundtrip"), path = dir + "/t.safetensors";
  const Tensor f32 = random_normal(Shape{{"a", 4}, {"b", 3}}, 1, "w"), f64 = cast(f32, DType::f64), bf16 = cast(f32, DType::bf16);
  const Tensor i32 = arange({"n", 5}, DType::i32), scalar_like = full(Shape{{"one", 1}}, 7.0);
  save_safetensors(path, {{"f32", f32}, {"f64", f64}, {"bf16", bf16}, {"i32", i32}, {"s", scalar_like}}, {{"k", "v"}});
  Metadata meta;
  auto loaded = load_safetensors(path, &meta);
  REQUIRE(meta.at("k") == "v");
  REQUIRE(meta.at("nax.checksum").size() == 16);
  for (const auto& [name, want] : std::map<std::string, Tensor>{{"f32", f32}, {"f64", f64}, {"bf16", bf16}, {"i32", i32}, {"s", scalar_like}}) {
    INFO(name);
    REQUIRE(loaded.at(name).dtype() == want.dtype());
    REQUIRE(loaded.at(name).to_vector<double>() == want.to_vector<double>());
  }
  SafetensorsReader reader(path);
  REQUIRE(reader.tensors().front().name == "f32");  // file order is write order
  REQUIRE(reader.read("f32", Shape{{"x", 12}}).to_vector<double>() == f32.to_vector<double>());
  REQUIRE_THROWS_WITH(reader.expect("f32", {3, 4}), Contains("'f32' has shape [4, 3], expected [3, 4]") && Contains(path));
  REQUIRE_THROWS_WITH(reader.expect("f32", {4, 3}, DType::i32), Contains("is F32, expected I32"));
  REQUIRE_THROWS_WITH(reader.expect("nope", {1}), Contains("has no tensor 'nope'"));
  // The writer refuses what it did not announce.
  SafetensorsWriter w(dir + "/w.safetensors", {{"a", DType::f32, {2}}});
  REQUIRE_THROWS_WITH(w.write(i32), Contains("announced as F32"));
  REQUIRE_THROWS_WITH(w.commit(), Contains("0 of 1 tensors written"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: one changed byte anywhere in a file is refused by the checksum", "[unit][checkpoint][errors]") {
  const std::string dir = scratch("checksum"), path = dir + "/t.safetensors";
  save_safetensors(path, {{"w", random_normal(Shape{{"a", 8}}, 1, "w")}, {"i", arange({"n", 3}, DType::i32)}});
  const std::string good = testing::file_bytes(path);
  for (std::size_t at = 0; at < good.size(); ++at) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x01);
    testing::replace_file(path, bad);
    INFO("byte " << at << " of " << good.size());
    REQUIRE_THROWS_AS(SafetensorsReader(path), Error);
  }
  // A header edit that stays valid JSON (a dtype, a dim) is caught by the checksum too.
  std::string edited = good;
  edited.replace(edited.find("\"I32\""), 5, "\"F32\"");
  testing::replace_file(path, edited);
  REQUIRE_THROWS_WITH(SafetensorsReader(path), Contains("fails its checksum") && Contains(path));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: malformed headers are refused naming the file and the field", "[unit][checkpoint][errors]") {
  const std::string dir = scratch("malformed"), path = dir + "/t.safetensors";
  const std::string data16(16, '\x01');
  struct Case {
    const char* what;
    std::string file;
    const char* expected;
  };
  const std::vector<Case> cases{
      {"gap", sealed(header_with(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]})"), data16), "a gap is left"},
      {"overlap", sealed(header_with(R"("a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]})"), data16), "overlaps"},
      {"past the end", sealed(header_with(R"("a":{"dtype":"F32","shape":[5],"data_offsets":[0,20]})"), data16), "cover 20 bytes"},
      {"short of the end", sealed(header_with(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})"), data16), "cover 8 bytes"},
      {"dtype x shape", sealed(header_with(R"("a":{"dtype":"F64","shape":[4],"data_offsets":[0,16]})"), data16), "32 bytes by its dtype and shape"},
      {"duplicate", sealed(header_with(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]})"), data16), "field 'a' is given twice"},
      {"dtype", sealed(header_with(R"("a":{"dtype":"F8_E4M3","shape":[16],"data_offsets":[0,16]})"), data16), "dtype 'F8_E4M3' (nax reads F32, F64, F16, BF16 and I32)"},
      {"negative dim", sealed(header_with(R"("a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]})"), data16), "not a non-negative integer"},
      {"fraction", sealed(header_with(R"("a":{"dtype":"F32","shape":[4.0],"data_offsets":[0,16]})"), data16), "not a non-negative integer"},
      {"huge dims", sealed(header_with(R"("a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]})"), data16), "more than 2^64"},
      {"missing field", sealed(header_with(R"("a":{"dtype":"F32","shape":[4]})"), data16), "has no 'data_offsets'"},
      {"reversed offsets", sealed(header_with(R"("a":{"dtype":"F32","shape":[4],"data_offsets":[16,0]})"), data16), "end before they begin"},
      {"unknown field", sealed(header_with(R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":1})"), data16), "unknown field 'x'"},
      {"no checksum", sealed(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data16), "no nax.checksum"},
      {"not JSON", sealed("{\"a\": [", data16), "not valid JSON"},
      {"not an object", sealed("[1, 2]", data16), "not a JSON object"},
      {"deep", sealed(nested(100, "{\"a\":", "1", "}"), data16), "nests deeper than 8 levels, the cap for a safetensors header"},
      {"deep arrays", sealed(nested(100000, "[", "1", "]"), data16), "nests deeper than 8 levels"},
      {"header longer than the file", std::string("\xff\xff\x00\x00\x00\x00\x00\x00{}", 10), "does not fit the 10-byte file"},
      {"truncated length", std::string("\x02\x00", 2), "fewer than the 8"},
  };
  for (const auto& c : cases) {
    testing::replace_file(path, c.file);
    INFO(c.what);
    REQUIRE_THROWS_WITH(SafetensorsReader(path), Contains(c.expected) && Contains(path));
  }
  REQUIRE_THROWS_WITH(SafetensorsReader(dir), Contains("is a folder"));
  fs::create_symlink("/dev/zero", dir + "/zero.safetensors");
  REQUIRE_THROWS_WITH(SafetensorsReader(dir + "/zero.safetensors"), Contains("not a regular file"));
  REQUIRE_THROWS_WITH(read_file(dir + "/zero.safetensors"), Contains("not a regular file"));
  REQUIRE_THROWS_WITH(read_file(dir), Contains("is a folder"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: step folders are committed whole, pruned, verified, and temporaries of dead writers removed", "[unit][checkpoint]") {
  const std::string dir = scratch("run");
  // A temporary left by a writer that died (a child that has exited: its pid is free).
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  const std::string stale = fmt::format("{}/step_000001.tmp.{}", dir, child);
  fs::create_directories(stale);
  testing::replace_file(stale + "/model.safetensors", "half");
  {
    RunFolder run(dir);
    REQUIRE_FALSE(fs::exists(stale));
    REQUIRE(committed_steps(dir).empty());
    for (std::int64_t step : {1, 2, 3}) {
      const std::string tmp = run.begin_step(step);
      REQUIRE(committed_steps(dir).size() == static_cast<std::size_t>(step - 1));
      save_safetensors(tmp + "/w.safetensors", {{"w", full(Shape{{"a", 3}}, static_cast<double>(step))}});
      write_file_atomically(tmp + "/info.json", "{}");
      run.commit_step(tmp, step, /*keep=*/step == 3 ? 1 : 0);
    }
    REQUIRE(committed_steps(dir) == std::vector<std::int64_t>{3});
    const std::string folder = step_folder(dir, 3);
    verify_step_folder(folder);
    REQUIRE(load_safetensors(folder + "/w.safetensors").at("w").to_vector<double>() == std::vector<double>{3, 3, 3});
    // A second writer on the same folder is refused, naming the holder.
    REQUIRE_THROWS_WITH(RunFolder(dir), Contains(fmt::format("in use by another writer (pid {})", ::getpid())));

    std::string info = testing::file_bytes(folder + "/info.json");
    testing::replace_file(folder + "/info.json", "{ }");
    REQUIRE_THROWS_WITH(verify_step_folder(folder), Contains("info.json") && Contains("has 3 bytes, its manifest says 2"));
    testing::replace_file(folder + "/info.json", "[]");
    REQUIRE_THROWS_WITH(verify_step_folder(folder), Contains("info.json") && Contains("fails its checksum"));
    testing::replace_file(folder + "/info.json", info);
    testing::replace_file(folder + "/extra", "x");
    REQUIRE_THROWS_WITH(verify_step_folder(folder), Contains("'extra', which its manifest does not list"));
    fs::remove(folder + "/extra");
    fs::remove(folder + "/info.json");
    REQUIRE_THROWS_WITH(verify_step_folder(folder), Contains("info.json") && Contains("missing"));
  }
  RunFolder again(dir);  // the lock was released with the first
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: a manifest lists a safetensors file by its own checksum, and still refuses any changed byte", "[unit][checkpoint]") {
  const std::string dir = scratch("manifest_kinds");
  {
    RunFolder run(dir);
    const std::string tmp = run.begin_step(1);
    save_safetensors(tmp + "/w.safetensors", {{"w", random_normal(Shape{{"a", 8}}, 2, "w")}});
    write_file_atomically(tmp + "/info.json", "{}");
    run.commit_step(tmp, 1);
  }
  const std::string folder = step_folder(dir, 1), weights = folder + "/w.safetensors", manifest_path = folder + "/manifest.json";
  const auto manifest = nlohmann::json::parse(testing::file_bytes(manifest_path));
  REQUIRE(manifest.at("version") == 2);
  const auto& listed = manifest.at("files").at("w.safetensors");
  REQUIRE(listed.at("kind") == "safetensors");
  REQUIRE(listed.at("checksum") == SafetensorsReader(weights).own_checksum().value());
  REQUIRE_FALSE(manifest.at("files").at("info.json").contains("kind"));  // a whole-file checksum
  verify_step_folder(folder);

  const std::string good = testing::file_bytes(weights);
  for (std::size_t at = 0; at < good.size(); at += 7) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x01);
    testing::replace_file(weights, bad);
    INFO("byte " << at << " of " << good.size());
    REQUIRE_THROWS_AS(verify_step_folder(folder), Error);
  }
  // Another valid file of the same size, sealed by its own checksum: the manifest's tells them apart.
  const std::string other = dir + "/other.safetensors";
  save_safetensors(other, {{"w", random_normal(Shape{{"a", 8}}, 3, "w")}});
  REQUIRE(fs::file_size(other) == good.size());
  testing::replace_file(weights, testing::file_bytes(other));
  REQUIRE_THROWS_WITH(verify_step_folder(folder), Contains("w.safetensors") && Contains("its manifest says") &&
                                                      Contains("files[\"w.safetensors\"].checksum"));
  testing::replace_file(weights, good);

  auto rewrite = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json changed = manifest;
    edit(changed);
    testing::replace_file(manifest_path, changed.dump(2));
  };
  rewrite([](nlohmann::json& m) { m["files"]["w.safetensors"]["kind"] = "zip"; });
  REQUIRE_THROWS_WITH(verify_step_folder(folder), Contains("kind") && Contains("not \"safetensors\""));
  rewrite([](nlohmann::json& m) { m["version"] = 1; });
  REQUIRE_THROWS_WITH(verify_step_folder(folder), Contains("kind") && Contains("version-1 manifest"));
  // A version-1 manifest (every checksum the whole file's) is still read.
  rewrite([&](nlohmann::json& m) {
    m["version"] = 1;
    m["files"]["w.safetensors"] = {{"bytes", good.size()}, {"checksum", file_checksum(weights)}};
  });
  verify_step_folder(folder);
  rewrite([](nlohmann::json& m) { m["version"] = 3; });
  REQUIRE_THROWS_WITH(verify_step_folder(folder), Contains("version"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: a safetensors file this process did not write is hashed whole at commit", "[unit][checkpoint]") {
  const std::string dir = scratch("manifest_foreign"), outside = dir + "/outside.safetensors";
  fs::create_directories(dir);
  save_safetensors(outside, {{"w", random_normal(Shape{{"a", 8}}, 4, "w")}});
  std::string bytes = testing::file_bytes(outside);
  bytes[bytes.size() - 1] = static_cast<char>(bytes[bytes.size() - 1] ^ 0x01);  // its header's checksum no longer holds
  {
    RunFolder run(dir + "/run");
    const std::string tmp = run.begin_step(1);
    testing::replace_file(tmp + "/w.safetensors", bytes);  // copied in, not written by a writer here
    run.commit_step(tmp, 1);
  }
  const std::string folder = step_folder(dir + "/run", 1);
  const auto listed = nlohmann::json::parse(testing::file_bytes(folder + "/manifest.json")).at("files").at("w.safetensors");
  REQUIRE_FALSE(listed.contains("kind"));
  REQUIRE(listed.at("checksum") == file_checksum(folder + "/w.safetensors"));
  verify_step_folder(folder);  // the manifest holds what was committed; the reader refuses its content
  REQUIRE_THROWS_WITH(SafetensorsReader(folder + "/w.safetensors"), Contains("fails its checksum"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: non-finite values are refused as they are read, when asked", "[unit][checkpoint][errors]") {
  const std::string dir = scratch("nonfinite"), path = dir + "/t.safetensors";
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  save_safetensors(path, {{"ok", from_vector(Shape{{"n", 3}}, std::vector<float>{1, 2, 3})},
                          {"bad", from_vector(Shape{{"n", 4}}, std::vector<float>{nan, 1, -inf, inf})},
                          {"bad16", cast(from_vector(Shape{{"n", 2}}, std::vector<float>{1, nan}), DType::bf16)},
                          {"ids", from_vector(Shape{{"n", 2}}, std::vector<std::int32_t>{-1, 7})}});
  const SafetensorsReader allowing(path), refusing(path, ChecksumPolicy::required, NonFinitePolicy::refuse);
  REQUIRE(std::isnan(allowing.read("bad").to_vector<float>()[0]));
  REQUIRE(refusing.read("ok").to_vector<float>() == std::vector<float>{1, 2, 3});
  REQUIRE(refusing.read("ids").to_vector<std::int32_t>() == std::vector<std::int32_t>{-1, 7});
  REQUIRE_THROWS_WITH(refusing.read("bad"), Contains(path) && Contains("tensor 'bad' holds 3 non-finite values (NaN or infinity) among its 4"));
  REQUIRE_THROWS_WITH(refusing.read("bad16"), Contains("tensor 'bad16' holds 1 non-finite"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: what a step folder is, and what an atomic write may replace", "[unit][checkpoint]") {
  const std::string dir = scratch("step_like");
  fs::create_directories(dir + "/plain/model");
  REQUIRE(!looks_like_step_folder(dir + "/plain/model"));
  REQUIRE(looks_like_step_folder(dir + "/plain/step_000007"));  // by its name, even absent
  REQUIRE(looks_like_step_folder(dir + "/plain/step_000007.tmp.123"));
  {
    RunFolder run(dir + "/run");
    fs::create_directories(dir + "/run/renamed");
    REQUIRE(looks_like_step_folder(dir + "/run/renamed"));  // inside a run folder
    REQUIRE(looks_like_step_folder(dir + "/run/renamed/"));
  }
  fs::create_directories(dir + "/elsewhere");
  testing::replace_file(dir + "/elsewhere/manifest.json", "{}");
  REQUIRE(looks_like_step_folder(dir + "/elsewhere"));
  REQUIRE_THROWS_WITH(verify_step_folder(dir + "/plain/model"), Contains("has no manifest.json"));
  REQUIRE_THROWS_WITH(write_file_atomically(dir + "/plain", "x"), Contains("exists and is not a regular file"));
  fs::create_symlink("/dev/null", dir + "/null");
  REQUIRE_THROWS_WITH(write_file_atomically(dir + "/null", "x"), Contains("exists and is not a regular file"));
  REQUIRE(fs::is_symlink(dir + "/null"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: global tensors saved on one mesh load on another, one tensor at a time", "[unit][checkpoint]") {
  const std::string dir = scratch("sharded"), path = dir + "/p.safetensors";
  const std::vector<nn::ParamSpec> specs{{"w", Shape{{"heads", 4}, {"head_dim", 2}, {"embed", 3}}}, {"b", Shape{{"embed", 3}}}};
  std::vector<Tensor> globals;
  for (const auto& spec : specs) globals.push_back(random_normal(spec.global, 1, spec.name));
  {
    Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
    const AxisRules rules{{"heads", "mp"}};
    rt.run([&](Shard& s) {
      std::vector<Tensor> blocks;
      for (const auto& g : globals) blocks.push_back(s.shard(g, rules));
      save_parameters(s, path, nn::Parameters::from_values(specs, blocks));
      save_sharded(s, dir + "/merged.safetensors", {{"w", blocks[0], specs[0].global, {8, 3}}});
    });
  }
  SafetensorsReader merged(dir + "/merged.safetensors");
  REQUIRE(merged.expect("w", {8, 3}).nbytes() == 96);
  SafetensorsReader file(path);
  for (const std::string mesh : {"mp=4", "x=1", "mp=2,dp=3"}) {
    Runtime rt = Runtime::local(Mesh::parse(mesh));
    const AxisRules rules = mesh == "x=1" ? AxisRules{} : AxisRules{{"heads", "mp"}};
    rt.run([&](Shard& s) {
      const nn::Parameters params = load_parameters(s, file, specs, rules);
      for (std::size_t i = 0; i < specs.size(); ++i) NAX_EXPECT(testing::same_values(s.gather(params[i]), globals[i]));
      const auto blocks = load_sharded(s, merged, {{"w", specs[0].global, {8, 3}}}, rules);
      NAX_EXPECT(testing::same_values(s.gather(blocks[0]), globals[0]));
    });
  }
  REQUIRE_THROWS_WITH(Runtime::local(Mesh::parse("x=1")).run([&](Shard& s) { load_parameters(s, file, {{"w", Shape{{"heads", 2}}}}, {}); }),
                      Contains("'w' has shape [4, 2, 3], expected [2]"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: tensors held by one pipeline stage save from it and load onto it alone", "[unit][checkpoint]") {
  const std::string dir = scratch("held"), path = dir + "/p.safetensors";
  const Shape sw{{"heads", 4}, {"embed", 3}}, sb{{"embed", 3}};
  const Tensor w0 = random_normal(sw, 1, "w0"), w1 = random_normal(sw, 1, "w1"), b = random_normal(sb, 1, "b");
  // w0 on stage 0, w1 on stage 1 (each cut over mp there), b on every device.
  const std::vector<ShardedRead> reads{{"w0", sw, {}, {"pp", 0}}, {"b", sb}, {"w1", sw, {}, {"pp", 1}}};
  const AxisRules rules{{"heads", "mp"}};
  Runtime::local(Mesh::parse("pp=2,mp=2")).run([&](Shard& s) {
    const int stage = s.coord("pp");
    auto held = [&](const Tensor& g, int by) {
      if (stage != by) return Tensor();
      VaryType vary = s.shard(g, rules).vary();
      vary.set_varying("pp");
      return s.shard(g, rules).with_vary(vary);
    };
    save_sharded(s, path, {{"w0", held(w0, 0), sw, {}, {"pp", 0}}, {"b", s.shard(b, rules), sb}, {"w1", held(w1, 1), sw, {}, {"pp", 1}}});
  });
  SafetensorsReader file(path);
  REQUIRE(testing::same_values(file.read("w0", sw), w0));
  REQUIRE(testing::same_values(file.read("w1", sw), w1));
  REQUIRE(testing::same_values(file.read("b", sb), b));
  for (const std::string mesh : {"pp=2,mp=2", "mp=2,pp=2", "pp=2,mp=1"}) {
    Runtime::local(Mesh::parse(mesh)).run([&](Shard& s) {
      const int stage = s.coord("pp");
      const auto blocks = load_sharded(s, file, reads, rules);
      NAX_EXPECT(blocks[0].defined() == (stage == 0) && blocks[2].defined() == (stage == 1) && blocks[1].defined());
      NAX_EXPECT(testing::same_values(s.gather(blocks[1]), b));
      const Tensor mine = blocks[stage == 0 ? 0 : 2];
      NAX_EXPECT(mine.vary().kind("pp") == Vary::Varying);
      NAX_EXPECT(testing::same_values(all_gather_cuts(mine).with_vary(VaryType{}).on_host(), stage == 0 ? w0 : w1));
    });
  }
  // A holder without its block, a block of another dtype than announced, an axis the mesh lacks.
  auto save = [&](const std::string& mesh, const std::function<ShardedTensor(Shard&)>& tensor) {
    Runtime::local(Mesh::parse(mesh)).run([&](Shard& s) { save_sharded(s, dir + "/bad.safetensors", {tensor(s)}); });
  };
  REQUIRE_THROWS_WITH(save("pp=2", [&](Shard&) { return ShardedTensor{"w0", Tensor(), sw, {}, {"pp", 0}}; }),
                      Contains("tensor 'w0' has no block on device 0, which holds it held by pp=0"));
  REQUIRE_THROWS_WITH(save("pp=2", [&](Shard& s) {
                        return ShardedTensor{"w0", s.coord("pp") == 0 ? pvary(cast(w0, DType::bf16), "pp") : Tensor(), sw, {}, {"pp", 0}};
                      }),
                      Contains("announced as f32 held by pp=0"));
  REQUIRE_THROWS_WITH(save("mp=2", [&](Shard& s) { return ShardedTensor{"w0", s.shard(w0, rules), sw, {}, {"pp", 0}}; }),
                      Contains("tensor 'w0' is held by mesh axis 'pp', which mesh mp=2 lacks"));
  REQUIRE_THROWS_WITH(Runtime::local(Mesh::parse("mp=2")).run([&](Shard& s) { load_sharded(s, file, {reads[0]}, rules); }),
                      Contains("load_sharded: tensor 'w0' is held by mesh axis 'pp', which mesh mp=2 lacks"));
  fs::remove_all(dir);
}

// Mutations of a valid file: raw byte edits (which the checksum must refuse), and header edits
// resealed with a fresh checksum (which reach the structural checks). Every load either succeeds
// or raises a nax::Error; a raw edit never loads.
TEST_CASE("checkpoint: mutation fuzzer, thousands of damaged files, no crash and no silent load", "[unit][checkpoint][fuzz]") {
  const std::string dir = scratch("fuzz"), path = dir + "/t.safetensors";
  save_safetensors(path, {{"a", random_normal(Shape{{"x", 3}, {"y", 2}}, 1, "a")}, {"b", arange({"n", 4}, DType::i32)},
                          {"c", cast(random_normal(Shape{{"z", 5}}, 1, "c"), DType::bf16)}},
                   {{"adam_steps", "3"}});
  const std::string good = testing::file_bytes(path);
  std::uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | static_cast<unsigned char>(good[static_cast<std::size_t>(i)]);
  const std::string header = good.substr(8, header_length), data = good.substr(8 + header_length);
  std::string zero_header = header;
  {
    const auto at = zero_header.find("\"nax.checksum\":\"") + 16;
    zero_header.replace(at, 16, std::string(16, '0'));
  }
  const std::vector<std::string> tokens{"0", "1", "-1", "4", "8", "1e3", "2.5", "null", "true", "\"F32\"", "\"I32\"", "\"F64\"", "\"BF16\"",
                                        "[]", "{}", "[0,0]", "[2]", "18446744073709551615", ",", ":", "\"a\"", "\"\"", "9223372036854775807"};
  std::mt19937_64 rng(42);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % std::max<std::size_t>(n, 1)); };
  int refused = 0, loaded = 0;
  const int kMutations = 20000;
  for (int i = 0; i < kMutations; ++i) {
    std::string file;
    const bool raw = i % 2 == 0;
    if (raw) {
      file = good;
      switch (pick(4)) {
        case 0: file[pick(file.size())] ^= static_cast<char>(1 + pick(255)); break;
        case 1: file.resize(pick(file.size())); break;
        case 2: file.insert(pick(file.size()), std::string(1 + pick(8), static_cast<char>(pick(256)))); break;
        default: file.erase(pick(file.size()), 1 + pick(8)); break;
      }
      if (file == good) continue;
    } else {
      std::string h = zero_header, d = data;
      for (std::size_t k = 0, edits = 1 + pick(3); k < edits; ++k) {
        const std::size_t at = pick(h.size());
        switch (pick(4)) {
          case 0: h.replace(at, 1 + pick(6), tokens[pick(tokens.size())]); break;
          case 1: h.insert(at, tokens[pick(tokens.size())]); break;
          case 2: h.erase(at, 1 + pick(4)); break;
          default: d.resize(pick(d.size() + 8), '\x7f'); break;
        }
      }
      file = sealed(h, d);
    }
    testing::replace_file(path, file);
    try {
      SafetensorsReader reader(path);
      for (const auto& t : reader.tensors()) reader.read(t.name);
      ++loaded;
      if (raw) FAIL("a raw mutation loaded (mutation " << i << ")");
    } catch (const Error&) {
      ++refused;
    }
  }
  INFO("refused " << refused << ", loaded " << loaded);
  REQUIRE(refused + loaded >= kMutations * 9 / 10);
  REQUIRE(refused > kMutations / 2);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: save_sharded and load_sharded refuse devices that pass different tensors, naming each one's", "[unit][checkpoint][errors]") {
  const std::string dir = scratch("agree"), path = dir + "/p.safetensors";
  Runtime rt = Runtime::local(Mesh::parse("dp=2"), {.collective_timeout_s = 10});
  auto tensor = [](Shard& s, const std::string& name) {
    const Shape global{{"a", 4}};
    return ShardedTensor{name, s.shard(random_normal(global, 1, name), {{"a", "dp"}}), global};
  };
  auto save = [&](const std::function<std::vector<ShardedTensor>(Shard&)>& tensors, const std::function<int(Shard&)>& writer) {
    rt.run([&](Shard& s) { save_sharded(s, path, tensors(s), {}, writer(s)); });
  };
  auto device_0 = [](Shard&) { return 0; };
  // Another order on device 1: x's half would come from y.
  REQUIRE_THROWS_WITH(save([&](Shard& s) {
                        const ShardedTensor x = tensor(s, "x"), y = tensor(s, "y");
                        return s.device() == 0 ? std::vector{x, y} : std::vector{y, x};
                      }, device_0),
                      Contains("save_sharded: the devices pass different tensors to save in '" + path + "'") &&
                          Contains("tensor 0: 'x' f32[a=4] on device 0; tensor 0: 'y' f32[a=4] on device 1"));
  REQUIRE_FALSE(fs::exists(path));
  // Other names, one tensor fewer, another global shape, another writer.
  REQUIRE_THROWS_WITH(save([&](Shard& s) {
                        const ShardedTensor x = tensor(s, "x"), y = tensor(s, "y");
                        return std::vector{x, ShardedTensor{s.device() == 0 ? "y" : "z", y.block, y.global}};
                      }, device_0),
                      Contains("tensor 1: 'y' f32[a=4] on device 0; tensor 1: 'z' f32[a=4] on device 1"));
  REQUIRE_THROWS_WITH(save([&](Shard& s) {
                        const ShardedTensor x = tensor(s, "x"), y = tensor(s, "y");
                        return s.device() == 0 ? std::vector{x, y} : std::vector{x};
                      }, device_0),
                      Contains("tensor 1: 'y' f32[a=4] on device 0; nothing (a shorter list) on device 1"));
  REQUIRE_THROWS_WITH(save([&](Shard& s) {
                        ShardedTensor t = tensor(s, "x");
                        if (s.device() == 1) t.stored_dims = {2, 2};
                        return std::vector{t};
                      }, device_0),
                      Contains("'x' f32[a=4] on device 0; tensor 0: 'x' f32[a=4] stored as [2, 2] on device 1"));
  REQUIRE_THROWS_WITH(save([&](Shard& s) { return std::vector{tensor(s, "x")}; }, [](Shard& s) { return s.device(); }),
                      Contains("writer: device 0 on device 0; writer: device 1 on device 1"));
  REQUIRE_THROWS_WITH(save([&](Shard& s) { return std::vector{tensor(s, "x")}; }, [](Shard&) { return 2; }),
                      Contains("writer 2 is not a device of mesh dp=2"));
  REQUIRE_FALSE(fs::exists(path));
  // Alike on every device: saved; each device's path is its own business (only the writer's is used).
  save([&](Shard& s) { return std::vector{tensor(s, "x"), tensor(s, "y")}; }, device_0);
  SafetensorsReader file(path);
  REQUIRE_THROWS_WITH(rt.run([&](Shard& s) {
                        const Shape global{{"a", 4}};
                        std::vector<ShardedRead> reads{{"x", global}, {"y", global}};
                        if (s.device() == 1) std::swap(reads[0], reads[1]);
                        load_sharded(s, file, reads, {});
                      }),
                      Contains("load_sharded: the devices pass different tensors to load") && Contains("tensor 0: 'x' [a=4] on device 0"));
  // The same for a Hugging Face folder's save and load.
  auto folder_tensors = [](Shard& s) {
    std::vector<LazyShardedTensor> tensors;
    for (const std::string name : {"x", "y"})
      tensors.push_back({name, Shape{{"a", 4}}, {}, [&s, name] { return s.shard(random_normal(Shape{{"a", 4}}, 1, name), {{"a", "dp"}}); }});
    if (s.device() == 1) std::swap(tensors[0], tensors[1]);
    return tensors;
  };
  REQUIRE_THROWS_WITH(rt.run([&](Shard& s) { save_sharded_folder(s, dir + "/hf", folder_tensors(s), "f32", 1 << 20); }),
                      Contains("save_sharded_folder: the devices pass different tensors") && Contains("tensor 0: 'x' [a=4] on device 0; tensor 0: 'y' [a=4] on device 1"));
  REQUIRE_FALSE(fs::exists(dir + "/hf"));
  rt.run([&](Shard& s) {
    auto tensors = folder_tensors(s);
    if (s.device() == 1) std::swap(tensors[0], tensors[1]);
    save_sharded_folder(s, dir + "/hf", tensors, "f32", 1 << 20);
  });
  const SafetensorsFolder folder(dir + "/hf", ChecksumPolicy::required);
  REQUIRE_THROWS_WITH(rt.run([&](Shard& s) {
                        std::vector<ShardedRead> reads{{"x", Shape{{"a", 4}}}, {"y", Shape{{"a", 4}}}};
                        if (s.device() == 1) std::swap(reads[0], reads[1]);
                        load_sharded(s, folder, reads, {}, DType::f32);
                      }),
                      Contains("load_sharded: the devices pass different tensors to load from '" + dir + "/hf'"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: files keep each tensor's axis names, and a load naming them in another order permutes", "[unit][checkpoint]") {
  const std::string dir = scratch("axes"), path = dir + "/p.safetensors";
  const std::vector<nn::ParamSpec> saved{{"square", Shape{{"embed", 4}, {"out", 4}}}, {"wide", Shape{{"embed", 4}, {"out", 6}}},
                                         {"cube", Shape{{"a", 2}, {"b", 3}, {"c", 4}}}};
  std::vector<Tensor> globals;
  for (const auto& spec : saved) globals.push_back(random_normal(spec.global, 1, spec.name));
  Runtime::local(Mesh::parse("mp=2")).run([&](Shard& s) {
    std::vector<Tensor> blocks;
    for (const auto& g : globals) blocks.push_back(s.shard(g, {{"embed", "mp"}, {"a", "mp"}}));
    save_parameters(s, path, nn::Parameters::from_values(saved, blocks), {{"nax.axes", "a caller's, replaced"}});
  });
  SafetensorsReader file(path);
  REQUIRE(file.read("square").shape() == saved[0].global);
  REQUIRE(file.find("cube")->axes == saved[2].global.axes());
  // The same tensors asked for with their axes in another order (cut otherwise, on another mesh).
  const std::vector<nn::ParamSpec> permuted{{"square", Shape{{"out", 4}, {"embed", 4}}}, {"wide", Shape{{"out", 6}, {"embed", 4}}},
                                            {"cube", Shape{{"c", 4}, {"a", 2}, {"b", 3}}}};
  Runtime::local(Mesh::parse("mp=2,dp=2")).run([&](Shard& s) {
    const nn::Parameters params = load_parameters(s, file, permuted, {{"out", "mp"}, {"c", "dp"}});
    for (std::size_t i = 0; i < permuted.size(); ++i)
      NAX_EXPECT(testing::same_values(s.gather(params[i]), transpose(globals[i], permuted[i].global.names())));
  });
  REQUIRE(file.read("wide", Shape{{"out", 6}, {"embed", 4}}).to_vector<double>() == transpose(globals[1], {"out", "embed"}).to_vector<double>());
  // Merged or renamed axes read the stored order; a saved axis named elsewhere is refused.
  REQUIRE(file.read("cube", Shape{{"ab", 6}, {"c", 4}}).to_vector<double>() == globals[2].to_vector<double>());
  REQUIRE(file.read("square", Shape{{"x", 4}, {"y", 4}}).to_vector<double>() == globals[0].to_vector<double>());
  REQUIRE_THROWS_WITH(file.read("cube", Shape{{"c", 4}, {"ab", 6}}),
                      Contains("tensor 'cube' was saved with axes [a=2, b=3, c=4], which [c=4, ab=6] names in other places"));
  REQUIRE_THROWS_WITH(Runtime::local(Mesh::parse("x=1")).run([&](Shard& s) {
                        load_parameters(s, file, {{"square", Shape{{"out", 4}, {"in", 4}}}}, {});
                      }),
                      Contains("'square' was saved with axes [embed=4, out=4]"));
  // A file without names (Hugging Face's, or nax's before it wrote them) reads positionally.
  const std::string unnamed = dir + "/unnamed.safetensors";
  SafetensorsWriter writer(unnamed, {{"square", DType::f32, {4, 4}}});
  writer.write(globals[0]);
  writer.commit();
  SafetensorsReader old(unnamed);
  REQUIRE(old.metadata().count("nax.axes") == 0);
  REQUIRE(old.read("square").shape() == Shape{{"d0", 4}, {"d1", 4}});
  REQUIRE(old.read("square", Shape{{"out", 4}, {"embed", 4}}).to_vector<double>() == globals[0].to_vector<double>());
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: malformed axis names in a file are refused naming the file and the tensor", "[unit][checkpoint][errors]") {
  const std::string dir = scratch("bad_axes"), path = dir + "/t.safetensors";
  const std::string tensor = R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";
  auto header = [&](const std::string& axes) {
    std::string quoted;
    for (char c : axes) quoted += c == '"' ? std::string("\\\"") : std::string(1, c);
    return fmt::format(R"({{{},"__metadata__":{{"nax.axes":"{}","nax.checksum":"0000000000000000"}}}})", tensor, quoted);
  };
  const std::vector<std::pair<std::string, std::string>> cases{
      {"[", "metadata nax.axes is not valid"},
      {"[]", "not a JSON object"},
      {R"({"v":[["a",6]]})", "names tensor 'v', which the file does not hold"},
      {R"({"w":[["a",2],["b",2]]})", "gives 4 elements, the tensor is [2, 3]"},
      {R"({"w":[["a",2],["a",3]]})", "names axis 'a' empty or twice"},
      {R"({"w":[["",6]]})", "empty or twice"},
      {R"({"w":[["a",-6]]})", "not [name, size]"},
      {R"({"w":[["a"]]})", "not [name, size]"},
      {R"({"w":{"a":6}})", "is not a list"},
      {R"({"w":[["a",0],["b",4611686018427387904],["c",4]]})", "out of range"},
  };
  for (const auto& [axes, words] : cases) {
    INFO(axes);
    testing::replace_file(path, sealed(header(axes), std::string(24, '\0')));
    REQUIRE_THROWS_WITH(SafetensorsReader(path), Contains(path) && Contains(words));
  }
  testing::replace_file(path, sealed(header(R"({"w":[["a",2],["b",3]]})"), std::string(24, '\0')));
  REQUIRE(SafetensorsReader(path).read("w").shape() == Shape{{"a", 2}, {"b", 3}});
  fs::remove_all(dir);
}
