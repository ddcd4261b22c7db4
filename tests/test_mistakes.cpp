// A catalog of plausible per-shard mistakes: each must raise a nax::Error whose message
// names the op, the axes and the fix; none may run silently, crash or hang. Plus regressions of
// the bugs that made some of them silent or confusing.
// Figures: 70 cases, 70 clear errors, 0 silent (the first test prints them); the tests after it
// cover what the catalog's form cannot (NAX_CHECK=1, correct programs that must keep working).
#include <fmt/format.h>

#include <functional>
#include <map>

#include "helpers.h"
#include "nax/ops/vary_checks.h"

using namespace nax;
using Catch::Matchers::Contains;

namespace {

// x[i] = 10 * device + i, Varying over every mesh axis.
Tensor per_device(Shard& s, std::int64_t n = 4) { return pvary(arange({"i", n}) + 10.0 * s.device(), s.mesh().axis_names()); }
// arange(8) cut along i over mp.
Tensor split_over_mp(Shard& s) { return s.shard(arange({"i", 8}), {{"i", "mp"}}); }
// A [i=8, j=2] table cut along i over mp: its sums over i are partial sums over mp.
Tensor rows_split_over_mp(Shard& s) {
  return s.shard(split_axis(arange({"n", 16}), "n", {{"i", 8}, {"j", 2}}), {{"i", "mp"}});
}
// A [batch=4, j=2] table cut along batch over dp: its means over batch are local means over dp.
Tensor batch_split_over_dp(Shard& s) {
  return s.shard(split_axis(arange({"n", 8}), "n", {{"batch", 4}, {"j", 2}}), {{"batch", "dp"}});
}

struct Mistake {
  const char* what;
  const char* mesh;
  std::function<void(Shard&)> program;
  std::vector<std::string> words;  // the message contains each
};

using Pairs = std::vector<std::pair<int, int>>;

std::vector<Mistake> catalog() {
  return {
      // --- reductions
      {"psum of an Invariant value", "mp=2", [](Shard&) { psum(ones(Shape{{"i", 4}}), "mp"); }, {"psum", "Invariant", "'mp'", "axis_size"}},
      {"pmean of an Invariant value reports pmean", "mp=2", [](Shard&) { pmean(ones(Shape{{"i", 4}}), "mp"); }, {"pmean", "Invariant", "'mp'"}},
      {"pmax of an Invariant value", "mp=2", [](Shard&) { pmax(ones(Shape{{"i", 4}}), "mp"); }, {"pmax", "Invariant"}},
      {"pmin of an Invariant value", "mp=2", [](Shard&) { pmin(ones(Shape{{"i", 4}}), "mp"); }, {"pmin", "Invariant"}},
      {"psum of a Split block", "mp=2", [](Shard& s) { psum(split_over_mp(s), "mp"); }, {"psum", "Split", "'i'", "all_gather"}},
      {"pmean of a Split block", "mp=2", [](Shard& s) { pmean(split_over_mp(s), "mp"); }, {"pmean", "Split"}},
      {"psum over an unknown mesh axis", "mp=2", [](Shard& s) { psum(per_device(s), "tp"); }, {"psum", "tp"}},
      {"psum over a mesh axis the value is Invariant over (of two)", "dp=2,mp=2",
       [](Shard&) { psum(pvary(arange({"i", 4}), "mp"), {"dp", "mp"}); }, {"psum", "Invariant", "'dp'"}},
      {"psum of a local mean (mean over an axis cut over dp)", "dp=2",
       [](Shard& s) { psum(mean(batch_split_over_dp(s), "batch"), "dp"); }, {"psum", "local mean", "'dp'", "pmean"}},
      {"psum of a scaled local mean", "dp=2,mp=2",
       [](Shard& s) { psum(pvary(mean(batch_split_over_dp(s), {"batch", "j"}) * 0.5, "mp"), {"mp", "dp"}); },
       {"psum", "local mean", "'dp'", "pmean"}},
      {"psum_scatter of a local mean", "dp=2",
       [](Shard& s) { psum_scatter(mean(batch_split_over_dp(s), "batch"), "dp", "j"); }, {"psum_scatter", "local mean", "pmean"}},
      {"pmean of an integer tensor", "mp=2", [](Shard&) { pmean(axis_index("mp"), "mp"); }, {"pmean", "floating"}},
      {"pvary of a Varying value", "mp=2", [](Shard& s) { pvary(per_device(s), "mp"); }, {"pvary", "already varies", "'mp'"}},
      {"pvary of a Split value", "mp=2", [](Shard& s) { pvary(split_over_mp(s), "mp"); }, {"pvary", "Split"}},
      // --- scatters
      {"psum_scatter of an Invariant value", "mp=2", [](Shard&) { psum_scatter(ones(Shape{{"i", 4}}), "mp", "i"); },
       {"psum_scatter", "Invariant", "'mp'"}},
      {"psum_scatter of a Split block", "mp=2", [](Shard& s) { psum_scatter(split_over_mp(s), "mp", "i"); }, {"psum_scatter", "Split"}},
      {"psum_scatter along a missing axis", "mp=2", [](Shard& s) { psum_scatter(per_device(s), "mp", "j"); }, {"psum_scatter", "'j'"}},
      {"psum_scatter of an axis the group does not divide", "mp=2", [](Shard& s) { psum_scatter(per_device(s, 3), "mp", "i"); },
       {"psum_scatter", "divisible", "'i'"}},
      // --- gathers
      {"all_gather along a misspelled axis", "mp=2", [](Shard& s) { all_gather(split_over_mp(s), "mp", "I"); },
       {"all_gather", "no axis 'I'", "all_gather_stacked"}},
      {"all_gather_invariant along a misspelled axis", "mp=2", [](Shard& s) { all_gather_invariant(split_over_mp(s), "mp", "ii"); },
       {"all_gather_invariant", "no axis 'ii'", "all_gather_invariant_stacked"}},
      {"all_gather of an Invariant value", "mp=2", [](Shard&) { all_gather(arange({"i", 4}), "mp", "i"); },
       {"all_gather", "Invariant", "'mp'", "copies"}},
      {"all_gather_invariant of an Invariant value", "mp=2", [](Shard&) { all_gather_invariant(arange({"i", 4}), "mp", "i"); },
       {"all_gather_invariant", "Invariant", "copies"}},
      {"all_gather over two axes, one Invariant", "dp=2,mp=2", [](Shard& s) { all_gather(split_over_mp(s), {"dp", "mp"}, "i"); },
       {"all_gather", "Invariant", "'dp'"}},
      {"all_gather_stacked onto an existing axis", "mp=2", [](Shard& s) { all_gather_stacked(per_device(s), "mp", "i"); },
       {"all_gather_stacked", "already has", "'i'"}},
      {"all_gather_stacked of an Invariant value", "mp=2", [](Shard&) { all_gather_stacked(arange({"i", 4}), "mp", "r"); },
       {"all_gather_stacked", "Invariant"}},
      {"all_gather_invariant of a partial sum (sum over a cut axis)", "mp=2",
       [](Shard& s) { all_gather_invariant(sum(rows_split_over_mp(s), "i"), "mp", "j"); },
       {"all_gather_invariant", "partial sum", "'mp'", "psum", "psum_scatter"}},
      {"all_gather of a partial sum (dot contracting a cut axis)", "mp=2",
       [](Shard& s) { all_gather(dot(rows_split_over_mp(s), split_over_mp(s), {"i"}), "mp", "j"); },
       {"all_gather", "partial sum", "'mp'", "psum"}},
      {"all_gather_invariant of a scaled partial sum", "dp=2,mp=2",
       [](Shard& s) { all_gather_invariant(sum(rows_split_over_mp(s), "i") * 2.0 - 1.0, "mp", "j"); },
       {"sub", "partial sum", "'mp'", "after the psum"}},
      {"all_gather_invariant_stacked of a partial sum", "mp=2",
       [](Shard& s) { all_gather_invariant_stacked(sum(rows_split_over_mp(s), "i"), "mp", "r"); },
       {"all_gather_invariant_stacked", "partial sum", "psum"}},
      {"all_gather over an unknown mesh axis", "mp=2", [](Shard& s) { all_gather(per_device(s), "pp", "i"); }, {"all_gather", "pp"}},
      // --- ppermute, all_to_all
      {"ppermute with a pair out of range", "mp=2", [](Shard& s) { ppermute(per_device(s), "mp", Pairs{{0, 5}}); },
       {"ppermute", "out of range", "(0, 5)"}},
      {"ppermute with a rank received twice", "mp=4", [](Shard& s) { ppermute(per_device(s), "mp", Pairs{{0, 1}, {2, 1}}); },
       {"ppermute", "destination of two"}},
      {"ppermute with a rank sending twice", "mp=4", [](Shard& s) { ppermute(per_device(s), "mp", Pairs{{0, 1}, {0, 2}}); },
       {"ppermute", "source of two"}},
      {"ppermute with pairs that differ across devices", "mp=2",
       [](Shard& s) { ppermute(per_device(s), "mp", s.device() == 0 ? Pairs{{0, 1}, {1, 0}} : Pairs{{0, 1}}); },
       {"mismatch", "pairs [(0, 1) (1, 0)]", "pairs [(0, 1)]"}},
      {"all_to_all of an axis the group does not divide", "mp=2", [](Shard& s) { all_to_all(per_device(s, 3), "mp", "i", "i"); },
       {"all_to_all", "divisible"}},
      {"all_to_all along a missing concat axis", "mp=2", [](Shard& s) { all_to_all(per_device(s), "mp", "i", "k"); }, {"all_to_all", "'k'"}},
      {"all_to_all along a missing split axis", "mp=2", [](Shard& s) { all_to_all(per_device(s), "mp", "k", "i"); }, {"all_to_all", "'k'"}},
      {"axis_index of an unknown mesh axis", "mp=2", [](Shard&) { axis_index("tp"); }, {"axis_index", "tp"}},
      {"axis_size of an unknown mesh axis", "mp=2", [](Shard&) { axis_size("tp"); }, {"axis_size", "tp"}},
      // --- devices disagreeing
      {"two same-shaped psums in opposite orders", "mp=2",
       [](Shard& s) {
         Tensor a = per_device(s), b = per_device(s);
         if (s.device() == 0) {
           psum(a, "mp");
           psum(b, "mp");
         } else {
           psum(b, "mp");
           psum(a, "mp");
         }
       },
       {"mismatch", "test_mistakes.cpp:", "device 0", "device 1"}},
      {"psum on one device, pmax on the other", "mp=2",
       [](Shard& s) {
         if (s.device() == 0) psum(per_device(s), "mp");
         else pmax(per_device(s), "mp");
       },
       {"mismatch", "psum(", "pmax("}},
      {"psum of different sizes", "mp=2", [](Shard& s) { psum(per_device(s, 4 + s.device()), "mp"); }, {"mismatch", "i=4", "i=5"}},
      {"a pipeline stage chosen by an if", "pp=2",
       [](Shard& s) {
         Tensor x = per_device(s);
         if (s.device() == 0) x = ppermute(x, "pp", Pairs{{0, 1}});
         else x = all_gather_invariant(x, "pp", "i");
       },
       {"mismatch", "ppermute", "all_gather_invariant", "test_mistakes.cpp:"}},
      {"devices cutting different host tensors", "mp=2",
       [](Shard& s) { s.shard(arange({"i", 8}) + static_cast<double>(s.device()), {{"i", "mp"}}); },
       {"shard", "different host tensors", "mp"}},
      {"devices cutting different host tensors over two axes", "dp=2,mp=2",
       [](Shard& s) { s.shard(full(Shape{{"i", 4}, {"j", 4}}, s.device() == 3 ? 1.0 : 0.0), {{"i", "dp"}, {"j", "mp"}}); },
       {"shard", "different host tensors", "dp", "mp"}},
      // --- gradients
      {"grad of a loss Varying over dp (no pmean)", "dp=2",
       [](Shard& s) {
         Tensor w = parameter(ones(Shape{{"i", 4}}));
         Tensor loss = sum(w * per_device(s), "i");
         grad(loss, {w});
       },
       {"grad", "Varying", "'dp'", "pmean/psum"}},
      {"grad of a loss missing its psum over mp", "mp=2",
       [](Shard& s) {
         Tensor w = parameter(s.shard(ones(Shape{{"i", 8}}), {{"i", "mp"}}));
         grad(sum(w * w, "i"), {w});
       },
       {"grad", "partial sum", "'mp'", "psum"}},
      {"grad of a loss Varying over one of two axes", "dp=2,mp=2",
       [](Shard& s) {
         Tensor w = parameter(s.shard(ones(Shape{{"i", 8}}), {{"i", "mp"}}));
         Tensor by_dp = cast(axis_index("dp"), DType::f32) + 1.0;  // a per-device weight over dp
         grad(psum(sum(w * w, "i") * by_dp, "mp"), {w});
       },
       {"grad", "'dp'"}},
      {"grad of pmax", "mp=2",
       [](Shard& s) {
         Tensor w = parameter(ones(Shape{{"i", 4}}));
         grad(sum(pmax(w * per_device(s), "mp"), "i"), {w});
       },
       {"pmax", "not differentiable", "stop_gradient"}},
      {"grad of a vector loss", "mp=2", [](Shard&) { Tensor w = parameter(ones(Shape{{"i", 4}})); grad(w * 2.0, {w}); }, {"grad", "scalar"}},
      {"grad of a loss without parameters", "mp=2", [](Shard&) { grad(sum(ones(Shape{{"i", 4}}), "i"), {}); }, {"grad", "parameter"}},
      {"a backward that only one device runs", "mp=2",
       [](Shard& s) {
         Tensor x = parameter(per_device(s));
         Tensor gathered = all_gather(x, "mp", "i");
         Tensor loss = s.device() == 0 ? sum(gathered, "i") : sum(x, "i");
         grad(loss, {x}, {.allow_varying_loss = true});
       },
       {"psum_scatter", "backward of all_gather", "test_mistakes.cpp:"}},
      // --- host side
      {"gather of a Varying value", "mp=2", [](Shard& s) { s.gather(per_device(s)); }, {"gather", "Varying", "psum"}},
      {"shard along an unknown mesh axis", "mp=2", [](Shard& s) { s.shard(arange({"i", 8}), {{"i", "tp"}}); }, {"tp"}},
      {"shard of an axis the mesh axis does not divide", "mp=2", [](Shard& s) { s.shard(arange({"i", 7}), {{"i", "mp"}}); }, {"'i'", "7"}},
      {"an axis rule naming an axis no tensor carries (a typo)", "mp=2",
       [](Shard& s) { s.shard(split_axis(arange({"n", 8}), "n", {{"head", 4}, {"d", 2}}), {{"heads", "mp"}}); },
       {"AxisRules", "heads=mp", "'heads'", "did you mean 'head'?"}},
      {"an axis rule no tensor uses, among used ones", "dp=2,mp=2",
       [](Shard& s) {
         const AxisRules rules{{"batch", "dp"}, {"embd", "mp"}};
         s.random_normal(Shape{{"batch", 4}, {"embed", 4}}, rules, 1, "x");
         s.full(Shape{{"embed", 4}}, rules, 0.0);
       },
       {"AxisRules", "embd=mp", "batch, embed", "did you mean 'embed'?"}},
      {"an axis rule with two letters swapped", "mp=2",
       [](Shard& s) { s.shard(split_axis(arange({"n", 8}), "n", {{"heads", 4}, {"d", 2}}), {{"haeds", "mp"}}); },
       {"AxisRules", "haeds=mp", "did you mean 'heads'?"}},
      {"an axis rule in another case", "mp=2", [](Shard& s) { s.random_normal(Shape{{"embed", 4}, {"mlp", 8}}, {{"MLP", "mp"}}, 1, "w"); },
       {"AxisRules", "MLP=mp", "did you mean 'mlp'?"}},
      {"axis rules of which none cuts anything (no near name)", "dp=2,mp=2",
       [](Shard& s) { s.random_normal(Shape{{"embed", 4}, {"mlp", 8}}, {{"hidden", "mp"}, {"tokens", "dp"}}, 1, "w"); },
       {"AxisRules", "cut nothing", "hidden=mp", "tokens=dp", "embed, mlp"}},
      {"shard of a per-device value", "mp=2", [](Shard& s) { s.shard(per_device(s), {}); }, {"shard", "per-device"}},
      // --- per-shard ops on cut values
      {"dot of a block with a whole tensor", "mp=2",
       [](Shard& s) { dot(split_over_mp(s), arange({"i", 8}), {"i"}); }, {"dot", "'i'"}},
      {"add of a block and a whole tensor", "mp=2", [](Shard& s) { add(split_over_mp(s), arange({"i", 8})); }, {"add", "'i'"}},
      // --- checked casts and assertions
      {"as_split of an Invariant value", "mp=2", [](Shard&) { as_split(arange({"i", 4}), "mp", "i"); }, {"as_split", "Invariant", "'mp'"}},
      {"as_split along a missing axis", "mp=2", [](Shard& s) { as_split(per_device(s), "mp", "j"); }, {"as_split", "'j'"}},
      {"as_varying of a Varying value", "mp=2", [](Shard& s) { as_varying(per_device(s), "mp"); }, {"as_varying", "not Split", "'mp'"}},
      {"expect_vary of a Split value expected Varying", "mp=2", [](Shard& s) { expect_vary(split_over_mp(s), "mp=varying"); },
       {"expect_vary", "'mp'", "mp=varying", "test_mistakes.cpp"}},
      {"expect_vary of a Varying value expected Invariant", "dp=2,mp=2", [](Shard& s) { expect_vary(per_device(s), "dp=varying"); },
       {"expect_vary", "'mp'", "invariant"}},
      {"expect_vary with a malformed spec", "mp=2", [](Shard& s) { expect_vary(per_device(s), "mp"); }, {"expect_vary", "mesh_axis=varying"}},
      {"slice out of a block's bounds", "mp=2", [](Shard& s) { slice(split_over_mp(s), "i", 0, 8); }, {"slice", "out of bounds"}},
  };
}

}  // namespace

