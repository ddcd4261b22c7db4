// The global view: placements, every redistribution's collective, sharding propagation (each dot
// strategy, reductions over sharded axes, elementwise mixes, the cost model's choices), the
// transformer ops over sharded axes without gathering, and gradients through all of it.
#include <fmt/format.h>

#include "helpers.h"

using namespace nax;
using nax::testing::max_rel_error;

namespace {

Tensor host_normal(const Shape& shape, std::string_view name) { return random_normal(shape, 5, name, 1.0, DType::f64); }

// Calls per collective kind made by this device while `fn` ran (all groups together).
template <typename F>
std::map<CollectiveKind, std::size_t> calls_during(Shard& s, F&& fn) {
  auto before = s.comm_stats();
  fn();
  std::map<CollectiveKind, std::size_t> out;
  CommStats d;
  for (const auto& [axes, stats] : s.comm_stats_since(before)) d += stats;
  for (int k = 0; k < kCollectiveKinds; ++k)
    if (d.calls[static_cast<std::size_t>(k)] > 0) out[static_cast<CollectiveKind>(k)] = d.calls[static_cast<std::size_t>(k)];
  return out;
}

std::size_t count(const std::map<CollectiveKind, std::size_t>& calls, CollectiveKind kind) {
  auto it = calls.find(kind);
  return it == calls.end() ? 0 : it->second;
}

std::size_t total(const std::map<CollectiveKind, std::size_t>& calls) {
  std::size_t n = 0;
  for (const auto& [k, c] : calls) n += c;
  return n;
}

// For worker threads, where Catch2's macros (max_rel_error has one) are not safe.
bool close(const Tensor& got, const Tensor& want, double tol = 1e-10) {
  if (!(got.shape() == want.shape())) return false;
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i)
    if (!(std::abs(g[i] - w[i]) <= tol * std::max(1.0, std::abs(w[i])))) return false;
  return true;
}

}  // namespace

TEST_CASE("placements print and compare", "[global]") {
  Placements p{{"dp", Placement::shard("batch")}, {"mp", Placement::partial()}};
  CHECK(p.str() == "{dp: S(batch), mp: P(sum)}");
  CHECK(p.on("pp") == Placement::replicate());
  p.set("mp", Placement::replicate());
  CHECK(p == Placements{{"dp", Placement::shard("batch")}});
  CHECK(Placement::partial(PartialOp::max).str() == "P(max)");
}

TEST_CASE("global tensors: from axis rules to the host and back", "[global]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  const Tensor host = host_normal(Shape{{"batch", 4}, {"heads", 6}, {"d", 3}}, "x");
  rt.run([&](Shard&) {
    GlobalTensor x = GlobalTensor::from_host(host, AxisRules{{"batch", "dp"}, {"heads", "mp"}});
    NAX_EXPECT(x.shape() == host.shape());
    NAX_EXPECT(x.local().shape().size("heads") == 3);
    NAX_EXPECT((x.placements() == Placements{{"dp", Placement::shard("batch")}, {"mp", Placement::shard("heads")}}));
    NAX_EXPECT(close(x.to_host(), host));
    NAX_EXPECT(x.str() == "f64[batch=4, heads=6, d=3] {dp: S(batch), mp: S(heads)}");
  });
}

