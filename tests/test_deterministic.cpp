// Deterministic mode (RuntimeOptions::deterministic, docs/determinism.md) at the op layer: psum adds
// the ranks in the canonical tree, a sum of partial sums is finished term by term, gradients and
// values come out bit-identical on every mesh, and what the mode cannot make mesh-independent is
// an error naming it. The whole GPT-J run is tests/determinism/meshes.sh.
#include <cstring>

#include "deterministic/deterministic.h"
#include "helpers.h"
#include "nax/kernels/sum_tree.h"
#include "nax/ops/async_collectives.h"

using namespace nax;

namespace {

const std::vector<std::string> kMeshes = {"dp=1,mp=1", "dp=1,mp=2", "dp=2,mp=1", "dp=2,mp=2", "dp=1,mp=4", "dp=4,mp=1"};

Runtime deterministic_runtime(const std::string& mesh) { return Runtime::local(Mesh::parse(mesh), {.deterministic = true}); }

// Values whose sum depends on the order of addition in f32: magnitudes from 1e-3 to 1e8, both signs.
Tensor spread_values(const Shape& shape, std::uint64_t seed) {
  const Tensor u = random_uniform(shape, seed, "spread", -1.0, 1.0, DType::f64);
  const Tensor e = random_uniform(shape, seed, "exponent", -3.0, 8.0, DType::f64);
  std::vector<float> out(static_cast<std::size_t>(shape.numel()));
  const auto uv = u.to_vector<double>(), ev = e.to_vector<double>();
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(uv[i] * std::pow(10.0, ev[i]));
  return from_vector(shape, out);
}

std::vector<std::uint32_t> bits(const Tensor& t) {
  const auto v = t.to_vector<float>();
  std::vector<std::uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

float host_tree(const std::vector<float>& x) { return tree_sum(x.data(), static_cast<std::int64_t>(x.size()), SumTree{.on = true}); }

}  // namespace

TEST_CASE("deterministic psum adds the ranks pairwise, then the pairs, whatever the backend would do", "[mesh][deterministic]") {
  // Both psum paths: the communicator's own reduction, and the gather of every rank's value.
  const deterministic::GatherPsumsForTesting gather(GENERATE(false, true));
  const Shape shape{{"i", 64}};
  std::vector<Tensor> inputs;
  for (int d = 0; d < 4; ++d) inputs.push_back(spread_values(shape, 100 + static_cast<std::uint64_t>(d)));
  std::vector<float> want(64);
  for (std::size_t i = 0; i < 64; ++i) {
    float v[4];
    for (int d = 0; d < 4; ++d) v[d] = inputs[static_cast<std::size_t>(d)].to_vector<float>()[i];
    want[i] = (v[0] + v[1]) + (v[2] + v[3]);
  }
  Runtime rt = deterministic_runtime("mp=4");
  const auto got = rt.run([&](Shard& s) { return bits(psum(pvary(s.shard(inputs[static_cast<std::size_t>(s.device())], {}), "mp"), "mp")); });
  std::vector<std::uint32_t> want_bits(64);
  std::memcpy(want_bits.data(), want.data(), sizeof(float) * 64);
  for (const auto& g : got) REQUIRE(g == want_bits);
}

TEST_CASE("deterministic psum_scatter gives each rank its block added in the same tree", "[mesh][deterministic]") {
  // Both psum paths: the communicator's own reduction, and the gather of every rank's value.
  const deterministic::GatherPsumsForTesting gather(GENERATE(false, true));
  const Shape shape{{"i", 8}, {"j", 4}};
  std::vector<Tensor> inputs;
  for (int d = 0; d < 4; ++d) inputs.push_back(spread_values(shape, 200 + static_cast<std::uint64_t>(d)));
  Runtime rt = deterministic_runtime("mp=4");
  const auto got = rt.run([&](Shard& s) {
    return bits(psum_scatter(pvary(s.shard(inputs[static_cast<std::size_t>(s.device())], {}), "mp"), "mp", "i"));
  });
  for (int d = 0; d < 4; ++d)
    for (std::size_t e = 0; e < 8; ++e) {  // rank d holds rows 2d, 2d+1
      const std::size_t global = static_cast<std::size_t>(d) * 8 + e;
      float v[4];
      for (int r = 0; r < 4; ++r) v[r] = inputs[static_cast<std::size_t>(r)].to_vector<float>()[global];
      const float want = (v[0] + v[1]) + (v[2] + v[3]);
      std::uint32_t want_bits;
      std::memcpy(&want_bits, &want, sizeof want);
      REQUIRE(got[static_cast<std::size_t>(d)][e] == want_bits);
    }
}

TEST_CASE("deterministic sums over a cut axis equal one device's canonical tree, even summed together before psum",
          "[mesh][deterministic]") {
  // Both psum paths: the communicator's own reduction, and the gather of every rank's value.
  const deterministic::GatherPsumsForTesting gather(GENERATE(false, true));
  const Shape global{{"k", 64}, {"i", 3}};
  const Tensor x = spread_values(global, 7), y = spread_values(global, 8);
  // The canonical trees of x's and y's columns, computed here on the host.
  std::vector<float> want(3);
  for (std::int64_t i = 0; i < 3; ++i) {
    std::vector<float> cx, cy;
    for (std::int64_t k = 0; k < 64; ++k) {
      cx.push_back(x.to_vector<float>()[static_cast<std::size_t>(k * 3 + i)]);
      cy.push_back(y.to_vector<float>()[static_cast<std::size_t>(k * 3 + i)]);
    }
    want[static_cast<std::size_t>(i)] = host_tree(cx) + host_tree(cy);
  }
  std::vector<std::uint32_t> want_bits(3);
  std::memcpy(want_bits.data(), want.data(), sizeof(float) * 3);
  for (const std::string mesh : {"mp=1", "mp=2", "mp=4"}) {
    INFO("mesh " << mesh);
    Runtime rt = deterministic_runtime(mesh);
    const AxisRules rules{{"k", "mp"}};
    const auto got = rt.run([&](Shard& s) { return bits(psum(sum(s.shard(x, rules), "k") + sum(s.shard(y, rules), "k"), "mp")); });
    for (const auto& g : got) REQUIRE(g == want_bits);
  }
}

TEST_CASE("deterministic gradients of a tensor-parallel MLP are bit-identical on every mesh", "[mesh][deterministic]") {
  // Both psum paths: the communicator's own reduction, and the gather of every rank's value.
  const deterministic::GatherPsumsForTesting gather(GENERATE(false, true));
  const Tensor x = spread_values(Shape{{"batch", 8}, {"embed", 16}}, 1);
  const Tensor w1 = random_normal(Shape{{"embed", 16}, {"mlp", 64}}, 2, "w1", 0.3);
  const Tensor w2 = random_normal(Shape{{"mlp", 64}, {"embed", 16}}, 3, "w2", 0.3);
  const AxisRules rules{{"batch", "dp"}, {"mlp", "mp"}};
  std::vector<std::vector<std::uint32_t>> first;
  for (const auto& mesh : kMeshes) {
    INFO("mesh " << mesh);
    Runtime rt = deterministic_runtime(mesh);
    const auto results = rt.run([&](Shard& s) {
      const Tensor xs = s.shard(x, rules);
      auto [loss, grads] = value_and_grad(
          [&](const std::vector<Tensor>& p) {
            const Tensor y = psum(dot(gelu(dot(xs, p[0], "embed")), p[1], "mlp"), "mp");
            return pmean(mean(square(y), {"batch", "embed"}), "dp");
          },
          {s.shard(w1, rules), s.shard(w2, rules)});
      std::vector<std::vector<std::uint32_t>> out{bits(loss)};
      for (const auto& g : grads) out.push_back(bits(s.gather(g)));
      return out;
    });
    for (const auto& r : results) {
      if (first.empty()) first = r;
      REQUIRE(r == first);
    }
  }
}

TEST_CASE("deterministic mode refuses what it cannot make mesh-independent, naming it", "[mesh][deterministic][errors]") {
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_WITH(deterministic_runtime("dp=3"), Contains("power of two") && Contains("'dp'"));

  Runtime rt = deterministic_runtime("dp=2,mp=2");
  const AxisRules rules{{"k", "mp"}, {"batch", "dp"}};
  const Tensor x = random_normal(Shape{{"k", 8}, {"i", 4}}, 1, "x");
  SECTION("an op other than add or psum on a sum of partial sums") {
    REQUIRE_THROWS_WITH(rt.run([&](Shard& s) {
                          const Tensor a = sum(s.shard(x, rules), "k");
                          return psum((a + a) * 2.0, "mp");
                        }),
                        Contains("mul") && Contains("no psum has finished"));
  }
  SECTION("a layout change or negation of a sum of partial sums (its terms would be lost)") {
    const Tensor y = random_normal(Shape{{"k", 8}, {"i", 4}, {"j", 2}}, 4, "y");
    REQUIRE_THROWS_WITH(rt.run([&](Shard& s) {
                          const Tensor a = sum(s.shard(y, rules), "k");
                          return psum(transpose(a + a, {"j", "i"}), "mp");
                        }),
                        Contains("no psum has finished"));
    REQUIRE_THROWS_WITH(rt.run([&](Shard& s) {
                          const Tensor a = sum(s.shard(y, rules), "k");
                          return psum(-(a + a), "mp");
                        }),
                        Contains("neg") && Contains("no psum has finished"));
  }
  SECTION("a partial sum converted to another dtype before its psum") {
    REQUIRE_THROWS_WITH(rt.run([&](Shard& s) { return psum(cast(sum(s.shard(x, rules), "k"), DType::f64), "mp"); }),
                        Contains("cast") && Contains("partial sum over mesh axis 'mp'"));
  }
  SECTION("a bf16 partial sum") {
    REQUIRE_THROWS_WITH(rt.run([&](Shard& s) {
                          const Tensor a = cast(s.shard(x, rules), DType::bf16);
                          return dot(a, a, "k");
                        }),
                        Contains("dot") && Contains("compute in f32"));
  }
  SECTION("pmean of a local mean that went through another op") {
    const Tensor b = random_normal(Shape{{"batch", 6}, {"j", 1}}, 2, "b");
    REQUIRE_THROWS_WITH(rt.run([&](Shard& s) { return pmean(mean(s.shard(b, rules), "batch") * 2.0, "dp"); }),
                        Contains("pmean") && Contains("local mean that went through another op"));
  }
  SECTION("a sum whose cut axis is not the first it walks") {
    const Tensor c = random_normal(Shape{{"i", 4}, {"k", 8}}, 3, "c");
    REQUIRE_THROWS_WITH(rt.run([&](Shard& s) { return sum(s.shard(c, rules), {"i", "k"}); }),
                        Contains("sum") && Contains("'k'") && Contains("behind another axis"));
  }
}

TEST_CASE("deterministic mode's max cut: the most devices a sum may be cut over, the same bits on every mesh under it",
          "[mesh][deterministic][errors]") {
  using Catch::Matchers::Contains;
  const Shape global{{"k", 64}, {"i", 3}};
  const Tensor x = spread_values(global, 9);
  const AxisRules rules{{"k", "mp"}};
  auto summed = [&](const std::string& mesh, std::int64_t max_cut) {
    Runtime rt = Runtime::local(Mesh::parse(mesh), {.deterministic = true, .deterministic_max_cut = max_cut});
    return rt.run([&](Shard& s) { return bits(psum(sum(s.shard(x, rules), "k"), "mp")); })[0];
  };
  // Each max cut's trees, on the host: blocks of 64 / max_cut, then leaves of at most 32.
  for (const std::int64_t max_cut : {2, 8, 16}) {
    INFO("max cut " << max_cut);
    std::vector<float> want(3);
    for (std::int64_t i = 0; i < 3; ++i) {
      std::vector<float> column;
      for (std::int64_t k = 0; k < 64; ++k) column.push_back(x.to_vector<float>()[static_cast<std::size_t>(k * 3 + i)]);
      want[static_cast<std::size_t>(i)] = tree_sum(column.data(), 64, SumTree::canonical_for_block_of(1, max_cut));
    }
    std::vector<std::uint32_t> want_bits(3);
    std::memcpy(want_bits.data(), want.data(), sizeof(float) * 3);
    for (const std::string mesh : {"mp=1", "mp=2", "mp=4", "mp=8", "mp=16"}) {
      INFO("mesh " << mesh);
      if (Mesh::parse(mesh).axis_size("mp") > max_cut)
        REQUIRE_THROWS_WITH(summed(mesh, max_cut),
                            Contains("sum") && Contains("deterministic_max_cut") && Contains("NAX_DETERMINISTIC_MAX_CUT"));
      else
        REQUIRE(summed(mesh, max_cut) == want_bits);
    }
  }
  // The max cut fixes the trees' first halvings: 2 and 64 add 64 terms in different orders, so some
  // sums differ in their last bits.
  int differing = 0;
  for (std::uint64_t seed = 20; seed < 40; ++seed) {
    const auto v = spread_values(Shape{{"k", 64}}, seed).to_vector<float>();
    differing += tree_sum(v.data(), 64, SumTree::canonical_for_block_of(1, 2)) !=
                 tree_sum(v.data(), 64, SumTree::canonical_for_block_of(1, 64));
  }
  REQUIRE(differing > 0);
  REQUIRE_THROWS_WITH(Runtime::local(Mesh::parse("mp=2"), {.deterministic = true, .deterministic_max_cut = 6}),
                      Contains("deterministic_max_cut") && Contains("power of two"));
}

TEST_CASE("deterministic psum over several mesh axes adds the ranks in mesh order, however the call names them",
          "[mesh][deterministic]") {
  // Both psum paths: the communicator's own reduction, and the gather of every rank's value.
  const deterministic::GatherPsumsForTesting gather(GENERATE(false, true));
  const Shape shape{{"i", 16}};
  Runtime rt = deterministic_runtime("dp=2,mp=2");
  const auto results = rt.run([&](Shard& s) {
    const Tensor x = pvary(s.shard(spread_values(shape, 300 + static_cast<std::uint64_t>(s.device())), {}), {"dp", "mp"});
    return std::vector<std::vector<std::uint32_t>>{bits(psum(x, {"dp", "mp"})), bits(psum(x, {"mp", "dp"}))};
  });
  for (const auto& r : results) {
    REQUIRE(r[0] == r[1]);
    REQUIRE(r[0] == results[0][0]);
  }
}

TEST_CASE("deterministic start_psum and start_psum_scatter give the blocking forms' bits", "[mesh][deterministic]") {
  // Both psum paths: the communicator's own reduction, and the gather of every rank's value.
  const deterministic::GatherPsumsForTesting gather(GENERATE(false, true));
  const Shape shape{{"i", 8}, {"j", 4}};
  Runtime rt = deterministic_runtime("mp=4");
  const auto results = rt.run([&](Shard& s) {
    const Tensor x = pvary(s.shard(spread_values(shape, 400 + static_cast<std::uint64_t>(s.device())), {}), "mp");
    Pending<Tensor> summed = start_psum(x, "mp");
    Pending<Tensor> scattered = start_psum_scatter(x, "mp", "i");
    return std::vector<std::vector<std::uint32_t>>{bits(summed.wait()), bits(psum(x, "mp")), bits(scattered.wait()),
                                                   bits(psum_scatter(x, "mp", "i"))};
  });
  for (const auto& r : results) {
    REQUIRE(r[0] == r[1]);
    REQUIRE(r[2] == r[3]);
  }
}

TEST_CASE("deterministic pmean of local means over uneven counts gives one device's mean", "[mesh][deterministic]") {
  // Both psum paths: the communicator's own reduction, and the gather of every rank's value.
  const deterministic::GatherPsumsForTesting gather(GENERATE(false, true));
  // 6 rows: 3 per device on dp=2, so (s0/3 + s1/3)/2 would round three times where one device
  // rounds once.
  const Tensor x = spread_values(Shape{{"batch", 6}, {"j", 5}}, 9);
  const AxisRules rules{{"batch", "dp"}};
  std::vector<std::vector<std::uint32_t>> first;
  for (const std::string mesh : {"dp=1", "dp=2"}) {
    Runtime rt = deterministic_runtime(mesh);
    const auto got = rt.run([&](Shard& s) {
      auto [value, grads] = value_and_grad([&](const std::vector<Tensor>& p) { return sum(pmean(mean(p[0], "batch"), "dp"), "j"); },
                                           {s.shard(x, rules)});
      return std::vector<std::vector<std::uint32_t>>{bits(value), bits(s.gather(grads[0]))};
    });
    for (const auto& g : got) {
      if (first.empty()) first = g;
      REQUIRE(g == first);
    }
  }
}

TEST_CASE("deterministic psum_scatter of a sum of partial sums equals one device's sum, block by block", "[mesh][deterministic]") {
  // Both psum paths: the communicator's own reduction, and the gather of every rank's value.
  const deterministic::GatherPsumsForTesting gather(GENERATE(false, true));
  const Shape global{{"k", 64}, {"i", 4}, {"j", 2}};
  const Tensor x = spread_values(global, 17), y = spread_values(global, 18);
  std::vector<float> want;
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t j = 0; j < 2; ++j) {
      std::vector<float> cx, cy;
      for (std::int64_t k = 0; k < 64; ++k) {
        cx.push_back(x.to_vector<float>()[static_cast<std::size_t>((k * 4 + i) * 2 + j)]);
        cy.push_back(y.to_vector<float>()[static_cast<std::size_t>((k * 4 + i) * 2 + j)]);
      }
      want.push_back(host_tree(cx) + host_tree(cy));
    }
  std::vector<std::uint32_t> want_bits(want.size());
  std::memcpy(want_bits.data(), want.data(), sizeof(float) * want.size());
  for (const std::string mesh : {"mp=1", "mp=2", "mp=4"}) {
    INFO("mesh " << mesh);
    Runtime rt = deterministic_runtime(mesh);
    const AxisRules rules{{"k", "mp"}};
    for (const std::string axis : {"i", "j"}) {
      if (axis == "j" && mesh == "mp=4") continue;  // j has 2 elements
      INFO("scattered along " << axis);
      const auto got = rt.run([&](Shard& s) {
        const Tensor sum_ab = sum(s.shard(x, rules), "k") + sum(s.shard(y, rules), "k");
        return bits(transpose(all_gather_invariant(psum_scatter(sum_ab, "mp", axis), "mp", axis), {"i", "j"}));
      });
      for (const auto& g : got) REQUIRE(g == want_bits);
    }
  }
}