TEST_CASE("every cataloged mistake raises a nax::Error naming the op and the fix", "[mistakes]") {
  std::map<std::string, Runtime> runtimes;
  int clear = 0;
  const auto cases = catalog();
  for (const auto& m : cases) {
    INFO("mistake: " << m.what << " on " << m.mesh);
    auto it = runtimes.find(m.mesh);
    if (it == runtimes.end())
      it = runtimes.emplace(m.mesh, Runtime::local(Mesh::parse(m.mesh), {.collective_timeout_s = 10})).first;
    std::string message;
    try {
      it->second.run(m.program);
    } catch (const Error& e) {
      message = e.what();
    }
    INFO("message: " << message);
    REQUIRE_FALSE(message.empty());
    for (const auto& w : m.words) CHECK_THAT(message, Contains(w));
    ++clear;
  }
  std::printf("test_mistakes: %zu cases, %d clear errors, 0 silent\n", cases.size(), clear);
}

// --- regressions of the bugs

TEST_CASE("the gradient through a slice of a value cut along another axis", "[mistakes]") {
  // Regression: the zero padding of slice's backward was built Invariant and concat refused it.
  Runtime rt = Runtime::local(Mesh::parse("dp=2"));
  auto grads = rt.run([](Shard& s) {
    Tensor x = parameter(s.shard(split_axis(arange({"n", 12}, DType::f64), "n", {{"batch", 2}, {"embed", 6}}), {{"batch", "dp"}}));
    Tensor loss = pmean(sum(slice(x, "embed", 1, 4) * 2.0, {"batch", "embed"}), "dp");
    return s.gather(grad(loss, {x})[0]).to_vector<double>();
  });
  // d/dx of mean over dp of (2 * sum of embed 1..3): 2 / 2 on those columns, 0 elsewhere.
  std::vector<double> want;
  for (int b = 0; b < 2; ++b)
    for (int e = 0; e < 6; ++e) want.push_back(e >= 1 && e < 4 ? 1.0 : 0.0);
  for (const auto& g : grads) REQUIRE(g == want);
}