TEST_CASE("redistribute: each transition uses its collective and keeps the value", "[global]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  const Tensor host = host_normal(Shape{{"a", 4}, {"b", 8}}, "x");
  struct Case {
    Placements from, to;
    CollectiveKind kind;  // barrier: no communication
  };
  const std::vector<Case> cases{
      {{{"mp", Placement::shard("a")}}, {}, CollectiveKind::all_gather},
      {{{"mp", Placement::shard("a")}}, {{"mp", Placement::shard("b")}}, CollectiveKind::all_to_all},
      {{}, {{"mp", Placement::shard("b")}}, CollectiveKind::barrier},
      {{{"dp", Placement::shard("a")}, {"mp", Placement::shard("b")}}, {{"dp", Placement::shard("b")}, {"mp", Placement::shard("a")}},
       CollectiveKind::all_gather},
      {{{"dp", Placement::shard("a")}, {"mp", Placement::shard("a")}}, {{"dp", Placement::shard("a")}}, CollectiveKind::all_gather},
      {{{"dp", Placement::shard("a")}}, {{"dp", Placement::shard("a")}, {"mp", Placement::shard("a")}}, CollectiveKind::barrier},
      {{}, {{"mp", Placement::partial()}}, CollectiveKind::barrier},
  };
  for (const auto& c : cases) {
    INFO(c.from.str() << " -> " << c.to.str());
    rt.run([&](Shard&) {
      GlobalTensor x = redistribute(GlobalTensor::from_host(host, {}), c.from);
      NAX_EXPECT(x.placements() == c.from);
      GlobalTensor y;
      auto calls = calls_during(*Shard::current(), [&] { y = redistribute(x, c.to); });
      NAX_EXPECT(y.placements() == c.to);
      if (c.kind == CollectiveKind::barrier) NAX_EXPECT(total(calls) == 0);
      else NAX_EXPECT(count(calls, c.kind) >= 1);
      NAX_EXPECT(close(y.to_host(), host));
    });
  }
}

TEST_CASE("redistribute: partial sums reduce by all-reduce or reduce-scatter, partial max by pmax", "[global]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  const Tensor host = host_normal(Shape{{"a", 4}, {"k", 6}}, "x");
  rt.run([&](Shard&) {
    GlobalTensor x = GlobalTensor::from_host(host, AxisRules{{"k", "mp"}});
    GlobalTensor partial = sum(x, "k");
    NAX_EXPECT((partial.placements() == Placements{{"mp", Placement::partial()}}));
    GlobalTensor whole, scattered;
    auto reduce = calls_during(*Shard::current(), [&] { whole = redistribute(partial, {}); });
    NAX_EXPECT(count(reduce, CollectiveKind::all_reduce) == 1 && total(reduce) == 1);
    auto scatter = calls_during(*Shard::current(), [&] { scattered = redistribute(partial, {{"mp", Placement::shard("a")}}); });
    NAX_EXPECT(count(scatter, CollectiveKind::reduce_scatter) == 1 && total(scatter) == 1);
    NAX_EXPECT(close(whole.to_host(), sum(host, "k")));
    NAX_EXPECT(close(scattered.to_host(), sum(host, "k")));
    GlobalTensor biggest = max(x, "k");
    NAX_EXPECT((biggest.placements() == Placements{{"mp", Placement::partial(PartialOp::max)}}));
    NAX_EXPECT(close(biggest.to_host(), max(host, "k")));
  });
}

TEST_CASE("redistribute refuses uneven shards and invented partial values", "[global][errors]") {
  Runtime rt = Runtime::local(Mesh::parse("mp=4"));
  const Tensor host = host_normal(Shape{{"a", 6}, {"b", 4}}, "x");
  REQUIRE_THROWS_WITH(rt.run([&](Shard&) { redistribute(GlobalTensor::from_host(host, {}), {{"mp", Placement::shard("a")}}); }),
                      Catch::Contains("axis 'a' of size 6 does not divide into 4 equal blocks") && Catch::Contains("not padded"));
  REQUIRE_THROWS_WITH(rt.run([&](Shard&) {
                        redistribute(GlobalTensor::from_host(host, AxisRules{{"b", "mp"}}), {{"mp", Placement::partial()}});
                      }),
                      Catch::Contains("only a replicated value becomes partial over 'mp' (it is S(b) there)"));
  REQUIRE_THROWS_WITH(rt.run([&](Shard&) { redistribute(GlobalTensor::from_host(host, {}), {{"tp", Placement::shard("a")}}); }),
                      Catch::Contains("'tp' is not an axis of mesh mp=4"));
  REQUIRE_THROWS_WITH(rt.run([&](Shard&) { redistribute(GlobalTensor::from_host(host, {}), {{"mp", Placement::shard("c")}}); }),
                      Catch::Contains("no axis 'c'"));
  REQUIRE_THROWS_WITH(GlobalTensor::from_host(host, {}), Catch::Contains("inside Runtime::run"));
}