TEST_CASE("deterministic psum of a difference of partial sums equals one device's difference of the trees", "[mesh][deterministic]") {
  // Both psum paths: the communicator's own reduction, and the gather of every rank's value.
  const deterministic::GatherPsumsForTesting gather(GENERATE(false, true));
  const Shape global{{"k", 64}, {"i", 3}};
  const Tensor x = spread_values(global, 9), y = spread_values(global, 10);
  std::vector<float> want(3);
  for (std::int64_t i = 0; i < 3; ++i) {
    std::vector<float> cx, cy;
    for (std::int64_t k = 0; k < 64; ++k) {
      cx.push_back(x.to_vector<float>()[static_cast<std::size_t>(k * 3 + i)]);
      cy.push_back(y.to_vector<float>()[static_cast<std::size_t>(k * 3 + i)]);
    }
    want[static_cast<std::size_t>(i)] = host_tree(cx) - host_tree(cy);
  }
  std::vector<std::uint32_t> want_bits(3);
  std::memcpy(want_bits.data(), want.data(), sizeof(float) * 3);
  for (const std::string mesh : {"mp=1", "mp=2", "mp=4"}) {
    INFO("mesh " << mesh);
    Runtime rt = deterministic_runtime(mesh);
    const AxisRules rules{{"k", "mp"}};
    const auto got = rt.run([&](Shard& s) { return bits(psum(sum(s.shard(x, rules), "k") - sum(s.shard(y, rules), "k"), "mp")); });
    for (const auto& g : got) REQUIRE(g == want_bits);
  }
}