TEST_CASE("partial sums and local means finish with psum and pmean, then gather", "[mistakes]") {
  // Knowing why a value varies (a partial sum, a local mean) refuses only the wrong finish.
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  auto results = rt.run([](Shard& s) {
    // x[b, i] = 4 b + i, batch cut over dp, i over mp.
    Tensor x = s.shard(split_axis(arange({"n", 16}, DType::f64), "n", {{"batch", 4}, {"i", 4}}), {{"batch", "dp"}, {"i", "mp"}});
    Tensor row_sums = psum(sum(x, "i"), "mp");
    Tensor mean_of_rows = pmean(mean(row_sums, "batch"), "dp");
    Tensor scattered = psum_scatter(sum(x * 2.0, "i"), "mp", "batch");  // a partial sum kept as blocks
    std::string refusal;  // a partial sum and a local mean do not add (Catch's macros are not for worker threads)
    try {
      (void)(sum(x, "i") + mean(x, "i"));
    } catch (const Error& e) {
      refusal = e.what();
    }
    NAX_EXPECT(refusal.find("partial-mean{mp}") != std::string::npos && refusal.find("finish each with its own collective") != std::string::npos);
    Tensor terms = all_gather_invariant_stacked(as_varying(x, "mp") * 1.5, "mp", "r");  // each device's block, side by side
    std::vector<double> out{mean_of_rows.item()};
    for (const Tensor& t : {s.gather(scattered), s.gather(terms)})
      for (double v : t.to_vector<double>()) out.push_back(v);
    return out;
  });
  std::vector<double> want{(6.0 + 22.0 + 38.0 + 54.0) / 4};  // the mean over b of 16 b + 6
  for (int b = 0; b < 4; ++b) want.push_back(32.0 * b + 12);
  for (int r = 0; r < 2; ++r)  // mp rank r holds i = 2r, 2r+1
    for (int b = 0; b < 4; ++b)
      for (int i = 2 * r; i < 2 * r + 2; ++i) want.push_back(1.5 * (4 * b + i));
  for (const auto& got : results) REQUIRE(got == want);
}

