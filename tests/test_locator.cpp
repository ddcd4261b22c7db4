// The op recorder and the mesh-comparison locator (nax/debug/): a small per-shard model with a
// planted sharding bug that only shows with two devices along mp must be named by its op and its
// position; the same model without the bug shows no difference between meshes.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include "nax/nax.h"
#include "nax/debug/locator.h"

using namespace nax;

namespace {

constexpr std::int64_t kBatch = 2, kSeq = 4, kEmbed = 8, kHeads = 4, kHeadDim = 4, kVocab = 16;

// Host inputs, the same whatever the mesh.
struct Inputs {
  Tensor ids = from_vector(Shape{{"batch", kBatch}, {"seq", kSeq}}, std::vector<std::int32_t>{1, 5, 9, 15, 0, 7, 8, 12});
  Tensor table = random_normal(Shape{{"vocab", kVocab}, {"embed", kEmbed}}, 3, "table");
  Tensor x = random_normal(Shape{{"batch", kBatch}, {"seq", kSeq}, {"embed", kEmbed}}, 3, "x");
  Tensor wq = random_normal(Shape{{"embed", kEmbed}, {"heads", kHeads}, {"head_dim", kHeadDim}}, 3, "wq");
};

// A vocab-parallel embedding, a residual add, a head-parallel projection with rotary positions,
// gelu, then the heads gathered. The planted bug: the rotary's position offset is taken from the
// device's mp coordinate (as if seq were cut over mp), which is 0, hence right, on one device.
void model(Shard& s, const Inputs& in, bool planted_bug) {
  const AxisRules rules{{"vocab", "mp"}, {"heads", "mp"}};
  const Tensor table = s.shard(in.table, rules), wq = s.shard(in.wq, rules);
  const Tensor ids = s.shard(in.ids, rules), x = s.shard(in.x, rules);
  const Tensor e = psum(embedding(table, ids, "vocab"), "mp");
  const Tensor q = dot(e + x, wq, "embed");
  const std::int64_t offset = planted_bug ? s.coord("mp") * kSeq : 0;
  const Tensor r = rotary(q, "seq", "head_dim", kHeadDim, offset);
  const Tensor g = all_gather_invariant(gelu(r), "mp", "heads");
  (void)sum(g * g, {"batch", "seq", "heads", "head_dim"});
}

debug::MeshRecords recorded(const std::string& mesh, const Inputs& in, bool planted_bug, bool deterministic) {
  RuntimeOptions options;
  options.deterministic = deterministic;
  Runtime rt = Runtime::local(Mesh::parse(mesh), options);
  return debug::record_ops(rt, [&](Shard& s) { model(s, in, planted_bug); });
}

std::vector<std::string> names_of(const std::vector<debug::OpRecord>& records) {
  std::vector<std::string> out;
  for (const auto& r : records) out.push_back(r.op);
  return out;
}

// The position of the first op named `op`.
std::size_t position_of(const std::vector<debug::OpRecord>& records, const std::string& op) {
  for (const auto& r : records)
    if (r.op == op) return r.index;
  FAIL("no op " << op);
  return 0;
}

}  // namespace

TEST_CASE("OpRecorder: each outermost op once, with the values it returned", "[unit][locator]") {
  const Tensor a = random_normal(Shape{{"i", 3}, {"k", 5}}, 1, "a");
  const Tensor b = random_normal(Shape{{"j", 2}, {"k", 5}}, 1, "b");  // k not leading: dot permutes inside
  Tensor y, z, n;
  std::vector<debug::OpRecord> records;
  {
    debug::OpRecorder recorder;
    y = dot(a, b, "k");
    z = exp(y);
    n = layer_norm(z, "j", full(Shape{{"j", 2}}, 1.0), full(Shape{{"j", 2}}, 0.0));
    records = recorder.take();
  }
  (void)exp(y);  // after the recorder: not recorded
  REQUIRE(names_of(records) == std::vector<std::string>{"dot", "exp", "layer_norm"});
  for (const auto& r : records) REQUIRE(r.unread.empty());
  REQUIRE(records[0].values.size() == 1);
  REQUIRE(records[0].values[0].values == y.to_vector<double>());
  REQUIRE(records[0].values[0].shape == y.shape());
  REQUIRE(records[1].values[0].values == z.to_vector<double>());
  REQUIRE(records[2].values.size() == 1);  // no gradient: layer_norm keeps no statistics
  REQUIRE(records[2].values[0].values == n.to_vector<double>());
}