TEST_CASE("with_sharding_constraint cuts by axis rules", "[global]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  const Tensor host = host_normal(Shape{{"batch", 4}, {"embed", 8}}, "x");
  rt.run([&](Shard&) {
    GlobalTensor x = with_sharding_constraint(GlobalTensor::from_host(host, {}), AxisRules{{"batch", "dp"}, {"embed", "mp"}});
    NAX_EXPECT((x.placements() == Placements{{"dp", Placement::shard("batch")}, {"mp", Placement::shard("embed")}}));
    NAX_EXPECT(close(x.to_host(), host));
  });
}

TEST_CASE("dot: every strategy on one mesh axis, and its communication", "[global]") {
  Runtime rt = Runtime::local(Mesh::parse("x=2"));
  const Tensor a = host_normal(Shape{{"b", 4}, {"m", 6}, {"k", 8}}, "a"), w = host_normal(Shape{{"b", 4}, {"k", 8}, {"n", 10}}, "w");
  const Tensor want = dot(a, w, "k");
  struct Case {
    std::string name;
    AxisRules a_rules, w_rules;
    Placement out;
    std::size_t collectives;
  };
  const std::vector<Case> cases{
      {"batch-split", {{"b", "x"}}, {{"b", "x"}}, Placement::shard("b"), 0},
      {"contract-split", {{"k", "x"}}, {{"k", "x"}}, Placement::partial(), 0},
      {"lhs-free-split", {{"m", "x"}}, {}, Placement::shard("m"), 0},
      {"rhs-free-split", {}, {{"n", "x"}}, Placement::shard("n"), 0},
      {"replicated", {}, {}, Placement::replicate(), 0},
      {"contract-split lhs, replicated rhs: rhs is sliced", {{"k", "x"}}, {}, Placement::partial(), 0},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    rt.run([&](Shard& s) {
      GlobalTensor ga = GlobalTensor::from_host(a, c.a_rules), gw = GlobalTensor::from_host(w, c.w_rules);
      GlobalTensor out;
      auto calls = calls_during(s, [&] { out = dot(ga, gw, "k"); });
      NAX_EXPECT(out.placement("x") == c.out);
      NAX_EXPECT(total(calls) == c.collectives);
      NAX_EXPECT(close(out.to_host(), want));
    });
  }
}

// FSDP's projection: activations cut along the batch, the weight along the contraction. Moving the
// activations' cut to the contraction is the cheapest move, but it leaves a wide partial result to
// reduce; gathering the weight leaves nothing: the chooser counts the reduction a move owes.
TEST_CASE("dot: a partial result made by moving an operand's cut pays for its reduction", "[global]") {
  Runtime rt = Runtime::local(Mesh::parse("x=2"));
  const Tensor a = host_normal(Shape{{"b", 64}, {"k", 16}}, "a"), w = host_normal(Shape{{"k", 16}, {"n", 512}}, "w");
  rt.run([&](Shard& s) {
    GlobalTensor ga = GlobalTensor::from_host(a, AxisRules{{"b", "x"}}), gw = GlobalTensor::from_host(w, AxisRules{{"k", "x"}});
    GlobalTensor out;
    auto calls = calls_during(s, [&] { out = dot(ga, gw, "k"); });
    NAX_EXPECT(out.placement("x") == Placement::shard("b"));  // the weight gathered, the batch kept cut
    NAX_EXPECT(count(calls, CollectiveKind::all_gather) == 1 && total(calls) == 1);
    NAX_EXPECT(close(out.to_host(), dot(a, w, "k")));
  });
}