TEST_CASE("a tensor from another Runtime is reported as such", "[mistakes]") {
  Runtime a = Runtime::local(Mesh::parse("mp=2")), b = Runtime::local(Mesh::parse("mp=2"));
  std::vector<Tensor> from_a(2);
  a.run([&](Shard& s) { from_a[static_cast<std::size_t>(s.device())] = per_device(s); });
  for (bool alone : {false, true}) {
    std::string message;
    try {
      b.run([&](Shard& s) {
        const Tensor& other = from_a[static_cast<std::size_t>(s.device())];
        if (alone) sum(other, "i");
        else add(per_device(s), other);
      });
    } catch (const Error& e) {
      message = e.what();
    }
    INFO(message);
    REQUIRE_THAT(message, Contains("another Runtime"));
  }
}

TEST_CASE("a per-device loss still differentiates when asked to", "[mistakes]") {
  Runtime rt = Runtime::local(Mesh::parse("mp=2"));
  auto grads = rt.run([](Shard& s) {
    Tensor w = parameter(ones(Shape{{"i", 4}}, DType::f64));
    Tensor loss = sum(w * cast(per_device(s), DType::f64), "i");
    return grad(loss, {w}, {.allow_varying_loss = true})[0].to_vector<double>();
  });
  // Each device's own data (psum-ed onto the Invariant w by the implicit pvary's transpose).
  REQUIRE(grads[0] == grads[1]);
}