TEST_CASE("OpRecorder: the backward's ops in their phase; a failing op", "[unit][locator]") {
  const Tensor x = parameter(random_normal(Shape{{"i", 3}, {"j", 4}}, 2, "x"));
  std::vector<debug::OpRecord> records;
  {
    debug::OpRecorder recorder;
    Tensor loss;
    {
      const trace::Span forward("phase", "forward");
      loss = sum(layer_norm(x, "j", full(Shape{{"j", 4}}, 1.0), full(Shape{{"j", 4}}, 0.0)) * x, {"i", "j"});
    }
    const trace::Span backward("phase", "backward");
    (void)grad(loss, {x});
    CHECK_THROWS(exp(full(Shape{{"i", 2}}, 1.0, DType::i32)));
    records = recorder.take();
  }
  REQUIRE(records.size() > 4);
  REQUIRE(records[0].op == "layer_norm");
  REQUIRE(records[0].context == "forward");
  REQUIRE(records[0].values.size() == 1);
  REQUIRE(records[1].op == "mul");
  REQUIRE(records[2].op == "sum");
  REQUIRE(records[3].context == "backward");
  REQUIRE(records.back().op == "exp");
  REQUIRE(records.back().unread == "the op failed");
  REQUIRE(records.back().values.empty());
}

TEST_CASE("locator: the model shows no difference between one and two devices along mp", "[mesh][locator]") {
  const Inputs in;
  const bool deterministic = GENERATE(false, true);
  INFO("deterministic mode " << deterministic);
  const auto one = recorded("dp=1,mp=1", in, false, deterministic), two = recorded("dp=1,mp=2", in, false, deterministic);
  const auto c = debug::compare_records(one, two);
  INFO(debug::describe(c, "dp=1,mp=1", "dp=1,mp=2"));
  REQUIRE_FALSE(c.first.found);
  // Every op but the collectives over one device (aliases of their inputs) compared; the two devices
  // also ran shard's own check that they were given the same tables (pmax of a hash), passed over.
  REQUIRE(names_of(one.devices[0]) == std::vector<std::string>{"embedding", "psum", "add", "dot", "rotary", "gelu",
                                                                "all_gather_invariant", "mul", "sum"});
  REQUIRE(c.ops_compared == 7);
  REQUIRE(debug::describe(c, "1x1", "1x2").find("no difference in 7 ops") != std::string::npos);
}

TEST_CASE("locator: names the planted sharding bug by op and position", "[mesh][locator]") {
  const Inputs in;
  const bool deterministic = GENERATE(false, true);
  INFO("deterministic mode " << deterministic);
  const auto one = recorded("dp=1,mp=1", in, true, deterministic), two = recorded("dp=1,mp=2", in, true, deterministic);
  const auto c = debug::compare_records(one, two);
  const std::string report = debug::describe(c, "dp=1,mp=1", "dp=1,mp=2");
  INFO(report);
  REQUIRE(c.first.found);
  REQUIRE(c.first.kind == "value");
  REQUIRE(c.first.op == "rotary");
  REQUIRE(c.first.index == 4);
  REQUIRE(two.devices[0][c.first.other_index].op == "rotary");
  REQUIRE(c.first.shape == "f32[batch=2, seq=4, heads=4, head_dim=4]");
  // Exactly device 1's heads (2 and 3) are wrong, every element of them; the first at head 2.
  REQUIRE(c.first.differing == kBatch * kSeq * 2 * kHeadDim);
  REQUIRE(c.first.first_at == "batch=0, seq=0, heads=2, head_dim=0");
  REQUIRE(c.first.a != c.first.b);
  REQUIRE(report.find("first difference: op 4") != std::string::npos);
  REQUIRE(report.find("rotary") != std::string::npos);
  // The ops before it agreed: embedding, add, dot (the psum over one device is an alias), then it.
  REQUIRE(c.ops_compared == 4);
}