TEST_CASE("the cost model picks the cheaper redistribution", "[global]") {
  Runtime rt = Runtime::local(Mesh::parse("x=2"));
  // a is big and cut along m, w small and cut along n: gathering w is cheaper than gathering a.
  const Tensor a = host_normal(Shape{{"m", 512}, {"k", 16}}, "a"), w = host_normal(Shape{{"k", 16}, {"n", 4}}, "w");
  rt.run([&](Shard& s) {
    GlobalTensor ga = GlobalTensor::from_host(a, AxisRules{{"m", "x"}}), gw = GlobalTensor::from_host(w, AxisRules{{"n", "x"}});
    GlobalTensor out;
    auto calls = calls_during(s, [&] { out = dot(ga, gw, "k"); });
    NAX_EXPECT(out.placement("x") == Placement::shard("m"));
    NAX_EXPECT(count(calls, CollectiveKind::all_gather) == 1);
    // The other way round: a small, w big.
    GlobalTensor small = GlobalTensor::from_host(slice(a, "m", 0, 4), AxisRules{{"m", "x"}});
    GlobalTensor big = GlobalTensor::from_host(random_normal(Shape{{"k", 16}, {"n", 512}}, 1, "w2", 1.0, DType::f64), AxisRules{{"n", "x"}});
    NAX_EXPECT(dot(small, big, "k").placement("x") == Placement::shard("n"));
  });
  // The alpha-beta figures themselves.
  Link link{"l", 1e-6, 1e9};
  CHECK(CostModel::seconds(CollectiveKind::all_reduce, 1000, 4, link) == Approx(6e-6 + 1.5e-6));
  CHECK(CostModel::seconds(CollectiveKind::all_gather, 1000, 4, link) == Approx(3e-6 + 3e-6));
  CHECK(CostModel::seconds(CollectiveKind::reduce_scatter, 1000, 4, link) == Approx(3e-6 + 0.75e-6));
  CHECK(CostModel::seconds(CollectiveKind::all_reduce, 1000, 1, link) == 0);
  CostModel model = CostModel::parse(R"({"links": {"ib": {"latency_us": 10, "bandwidth_GBps": 25}}, "mesh_axes": {"dp": "ib"}})");
  CHECK(model.link_of("dp").name == "ib");
  CHECK(model.link_of("mp").name == "intra");
  CHECK(model.seconds(CollectiveKind::all_reduce, 1 << 20, 2, "dp") > model.seconds(CollectiveKind::all_reduce, 1 << 20, 2, "mp"));
  CHECK_THROWS_WITH(CostModel::parse("{\"mesh_axes\": {\"dp\": \"nope\"}}"), Catch::Contains("field 'mesh_axes.dp' is 'nope', an unknown link"));
  CHECK_THROWS_WITH(CostModel::parse("[1]"), Catch::Contains("not a JSON object"));
  CHECK_THROWS_WITH(CostModel::parse(R"({"links": {"x": {"latency_us": 1}}})"), Catch::Contains("field 'links.x.bandwidth_GBps' is missing"));
}

TEST_CASE("elementwise mixes of shards, replicas and partial sums", "[global]") {
  Runtime rt = Runtime::local(Mesh::parse("x=2"));
  const Tensor a = host_normal(Shape{{"r", 4}, {"c", 6}}, "a"), b = host_normal(Shape{{"c", 6}}, "b");
  rt.run([&](Shard& s) {
    GlobalTensor sharded = GlobalTensor::from_host(a, AxisRules{{"c", "x"}}), replicated = GlobalTensor::from_host(b, {});
    // S(c) + R[c]: the replica is sliced, nothing moves.
    GlobalTensor y;
    auto calls = calls_during(s, [&] { y = sharded + replicated; });
    NAX_EXPECT(total(calls) == 0 && y.placement("x") == Placement::shard("c"));
    NAX_EXPECT(close(y.to_host(), a + b));
    // P + P stays partial; P * R stays partial.
    GlobalTensor p = sum(sharded, "c"), q = sum(sharded * 2.0, "c");
    GlobalTensor pq;
    calls = calls_during(s, [&] { pq = (p + q) * GlobalTensor::from_host(rename(slice(a, "c", 0, 1), "c", "one"), {}); });
    NAX_EXPECT(total(calls) == 0 && pq.placement("x") == Placement::partial());
    // P + R stays partial too: the replica is kept on the first device only (DTensor's Replicate ->
    // Partial), so the sum is taken once, when a later op needs it whole.
    GlobalTensor mixed;
    calls = calls_during(s, [&] { mixed = p + GlobalTensor::from_host(sum(a, "c"), {}); });
    NAX_EXPECT(total(calls) == 0 && mixed.placement("x") == Placement::partial());
    calls = calls_during(s, [&] { mixed = exp(mixed); });
    NAX_EXPECT(count(calls, CollectiveKind::all_reduce) == 1 && mixed.placement("x") == Placement::replicate());
    NAX_EXPECT(close(mixed.to_host(), exp(sum(a, "c") * 2.0)));
    // A constant added to a partial sum would be added once per device: the sum is taken first.
    NAX_EXPECT(close((p + 1.0).to_host(), sum(a, "c") + 1.0));
    NAX_EXPECT(close((p * 3.0).to_host(), sum(a, "c") * 3.0));
    NAX_EXPECT(close(mean(sharded, {"r", "c"}).to_host(), mean(a, {"r", "c"})));
  });
}