TEST_CASE("checked casts round-trip and keep gradients", "[mistakes]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  rt.run([](Shard& s) {
    Tensor x = parameter(s.shard(arange({"i", 8}, DType::f64), {{"i", {"dp", "mp"}}}));
    Tensor v = as_varying(x, {"dp", "mp"});
    expect_vary(v, "dp=varying,mp=varying");
    Tensor back = as_split(v, {"dp", "mp"}, "i");
    expect_vary(back, "dp=i,mp=i");
    NAX_EXPECT(back.vary() == x.vary());
    Tensor g = grad(pmean(sum(as_varying(x, "mp") * 3.0, "i"), {"dp", "mp"}), {x})[0];
    NAX_EXPECT(g.vary() == x.vary());
    NAX_EXPECT(g.to_vector<double>() == std::vector<double>(2, 0.75));
  });
}

TEST_CASE("axis rules are checked against every tensor of the run, not each one", "[mistakes]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  const AxisRules rules{{"batch", "dp"}, {"embed", "mp"}};
  REQUIRE_NOTHROW(rt.run([&](Shard& s) {
    s.shard(arange({"batch", 4}), rules);  // uses only the batch rule
    s.full(Shape{{"embed", 4}}, rules, 1.0);  // only the embed rule
  }));
  REQUIRE_NOTHROW(rt.run([&](Shard& s) { s.full(Shape{{"embed", 4}, {"head", 2}}, rules, 1.0); }));  // no name near 'batch'
  REQUIRE_NOTHROW(rt.run([](Shard&) {}));  // no rules applied, nothing to report
}