TEST_CASE("locator: a contraction cut over mp is rebuilt from its partial sums", "[mesh][locator]") {
  // Small integers: every sum is exact, so one device and the partial sums of two must agree bitwise.
  std::vector<double> values(4 * 6);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(static_cast<int>(i % 7) - 3);
  const Tensor a = from_vector(Shape{{"i", 4}, {"k", 6}}, values, DType::f32);
  auto program = [&](Shard& s) {
    const Tensor x = s.shard(a, {{"k", "mp"}});
    const Tensor partial = dot(x, rename(x, "i", "j"), "k");  // a partial sum over mp
    (void)psum(partial, "mp");
  };
  Runtime one = Runtime::local(Mesh::parse("dp=1,mp=1")), two = Runtime::local(Mesh::parse("dp=1,mp=2"));
  const auto on_one = debug::record_ops(one, program);
  auto on_two = debug::record_ops(two, program);
  const std::size_t at = position_of(on_two.devices[1], "dot");
  const debug::OpRecord& dot_on_two = on_two.devices[1][at];
  REQUIRE(dot_on_two.op == "dot");
  REQUIRE(dot_on_two.values[0].vary.partial_sum("mp"));
  const auto c = debug::compare_records(on_one, on_two);
  INFO(debug::describe(c, "1x1", "1x2"));
  REQUIRE_FALSE(c.first.found);
  REQUIRE(c.ops_compared == 1);  // the dot (rename and the psum over one device are aliases)
  // One partial sum off by one at [i=1, j=2]: the rebuilt sum differs there, and only there.
  on_two.devices[1][at].values[0].values[1 * 4 + 2] += 1;
  const auto off = debug::compare_records(on_one, on_two);
  INFO(debug::describe(off, "1x1", "1x2"));
  REQUIRE(off.first.found);
  REQUIRE(off.first.op == "dot");
  REQUIRE(off.first.differing == 1);
  REQUIRE(off.first.first_at == "i=1, j=2");
  REQUIRE(off.first.b == off.first.a + 1);
}

TEST_CASE("locator: deterministic mode's sum of partial sums is rebuilt term by term, as psum finishes it", "[mesh][locator]") {
  // On two devices a = (2^24 | -2^24) and b = (1 | 2) per device. psum(a + b) adds each term's ranks,
  // then the terms: 0 + 3 = 3, as one device computes. Adding each device's a + b first would give
  // 2^24 + (2 - 2^24) = 2 in f32 (2^24 + 1 rounds to 2^24): rebuilding the add that way would be a
  // false difference.
  const Tensor big = from_vector(Shape{{"i", 1}, {"k", 2}}, std::vector<float>{16777216.0f, -16777216.0f});
  const Tensor small = from_vector(Shape{{"i", 1}, {"k", 2}}, std::vector<float>{1.0f, 2.0f});
  const Tensor ones = full(Shape{{"k", 2}}, 1.0);
  std::vector<double> results;
  auto program = [&](Shard& s) {
    const AxisRules rules{{"k", "mp"}};
    const Tensor w = s.shard(ones, rules);
    const Tensor y = psum(dot(s.shard(big, rules), w, "k") + dot(s.shard(small, rules), w, "k"), "mp");
    if (s.device() == 0) results.push_back(y.item());
  };
  RuntimeOptions deterministic;
  deterministic.deterministic = true;
  Runtime one = Runtime::local(Mesh::parse("dp=1,mp=1"), deterministic), two = Runtime::local(Mesh::parse("dp=1,mp=2"), deterministic);
  const auto on_one = debug::record_ops(one, program), on_two = debug::record_ops(two, program);
  REQUIRE(results == std::vector<double>{3.0, 3.0});
  const auto& add_on_two = on_two.devices[0][position_of(on_two.devices[0], "add")];
  REQUIRE(add_on_two.values.size() == 1);
  REQUIRE(add_on_two.values[0].terms.size() == 2);
  REQUIRE(add_on_two.values[0].values == std::vector<double>{16777216.0});  // 2^24 + 1 rounded in f32
  const auto c = debug::compare_records(on_one, on_two);
  INFO(debug::describe(c, "1x1", "1x2"));
  REQUIRE_FALSE(c.first.found);
  REQUIRE(c.ops_compared == 3);  // dot, dot, add (the psum over one device is an alias)
  // The same records without the terms: each device's a + b added across devices differs, at the add.
  auto naive = on_two;
  for (auto& device : naive.devices) device[position_of(device, "add")].values[0].terms.clear();
  const auto wrong = debug::compare_records(on_one, naive);
  REQUIRE(wrong.first.found);
  REQUIRE(wrong.first.op == "add");
  REQUIRE(wrong.first.a == 3.0);
  REQUIRE(wrong.first.b == 2.0);
}