TEST_CASE("strategy choices are cached per op, placements and shapes", "[global]") {
  Runtime rt = Runtime::local(Mesh::parse("x=2"));
  const Tensor a = host_normal(Shape{{"m", 4}, {"k", 6}}, "a");
  rt.run([&](Shard&) {
    GlobalTensor x = GlobalTensor::from_host(a, AxisRules{{"k", "x"}});
    const auto before = sharding_cache_stats();
    GlobalTensor first = sum(exp(x), "k");
    const auto between = sharding_cache_stats();
    GlobalTensor second = sum(exp(x), "k");
    const auto after = sharding_cache_stats();
    NAX_EXPECT(after.hits - between.hits == 2 && after.misses == between.misses);
    NAX_EXPECT(between.hits + between.misses - before.hits - before.misses == 2);
    // Another shape is another entry.
    sum(exp(GlobalTensor::from_host(slice(a, "m", 0, 2), AxisRules{{"k", "x"}})), "k");
    NAX_EXPECT(sharding_cache_stats().misses == after.misses + 2);
    NAX_EXPECT(close(first.to_host(), second.to_host()));
  });
}

TEST_CASE("softmax, log_softmax, layer_norm and cross-entropy over a sharded axis never gather it", "[global]") {
  for (const char* spec : {"x=2", "x=4", "dp=2,x=2"}) {
    INFO(spec);
    Runtime rt = Runtime::local(Mesh::parse(spec));
    const Tensor logits = host_normal(Shape{{"batch", 4}, {"vocab", 8}}, "logits");
    const Tensor targets = cast(random_uniform(Shape{{"batch", 4}}, 3, "t", 0, 7.99), DType::i32);
    const Tensor scale = host_normal(Shape{{"vocab", 8}}, "g"), bias = host_normal(Shape{{"vocab", 8}}, "b");
    AxisRules rules{{"vocab", "x"}};
    if (Mesh::parse(spec).has("dp")) rules.set("batch", {"dp"});
    rt.run([&](Shard& s) {
      GlobalTensor x = GlobalTensor::from_host(logits, rules), t = GlobalTensor::from_host(targets, rules);
      GlobalTensor g = GlobalTensor::from_host(scale, rules), b = GlobalTensor::from_host(bias, rules);
      GlobalTensor sm, lsm, ln, ce;
      auto calls = calls_during(s, [&] {
        sm = softmax(x, "vocab");
        lsm = log_softmax(x, "vocab");
        ln = layer_norm(x, "vocab", g, b);
        ce = cross_entropy(x, t, "vocab");
      });
      NAX_EXPECT(count(calls, CollectiveKind::all_gather) == 0 && count(calls, CollectiveKind::all_to_all) == 0);
      NAX_EXPECT(sm.placement("x") == Placement::shard("vocab"));
      NAX_EXPECT(close(sm.to_host(), softmax(logits, "vocab")));
      NAX_EXPECT(close(lsm.to_host(), log_softmax(logits, "vocab")));
      NAX_EXPECT(close(ln.to_host(), layer_norm(logits, "vocab", scale, bias)));
      NAX_EXPECT(std::abs(ce.item() - cross_entropy(logits, targets, "vocab").item()) < 1e-12);
    });
  }
}