TEST_CASE("a rule that no tensor of the run carries is left to other runs, unless every rule must cut", "[mistakes]") {
  const AxisRules model{{"batch", "dp"}, {"mlp", "mp"}};  // a model's rules, in a run that makes parameters only
  auto parameters_only = [&](Shard& s) { s.random_normal(Shape{{"embed", 4}, {"mlp", 8}}, model, 1, "w"); };
  REQUIRE_NOTHROW(Runtime::local(Mesh::parse("dp=2,mp=2")).run(parameters_only));
  Runtime strict = Runtime::local(Mesh::parse("dp=2,mp=2"), {.strict_axis_rules = true});
  REQUIRE_THROWS_WITH(strict.run(parameters_only),
                      Contains("the rule batch=dp cut nothing in this run") && Contains("embed, mlp") && Contains("strict_axis_rules"));
  REQUIRE_NOTHROW(strict.run([&](Shard& s) {
    parameters_only(s);
    s.shard(arange({"batch", 4}), model);
  }));
}

TEST_CASE("NAX_CHECK=1 compares the Invariant tensors a run returns, naming the devices", "[mistakes]") {
  auto one = [](Shard& s) { return full(Shape{{"i", 2}}, s.device() == 3 ? 1.0 : 0.0); };  // per-device, typed Invariant
  auto several = [](Shard& s) { return std::vector<Tensor>{ones(Shape{{"i", 2}}), full(Shape{{"i", 2}}, s.coord("mp") * 1.0)}; };
  REQUIRE_NOTHROW(Runtime::local(Mesh::parse("dp=2,mp=2")).run(one));  // unchecked: silently different
  ::setenv("NAX_CHECK", "1", 1);
  REQUIRE_NOTHROW(Runtime::local(Mesh::parse("dp=2,mp=2"), {.check_values = false}).run(one));  // code wins over the environment
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));  // the environment is read when a runtime is made
  for (bool vector : {false, true}) {
    std::string message;
    try {
      if (vector) rt.run(several);
      else rt.run(one);
    } catch (const Error& e) {
      message = e.what();
    }
    INFO(message);
    REQUIRE_THAT(message, Contains("NAX_CHECK") && Contains("Invariant") && Contains("Runtime::run returns") && Contains("pvary"));
    if (vector) REQUIRE_THAT(message, Contains("device 0 holds other values than devices 1, 3"));
    else REQUIRE_THAT(message, Contains("device 0 holds other values than device 3"));
  }
  REQUIRE_NOTHROW(rt.run([](Shard& s) { return psum(per_device(s), {"dp", "mp"}); }));  // truly Invariant: passes
  REQUIRE_NOTHROW(rt.run([](Shard& s) { return per_device(s); }));  // Varying: not compared
  ::unsetenv("NAX_CHECK");
}

TEST_CASE("NAX_CHECK=1 catches a per-device value typed Invariant at gather and expect_vary", "[mistakes]") {
  auto program = [](bool assert_type) {
    return [assert_type](Shard& s) {
      Tensor wrong = full(Shape{{"i", 2}}, static_cast<double>(s.device()));  // per-device, never marked Varying
      if (assert_type) expect_vary(wrong, "");
      else s.gather(wrong);
    };
  };
  REQUIRE_NOTHROW(Runtime::local(Mesh::parse("mp=2")).run(program(false)));  // unchecked: device 0's copy, silently
  Runtime rt = Runtime::local(Mesh::parse("mp=2"), {.check_values = true});  // NAX_CHECK=1 in code
  for (bool assert_type : {false, true}) {
    std::string message;
    try {
      rt.run(program(assert_type));
    } catch (const Error& e) {
      message = e.what();
    }
    INFO(message);
    REQUIRE_THAT(message, Contains("NAX_CHECK") && Contains("Invariant") && Contains("pvary") &&
                              Contains(assert_type ? "expect_vary" : "gather"));
  }
  REQUIRE_NOTHROW(rt.run([](Shard& s) { s.gather(psum(per_device(s), "mp")); }));  // truly Invariant: passes
}