TEST_CASE("deterministic psum of a sum of partial sums over one mesh axis, then another, equals one device's sum",
          "[mesh][deterministic]") {
  // Both psum paths: the communicator's own reduction, and the gather of every rank's value.
  const deterministic::GatherPsumsForTesting gather(GENERATE(false, true));
  const Shape global{{"k", 64}, {"i", 4}};
  const Tensor x = spread_values(global, 27), y = spread_values(global, 28);
  std::vector<float> want;
  for (std::int64_t i = 0; i < 4; ++i) {
    std::vector<float> cx, cy;
    for (std::int64_t k = 0; k < 64; ++k) {
      cx.push_back(x.to_vector<float>()[static_cast<std::size_t>(k * 4 + i)]);
      cy.push_back(y.to_vector<float>()[static_cast<std::size_t>(k * 4 + i)]);
    }
    want.push_back(host_tree(cx) + host_tree(cy));
  }
  std::vector<std::uint32_t> want_bits(want.size());
  std::memcpy(want_bits.data(), want.data(), sizeof(float) * want.size());
  for (const std::string mesh : {"mp=1,cp=1", "mp=2,cp=2", "mp=1,cp=4", "mp=4,cp=1"}) {
    INFO("mesh " << mesh);
    Runtime rt = deterministic_runtime(mesh);
    AxisRules rules;
    rules.set("k", {"mp", "cp"});  // k cut mp-major: the minor cut (cp) is finished first
    const auto got = rt.run([&](Shard& s) {
      const Tensor sum_ab = sum(s.shard(x, rules), "k") + sum(s.shard(y, rules), "k");
      const Tensor scattered = psum(psum_scatter(sum_ab, "cp", "i"), "mp");
      return std::vector<std::vector<std::uint32_t>>{bits(psum(psum(sum_ab, "cp"), "mp")), bits(all_gather_invariant(scattered, "cp", "i"))};
    });
    for (const auto& g : got) {
      REQUIRE(g[0] == want_bits);
      REQUIRE(g[1] == want_bits);
    }
  }
}