TEST_CASE("locator: a tree of adds of partial sums is rebuilt as psum redoes it", "[mesh][locator]") {
  // psum((a + b) + c) on two devices is (psum(a) + psum(b)) + psum(c) = (0 + 3) + 12 = 15; each
  // device's (a + b) rebuilt without its own terms would give 2 + 12 = 14 (2^24 + 1 rounds in f32).
  const Tensor big = from_vector(Shape{{"k", 2}}, std::vector<float>{16777216.0f, -16777216.0f});
  const Tensor small = from_vector(Shape{{"k", 2}}, std::vector<float>{1.0f, 2.0f});
  const Tensor third = from_vector(Shape{{"k", 2}}, std::vector<float>{4.0f, 8.0f});
  const Tensor ones = full(Shape{{"k", 2}}, 1.0);
  std::vector<double> results;
  auto program = [&](Shard& s) {
    const AxisRules rules{{"k", "mp"}};
    const Tensor w = s.shard(ones, rules);
    auto part = [&](const Tensor& x) { return dot(s.shard(x, rules), w, "k"); };
    const Tensor y = psum((part(big) + part(small)) + part(third), "mp");
    if (s.device() == 0) results.push_back(y.item());
  };
  RuntimeOptions deterministic;
  deterministic.deterministic = true;
  Runtime one = Runtime::local(Mesh::parse("dp=1,mp=1"), deterministic), two = Runtime::local(Mesh::parse("dp=1,mp=2"), deterministic);
  const auto on_one = debug::record_ops(one, program), on_two = debug::record_ops(two, program);
  REQUIRE(results == std::vector<double>{15.0, 15.0});
  const auto& outer = on_two.devices[0][position_of(on_two.devices[0], "psum") - 1];
  REQUIRE(outer.op == "add");
  REQUIRE(outer.values[0].terms.size() == 2);
  REQUIRE(outer.values[0].terms[0].terms.size() == 2);  // (a + b) keeps its own terms
  const auto c = debug::compare_records(on_one, on_two);
  INFO(debug::describe(c, "1x1", "1x2"));
  REQUIRE_FALSE(c.first.found);
  REQUIRE(c.ops_compared == 5);  // three dots, two adds
}

TEST_CASE("locator: a value scaled by an exact power of two is passed over with a note, another scale is a finding", "[mesh][locator]") {
  auto program = [](Shard&) {
    const double n = axis_size("mp");
    const Tensor share = full(Shape{{"i", 3}}, 1.0) / n;  // 1 on one device, 1/2 on two: the mesh's own scale
    (void)(share + n);                                      // 2 and 2.5: not a scale, a difference
  };
  Runtime one = Runtime::local(Mesh::parse("dp=1,mp=1")), two = Runtime::local(Mesh::parse("dp=1,mp=2"));
  const auto c = debug::compare_records(debug::record_ops(one, program), debug::record_ops(two, program));
  const std::string report = debug::describe(c, "1x1", "1x2");
  INFO(report);
  REQUIRE(c.notes.size() == 1);
  REQUIRE(c.notes[0].find("op 0 (div): mesh dp=1,mp=2's value is exactly 0.5 times") != std::string::npos);
  REQUIRE(c.first.found);
  REQUIRE(c.first.op == "add");
  REQUIRE(c.first.a == 2.0);
  REQUIRE(c.first.b == 2.5);
}

TEST_CASE("locator: devices disagreeing on an Invariant value are a finding", "[mesh][locator]") {
  auto program = [](Shard& s) {
    const Tensor wrong = full(Shape{{"i", 3}}, static_cast<double>(s.device()));  // typed Invariant, but per device
    (void)exp(wrong);
  };
  Runtime one = Runtime::local(Mesh::parse("dp=1,mp=1")), two = Runtime::local(Mesh::parse("dp=1,mp=2"));
  const auto c = debug::compare_records(debug::record_ops(one, program), debug::record_ops(two, program));
  INFO(debug::describe(c, "1x1", "1x2"));
  REQUIRE(c.first.found);
  REQUIRE(c.first.kind == "invariant");
  REQUIRE(c.first.op == "exp");
  REQUIRE(c.first.mesh == "dp=1,mp=2");
  REQUIRE(c.first.differing == 3);
}

TEST_CASE("locator: meshes running different ops are a finding, collectives one mesh skips are not", "[mesh][locator]") {
  auto program = [](Shard& s) {
    Tensor x = full(Shape{{"i", 3}}, 2.0);
    if (s.mesh().axis_size("mp") > 1) x = pmax(pvary(x, "mp"), "mp");  // collectives only mp=2 runs: passed over
    x = exp(x);
    if (s.mesh().axis_size("mp") > 1) x = x + 0.0;  // an op only mp=2 runs: a finding
    (void)sqrt(x);
  };
  Runtime one = Runtime::local(Mesh::parse("dp=1,mp=1")), two = Runtime::local(Mesh::parse("dp=1,mp=2"));
  const auto c = debug::compare_records(debug::record_ops(one, program), debug::record_ops(two, program));
  const std::string report = debug::describe(c, "1x1", "1x2");
  INFO(report);
  REQUIRE(c.first.found);
  REQUIRE(c.first.kind == "program");
  REQUIRE(c.first.op == "sqrt");
  REQUIRE(report.find("ran different programs") != std::string::npos);
}
