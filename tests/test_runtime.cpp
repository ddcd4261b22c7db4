// The SPMD runtime: running on every device, sharding and gathering global tensors, random blocks
// that do not depend on the mesh, memory that does not grow across steps.
#include <fmt/format.h>

#include "helpers.h"

using namespace nax;

namespace {

// Axis rules worth testing on a mesh: each axis cutting one tensor axis, and 2-D cuts of one axis.
std::vector<AxisRules> rules_for(const Mesh& mesh) {
  auto names = mesh.axis_names();
  std::vector<AxisRules> out{AxisRules{}, AxisRules{{"b", names[0]}}};
  if (names.size() > 1) {
    out.push_back(AxisRules{{"a", names[0]}, {"b", names[1]}});
    out.push_back(AxisRules{{"b", {names[0], names[1]}}});
    out.push_back(AxisRules{{"b", {names[1], names[0]}}});
  }
  return out;
}

Shape global_shape(const Mesh& mesh) { return Shape{{"a", 2 * mesh.size()}, {"b", 3 * mesh.size()}, {"c", 2}}; }

}  // namespace

TEST_CASE("run executes on every device and returns values in device order", "[mesh][runtime]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=3"));
  REQUIRE(Shard::current() == nullptr);
  auto ids = rt.run([](Shard& s) {
    NAX_EXPECT(Shard::current() == &s);
    return s.device() * 10 + s.coord("mp");
  });
  REQUIRE(ids == std::vector<int>{0, 11, 22, 30, 41, 52});
  int calls = 0;
  std::mutex m;
  rt.run([&](Shard&) {
    std::lock_guard lock(m);
    ++calls;
  });
  REQUIRE(calls == 6);
}

TEST_CASE("shard then gather gives the global tensor back on every mesh and rule", "[mesh][runtime]") {
  for (const auto& spec : nax::testing::test_meshes()) {
    Mesh mesh = Mesh::parse(spec);
    Runtime rt = Runtime::local(mesh);
    Tensor global = random_normal(global_shape(mesh), 2, "g");
    for (const auto& rules : rules_for(mesh)) {
      INFO("mesh " << spec << " rules " << rules.str());
      auto results = rt.run([&](Shard& s) {
        Tensor block = s.shard(global, rules);
        // The block is the slice the rules assign to this device.
        Tensor want = global;
        for (const auto& axis : global.shape().axes()) {
          const auto& mesh_axes = rules.mesh_axes(axis.name);
          if (mesh_axes.empty()) continue;
          NAX_EXPECT(block.vary().split_mesh_axes(axis.name) == mesh_axes);
          const std::int64_t n = axis.size / mesh.group_size(mesh_axes), r = mesh.rank_in_group(s.device(), mesh_axes);
          want = slice(want, axis.name, r * n, (r + 1) * n);
        }
        NAX_EXPECT(block.to_vector<double>() == want.to_vector<double>());
        Tensor back = s.gather(block);
        NAX_EXPECT(back.device().is_host());
        return back.to_vector<double>();
      });
      for (const auto& r : results) REQUIRE(r == global.to_vector<double>());
    }
  }
}

TEST_CASE("a device's block of a global random tensor does not depend on the mesh", "[mesh][runtime][rng]") {
  for (const auto& spec : nax::testing::test_meshes()) {
    Mesh mesh = Mesh::parse(spec);
    Runtime rt = Runtime::local(mesh);
    const Shape shape = global_shape(mesh);
    Tensor whole_normal = random_normal(shape, 9, "w", 0.02);
    Tensor whole_uniform = random_uniform(shape, 9, "u", -1, 1);
    for (const auto& rules : rules_for(mesh)) {
      INFO("mesh " << spec << " rules " << rules.str());
      auto results = rt.run([&](Shard& s) {
        Tensor n = s.random_normal(shape, rules, 9, "w", 0.02);
        Tensor u = s.random_uniform(shape, rules, 9, "u", -1, 1);
        NAX_EXPECT(nax::testing::same_values(n, s.shard(whole_normal, rules)));
        return std::pair{s.gather(n).to_vector<double>(), s.gather(u).to_vector<double>()};
      });
      for (const auto& [n, u] : results) {
        REQUIRE(n == whole_normal.to_vector<double>());
        REQUIRE(u == whole_uniform.to_vector<double>());
      }
    }
  }
}

TEST_CASE("device memory after many steps equals memory after one", "[mesh][runtime][memory]") {
  Mesh mesh = Mesh::parse("dp=2,mp=2");
  Runtime rt = Runtime::local(mesh);
  Tensor global = random_normal(Shape{{"batch", 8}, {"embed", 64}}, 1, "x");
  auto step = [&](Shard& s) {
    Tensor x = s.shard(global, {{"batch", "dp"}});
    Tensor w = s.random_normal(Shape{{"embed", 64}, {"mlp", 128}}, {{"mlp", "mp"}}, 1, "w");
    Tensor h = tanh(dot(x, w, "embed"));
    Tensor y = psum(dot(h, w, "mlp"), "mp");
    return sum(y, {"batch", "embed"}).item();
  };
  rt.run(step);
  std::vector<AllocatorStats> after_one;
  for (int d = 0; d < mesh.size(); ++d) after_one.push_back(rt.memory(d));
  for (int i = 0; i < 20; ++i) rt.run(step);
  for (int d = 0; d < mesh.size(); ++d) {
    auto now = rt.memory(d);
    REQUIRE(now.bytes_in_use == 0);
    REQUIRE(now.bytes_reserved == after_one[static_cast<std::size_t>(d)].bytes_reserved);  // served from the cache
    REQUIRE(now.cache_hits > after_one[static_cast<std::size_t>(d)].cache_hits);
    REQUIRE(now.peak_bytes_in_use == after_one[static_cast<std::size_t>(d)].peak_bytes_in_use);
  }
}

TEST_CASE("communicators count calls and bytes per collective kind", "[mesh][runtime]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  rt.run([](Shard&) {
    Tensor x = pvary(ones(Shape{{"i", 256}}), {"dp", "mp"});
    psum(x, "mp");
    psum(x, "dp");
    all_gather(x, "mp", "i");
  });
  for (int d = 0; d < 4; ++d) {
    auto by_axes = rt.comm_stats_by_axes(d);
    REQUIRE(by_axes.size() == 2);
    REQUIRE(total_calls(by_axes.at("mp")) == 2);  // a psum and an all_gather
    REQUIRE(total_bytes(by_axes.at("dp")) == 256 * 4);
    CommStats s = rt.comm_stats(d);
    REQUIRE(s.calls[static_cast<int>(CollectiveKind::all_reduce)] == 2);
    REQUIRE(s.bytes[static_cast<int>(CollectiveKind::all_reduce)] == 2 * 256 * 4);
    REQUIRE(s.calls[static_cast<int>(CollectiveKind::all_gather)] == 1);
  }
}

TEST_CASE("runtimes start and stop cleanly, one after another", "[mesh][runtime]") {
  for (int i = 0; i < 20; ++i) {
    Runtime rt = Runtime::local(Mesh::parse(fmt::format("mp={}", 1 + i % 4)));
    auto sums = rt.run([](Shard&) { return psum(pvary(ones(Shape{{"i", 4}}), "mp"), "mp").to_vector<float>()[0]; });
    for (float v : sums) REQUIRE(v == static_cast<float>(1 + i % 4));
  }
}