TEST_CASE("deterministic psum over one mesh axis, then another, of a difference and a broadcast sum: gradients reach every term, "
          "and the started forms give the blocking forms' bits", "[mesh][deterministic]") {
  const Shape global{{"k", 64}, {"i", 4}}, row{{"k", 64}};
  const Tensor x = spread_values(global, 37), y = spread_values(global, 38), z = spread_values(row, 39);
  Runtime rt = deterministic_runtime("mp=2,cp=2");
  AxisRules rules;
  rules.set("k", {"mp", "cp"});
  const auto got = rt.run([&](Shard& s) {
    // sum over k of x - y, and of x + z broadcast along i: partial sums over mp and cp, kept as terms
    auto [loss, grads] = value_and_grad(
        [](const std::vector<Tensor>& p) {
          const Tensor difference = sum(p[0], "k") - sum(p[1], "k");
          const Tensor broadcast = sum(p[0], "k") + sum(p[2], "k");
          return sum(psum(psum(difference, "cp"), "mp") + psum(psum(broadcast, "cp"), "mp"), "i");
        },
        {s.shard(x, rules), s.shard(y, rules), s.shard(z, rules)});
    const Tensor xs = s.shard(x, rules);
    const Tensor difference = sum(xs, "k") - sum(s.shard(y, rules), "k");
    const bool started_same = bits(start_psum(difference, "cp").wait()) == bits(psum(difference, "cp")) &&
                              bits(all_gather_invariant(start_psum_scatter(difference, "cp", "i").wait(), "cp", "i")) ==
                                  bits(all_gather_invariant(psum_scatter(difference, "cp", "i"), "cp", "i"));
    return std::make_tuple(s.gather(grads[0]).to_vector<double>(), s.gather(grads[1]).to_vector<double>(),
                           s.gather(grads[2]).to_vector<double>(), started_same);
  });
  for (const auto& [dx, dy, dz, started_same] : got) {
    CHECK(started_same);
    for (double g : dx) REQUIRE(g == 2.0);  // x is read by both sums
    for (double g : dy) REQUIRE(g == -1.0);
    for (double g : dz) REQUIRE(g == 4.0);  // z is broadcast along i (4)
  }
}