TEST_CASE("embedding and pick over a sharded vocabulary give partial sums", "[global]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  const Tensor table = host_normal(Shape{{"vocab", 8}, {"embed", 3}}, "table");
  const Tensor ids = cast(random_uniform(Shape{{"batch", 4}, {"seq", 3}}, 2, "ids", 0, 7.99), DType::i32);
  AxisRules rules{{"vocab", "mp"}, {"batch", "dp"}};
  rt.run([&](Shard&) {
    GlobalTensor e = embedding(GlobalTensor::from_host(table, rules), GlobalTensor::from_host(ids, rules), "vocab");
    NAX_EXPECT((e.placements() == Placements{{"dp", Placement::shard("batch")}, {"mp", Placement::partial()}}));
    NAX_EXPECT(close(e.to_host(), embedding(table, ids, "vocab")));
  });
}

TEST_CASE("gradients flow through global ops and redistributions as on one device", "[global][grad]") {
  const Tensor x_host = host_normal(Shape{{"batch", 4}, {"embed", 6}}, "x");
  const Tensor w_host = host_normal(Shape{{"embed", 6}, {"vocab", 8}}, "w");
  const Tensor targets = cast(random_uniform(Shape{{"batch", 4}}, 3, "t", 0, 7.99), DType::i32);
  const Tensor g_host = host_normal(Shape{{"embed", 6}}, "g"), b_host = host_normal(Shape{{"embed", 6}}, "b");
  auto gradients = [&](const std::string& spec) {
    Runtime rt = Runtime::local(Mesh::parse(spec));
    AxisRules rules{{"vocab", "mp"}};
    if (Mesh::parse(spec).has("dp")) rules.set("batch", {"dp"});
    std::vector<Tensor> out;
    rt.run([&](Shard& s) {
      GlobalTensor w = parameter(GlobalTensor::from_host(w_host, rules)), g = parameter(GlobalTensor::from_host(g_host, rules));
      GlobalTensor x = GlobalTensor::from_host(x_host, rules), t = GlobalTensor::from_host(targets, rules);
      GlobalTensor h = gelu(layer_norm(x, "embed", g, GlobalTensor::from_host(b_host, rules)));
      GlobalTensor loss = cross_entropy(dot(h, w, "embed"), t, "vocab");
      auto grads = grad(loss.local(), {w.local(), g.local()});
      Tensor gw = s.gather(grads[0]), gg = s.gather(grads[1]);
      if (s.device() == 0) out = {loss.local(), gw, gg};
    });
    return out;
  };
  const auto want = gradients("dp=1,mp=1");
  for (const char* spec : {"dp=1,mp=2", "dp=2,mp=2", "dp=1,mp=4"}) {
    INFO(spec);
    const auto got = gradients(spec);
    CHECK(std::abs(got[0].item() - want[0].item()) < 1e-12);
    CHECK(max_rel_error(got[1].to_vector<double>(), want[1].to_vector<double>()) < 1e-12);
    CHECK(max_rel_error(got[2].to_vector<double>(), want[2].to_vector<double>()) < 1e-12);
  }
}

TEST_CASE("from_local: a partial sum becomes a partial placement, a local mean is refused", "[mesh][global]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2"));
  struct Seen {
    double total = 0, mean = 0;
    std::string refusal;
  };
  std::vector<Seen> seen(2);  // checked after the run: no Catch on the devices' threads
  rt.run([&](Shard& s) {
    Seen& mine = seen[static_cast<std::size_t>(s.device())];
    const Tensor x = s.shard(arange({"batch", 4}), {{"batch", "dp"}});  // [0 1 | 2 3]
    mine.total = GlobalTensor::from_local(sum(x, "batch")).to_host().item();
    try {
      GlobalTensor::from_local(mean(x, "batch"));
    } catch (const Error& e) {
      mine.refusal = e.what();
    }
    mine.mean = GlobalTensor::from_local(pmean(mean(x, "batch"), "dp")).to_host().item();
  });
  for (const Seen& mine : seen) {
    REQUIRE(mine.total == 6.0);  // 1 + 5
    REQUIRE_THAT(mine.refusal, Catch::Contains("GlobalTensor::from_local") && Catch::Contains("local mean") && Catch::Contains("pmean"));
    REQUIRE(mine.mean == 1.5);
  }
}
