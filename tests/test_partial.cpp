// Partial values (Vary::Partial, docs/ops.md "Partial sums"): the ops that make them, the linear
// ops that keep them, the ops that refuse them with the fix, and their values and gradients against
// host f64 loops.
#include <fmt/format.h>

#include <functional>
#include <map>

#include "grad_check.h"
#include "helpers.h"
#include "nax/ops/vary_checks.h"

using namespace nax;
using namespace nax::testing;
using Catch::Matchers::Contains;

// Inside Runtime::run, where Catch's macros are not safe.
#define NAX_EXPECT_THROWS(expr)                          \
  do {                                                   \
    bool thrown = false;                                 \
    try {                                                \
      (void)(expr);                                      \
    } catch (const Error&) {                             \
      thrown = true;                                     \
    }                                                    \
    NAX_EXPECT(thrown && "expected a nax::Error: " #expr); \
  } while (0)

namespace {

constexpr std::int64_t kB = 2, kM = 4, kE = 3;  // batch, mlp (cut over mp), embed

// h[b, m] = b + 0.5 m + 1 and w[m, e] = (m + 1) (e - 1) / 4 as host f64 tensors, and on a shard:
// mlp cut over mp, so that dot(h, w, "mlp") is a partial sum over mp.
Tensor host_h() {
  std::vector<double> v;
  for (int b = 0; b < kB; ++b)
    for (int m = 0; m < kM; ++m) v.push_back(b + 0.5 * m + 1);
  return from_vector(Shape{{"batch", kB}, {"mlp", kM}}, v, DType::f64);
}
Tensor host_w() {
  std::vector<double> v;
  for (int m = 0; m < kM; ++m)
    for (int e = 0; e < kE; ++e) v.push_back((m + 1) * (e - 1) / 4.0);
  return from_vector(Shape{{"mlp", kM}, {"embed", kE}}, v, DType::f64);
}
const AxisRules kRules{{"mlp", "mp"}};
Tensor h_of(Shard& s) { return s.shard(host_h(), kRules); }
Tensor w_of(Shard& s) { return s.shard(host_w(), kRules); }
Tensor partial_of(Shard& s) { return dot(h_of(s), w_of(s), "mlp"); }  // [batch, embed] partial{mp}
Tensor bias() { return from_vector(Shape{{"embed", kE}}, std::vector<double>{1, 2, 3}, DType::f64); }

// The host product h . w, element [b, e].
double hw(int b, int e) {
  double t = 0;
  for (int m = 0; m < kM; ++m) t += (b + 0.5 * m + 1) * ((m + 1) * (e - 1) / 4.0);
  return t;
}

struct Mistake {
  const char* what;
  const char* mesh;
  std::function<void(Shard&)> program;
  std::vector<std::string> words;  // the message contains each
};

std::vector<Mistake> catalog() {
  return {
      // --- a non-partial value added to a partial sum: counted once per device
      {"psum of dot plus a bias", "mp=2", [](Shard& s) { psum(partial_of(s) + bias(), "mp"); },
       {"add", "partial sum over mesh axis 'mp'", "Invariant", "2 times", "after the psum"}},
      {"a bias plus dot, then psum", "mp=2", [](Shard& s) { psum(bias() + partial_of(s), "mp"); }, {"add", "after the psum"}},
      {"dot minus a constant", "dp=2,mp=2", [](Shard& s) { psum(partial_of(s) - 1.0, "mp"); }, {"sub", "after the psum"}},
      {"a pvary'd bias added to a partial sum", "mp=2", [](Shard& s) { psum(partial_of(s) + pvary(bias(), "mp"), "mp"); },
       {"add", "Varying", "as_partial"}},
      {"a block added to a partial sum over the same mesh axis", "mp=2",
       [](Shard& s) { partial_of(s) + s.shard(from_vector(Shape{{"embed", 4}}, std::vector<double>{1, 2, 3, 4}, DType::f64), {{"embed", "mp"}}); },
       {"add"}},
      {"concat of a partial sum and a whole value", "mp=2", [](Shard& s) { concat({partial_of(s), ones(Shape{{"batch", kB}, {"embed", kE}}, DType::f64)}, "batch"); },
       {"concat", "partial sum", "after the psum"}},
      {"where choosing between a partial sum and a constant", "mp=2",
       [](Shard& s) { where(ones(Shape{{"embed", kE}}), partial_of(s), ones(Shape{{"batch", kB}, {"embed", kE}}, DType::f64)); },
       {"where", "partial sum"}},
      {"scatter_add of a batch cut over dp into a nonzero target", "dp=2",
       [](Shard& s) {
         Tensor ids = s.shard(from_vector(Shape{{"batch", 4}}, std::vector<std::int32_t>{0, 1, 1, 2}), {{"batch", "dp"}});
         Tensor rows = s.shard(ones(Shape{{"batch", 4}, {"embed", 2}}), {{"batch", "dp"}});
         scatter_add(ones(Shape{{"vocab", 3}, {"embed", 2}}), "vocab", ids, rows);
       },
       {"scatter_add", "'dp'", "partial sum", "scatter into zeros"}},
      {"a partial sum added to a local mean", "dp=2",
       [](Shard& s) {
         Tensor x = s.shard(ones(Shape{{"batch", 4}, {"e", 2}}), {{"batch", "dp"}});
         sum(x, "batch") + mean(x, "batch");
       },
       {"add", "partial sum", "local mean", "finish each"}},
      // --- nonlinear ops of a partial sum
      {"exp of a partial sum before its psum", "mp=2", [](Shard& s) { psum(exp(sum(h_of(s), "mlp")), "mp"); },
       {"exp", "partial sum over mesh axis 'mp'", "psum over 'mp' first"}},
      {"gelu of a partial sum before psum_scatter", "mp=2", [](Shard& s) { psum_scatter(gelu(partial_of(s)), "mp", "batch"); },
       {"gelu", "partial sum", "psum"}},
      {"tanh of a partial sum", "mp=2", [](Shard& s) { tanh(partial_of(s)); }, {"tanh", "partial sum"}},
      {"square of a partial sum", "mp=2", [](Shard& s) { square(partial_of(s)); }, {"square", "partial sum"}},
      {"pow of a partial sum", "mp=2", [](Shard& s) { pow(partial_of(s), full_like(bias(), 2.0)); }, {"pow", "partial sum"}},
      {"abs of a partial sum", "mp=2", [](Shard& s) { abs(partial_of(s)); }, {"abs"}},
      {"the product of two partial sums", "mp=2", [](Shard& s) { partial_of(s) * partial_of(s); },
       {"mul", "both partial", "'mp'", "psum one of them"}},
      {"dot of two partial sums", "mp=2", [](Shard& s) { dot(partial_of(s), rename(partial_of(s), "batch", "b2"), "embed"); },
       {"dot", "both partial"}},
      {"division by a partial sum", "mp=2", [](Shard& s) { bias() / partial_of(s); }, {"div", "partial sum"}},
      {"a comparison of a partial sum", "mp=2", [](Shard& s) { gt(partial_of(s), zeros(Shape{{"embed", kE}}, DType::f64)); },
       {"gt", "partial sum"}},
      {"maximum of a partial sum", "mp=2", [](Shard& s) { maximum(partial_of(s), zeros(Shape{{"embed", kE}}, DType::f64)); },
       {"maximum", "partial sum"}},
      {"max over an axis of a partial sum", "mp=2", [](Shard& s) { max(partial_of(s), "embed"); }, {"max", "partial sum"}},
      {"argmax of a partial sum", "mp=2", [](Shard& s) { argmax(partial_of(s), "embed"); }, {"argmax", "partial sum"}},
      {"top_k of a partial sum", "mp=2", [](Shard& s) { top_k(partial_of(s), "embed", 2); }, {"top_k", "partial sum"}},
      {"softmax of a partial sum", "mp=2", [](Shard& s) { softmax(partial_of(s), "embed"); }, {"softmax", "partial sum"}},
      {"layer_norm of a partial sum", "mp=2",
       [](Shard& s) { layer_norm(partial_of(s), "embed", ones(Shape{{"embed", kE}}, DType::f64), zeros(Shape{{"embed", kE}}, DType::f64)); },
       {"layer_norm", "partial sum"}},
      {"cross_entropy of partial logits", "mp=2",
       [](Shard& s) { cross_entropy(partial_of(s), from_vector(Shape{{"batch", kB}}, std::vector<std::int32_t>{0, 1}), "embed"); },
       {"cross_entropy", "partial sum"}},
      {"a lossy cast of a partial sum", "mp=2", [](Shard& s) { cast(partial_of(s), DType::f32); }, {"cast", "partial sum"}},
      {"a cast of a partial sum to integers", "mp=2", [](Shard& s) { cast(partial_of(s), DType::i32); }, {"cast", "partial sum"}},
      {"where with a partial sum as the condition", "mp=2", [](Shard& s) { where(partial_of(s), bias(), bias()); }, {"where", "partial sum"}},
      // --- collectives that cannot take a partial value
      {"pmax of a partial sum", "mp=2", [](Shard& s) { pmax(partial_of(s), "mp"); }, {"pmax", "partial sum", "psum over 'mp' first"}},
      {"pmin of a partial sum", "mp=2", [](Shard& s) { pmin(partial_of(s), "mp"); }, {"pmin", "partial sum"}},
      {"pmax over another mesh axis of a partial sum", "dp=2,mp=2", [](Shard& s) { psum(pmax(pvary(partial_of(s), "dp"), "dp"), "mp"); },
       {"pmax", "partial sum over mesh axis 'mp'"}},
      {"ppermute that drops a term of a partial sum", "mp=2", [](Shard& s) { psum(ppermute(partial_of(s), "mp", {{0, 1}}), "mp"); },
       {"ppermute", "partial", "miss the others"}},
      {"all_gather along an axis other than the one cut", "mp=2",
       [](Shard& s) { all_gather(s.shard(ones(Shape{{"i", 4}, {"j", 2}}), {{"i", "mp"}}), "mp", "j"); },
       {"all_gather", "cut along 'i'", "gather along 'i'"}},
      {"all_gather over a mesh axis named twice", "mp=2",
       [](Shard& s) { all_gather(s.shard(ones(Shape{{"i", 4}}), {{"i", "mp"}}), {"mp", "mp"}, "i"); }, {"all_gather", "'mp' named twice"}},
      {"devices scattering along different axes at one call", "mp=2",
       [](Shard& s) { psum_scatter(pvary(ones(Shape{{"i", 2}, {"j", 2}}), "mp"), "mp", s.device() == 0 ? "i" : "j"); },
       {"psum_scatter", "mismatch"}},
      {"all_to_all of a partial sum", "mp=2", [](Shard& s) { all_to_all(partial_of(s), "mp", "batch", "embed"); },
       {"all_to_all", "partial", "psum_scatter"}},
      {"all_gather_invariant of a partial sum", "mp=2", [](Shard& s) { all_gather_invariant(partial_of(s), "mp", "batch"); },
       {"all_gather_invariant", "partial sum", "psum"}},
      {"psum of a local mean", "dp=2", [](Shard& s) { psum(mean(s.shard(ones(Shape{{"batch", 4}}), {{"batch", "dp"}}), "batch"), "dp"); },
       {"psum", "local mean", "pmean"}},
      {"pvary of a partial sum", "mp=2", [](Shard& s) { pvary(partial_of(s), "mp"); }, {"pvary", "partial", "psum"}},
      {"gather of a partial sum", "mp=2", [](Shard& s) { s.gather(partial_of(s)); }, {"gather", "partial sum", "psum"}},
      {"grad of a partial loss", "mp=2",
       [](Shard& s) {
         Tensor w = parameter(w_of(s));
         grad(sum(dot(h_of(s), w, "mlp"), {"batch", "embed"}), {w});
       },
       {"grad", "partial sum", "psum over 'mp' first"}},
      {"a per-device value added to a partial sum through concat", "mp=2",
       [](Shard& s) { concat({partial_of(s), pvary(ones(Shape{{"batch", kB}, {"embed", kE}}, DType::f64), "mp")}, "batch"); },
       {"concat", "Varying", "after the psum"}},
      {"a written zero accumulator", "mp=2",
       [](Shard& s) {
         const Tensor p = partial_of(s);
         Tensor acc = zeros_like(p);
         acc.mutable_data<double>()[0] = 1;
         psum(acc + p, "mp");
       },
       {"add", "Invariant", "after the psum"}},
      {"stack of a partial sum and a whole value", "mp=2", [](Shard& s) { stack({partial_of(s), ones(Shape{{"batch", kB}, {"embed", kE}}, DType::f64)}, "k"); },
       {"stack", "partial sum"}},
      {"a vocab-parallel lookup of per-device ids", "mp=2",
       [](Shard& s) {
         const Tensor table = s.shard(ones(Shape{{"vocab", 4}, {"e", 2}}), {{"vocab", "mp"}});
         const Tensor ids = pvary(from_vector(Shape{{"t", 2}}, std::vector<std::int32_t>{0, 3}), "mp");
         psum(embedding(table, ids, "vocab"), "mp");
       },
       {"embedding", "not Invariant over mesh axis 'mp'", "same ids"}},
      {"psum of a mean of a dp-cut batch under a per-device dropout mask", "dp=2",
       [](Shard& s) {
         const Tensor x = s.shard(ones(Shape{{"batch", 4}}), {{"batch", "dp"}});
         const Tensor mask = pvary(ones(Shape{{"batch", 2}}), "dp");  // per-device values for this device's rows
         psum(mean(x * mask, "batch"), "dp");
       },
       {"psum", "local mean", "pmean"}},
      {"psum of a block under a per-device mask (a psum of Split values in disguise)", "mp=2",
       [](Shard& s) { psum(s.shard(arange({"i", 4}), {{"i", "mp"}}) * pvary(ones(Shape{{"i", 2}}), "mp"), "mp"); },
       {"psum", "Split"}},
      {"a column-parallel product, then a bias before the reduce-scatter (sequence parallel)", "mp=2",
       [](Shard& s) {
         const Tensor x = s.shard(ones(Shape{{"seq", 4}, {"embed", kE}}, DType::f64), {{"seq", "mp"}});
         const Tensor xg = all_gather(x, "mp", "seq");  // Varying over mp
         const Tensor h = dot(xg, s.shard(ones(Shape{{"embed", kE}, {"mlp", 4}}, DType::f64), kRules), "embed");
         const Tensor o = dot(h, s.shard(ones(Shape{{"mlp", 4}, {"embed", kE}}, DType::f64), kRules), "mlp");
         psum_scatter(o + bias(), "mp", "seq");
       },
       {"add", "partial sum", "after the psum"}},
      {"cross_entropy with a target outside the vocabulary", "mp=2",
       [](Shard&) {
         cross_entropy(ones(Shape{{"b", 2}, {"vocab", 3}}, DType::f64), from_vector(Shape{{"b", 2}}, std::vector<std::int32_t>{0, 9}), "vocab");
       },
       {"cross_entropy", "target 9", "outside the vocabulary"}},
      {"as_partial of an Invariant value", "mp=2", [](Shard&) { as_partial(bias(), "mp"); }, {"as_partial", "Invariant", "pvary"}},
      {"expect_vary of a partial sum expected varying", "mp=2", [](Shard& s) { expect_vary(partial_of(s), "mp=varying"); },
       {"expect_vary", "partial", "mp=varying"}},
  };
}

std::map<std::string, Runtime>& runtimes() {
  static std::map<std::string, Runtime> r;
  return r;
}

Runtime& runtime(const std::string& mesh) {
  auto it = runtimes().find(mesh);
  if (it == runtimes().end()) it = runtimes().emplace(mesh, Runtime::local(Mesh::parse(mesh), {.collective_timeout_s = 10})).first;
  return it->second;
}

}  // namespace

TEST_CASE("each mistake with a partial value raises a nax::Error naming the op and the fix", "[partial]") {
  const auto cases = catalog();
  for (const auto& m : cases) {
    INFO("mistake: " << m.what << " on " << m.mesh);
    std::string message;
    try {
      runtime(m.mesh).run(m.program);
    } catch (const Error& e) {
      message = e.what();
    }
    INFO("message: " << message);
    REQUIRE_FALSE(message.empty());
    for (const auto& w : m.words) CHECK_THAT(message, Contains(w));
  }
}

TEST_CASE("contractions and reductions over a cut axis make partial values; linear ops keep them", "[partial]") {
  auto strs = runtime("dp=2,mp=2").run([](Shard& s) {
    const Tensor p = partial_of(s);
    const Tensor x = s.shard(ones(Shape{{"batch", 4}, {"e", 2}}), {{"batch", "dp"}});
    return std::vector<std::string>{
        p.str(),                                                    // 0
        sum(h_of(s), "mlp").str(),                                  // 1
        mean(x, "batch").str(),                                     // 2
        (p + p - p).str(),                                          // 3
        (-p * 2.0 / 3.0).str(),                                     // 4
        (p * bias()).str(),                                         // 5
        dot(p, bias(), "embed").str(),                              // 6
        transpose(rename(p, "embed", "e"), {"e", "batch"}).str(),   // 7
        concat({p, p}, "batch").str(),                              // 8
        cumsum(p, "embed").str(),                                   // 9
        sum(p, "embed").str(),                                      // 10
        (zeros(Shape{{"batch", kB}, {"embed", kE}}, DType::f64) + p).str(),  // 11: zeros are a term of any sum
        zeros_like(p).str(),                                        // 12
        full_like(p, 1.0).str(),                                    // 13: a nonzero constant is the same everywhere
        where(gt(bias(), scalar(1.5, DType::f64)), p, zeros_like(p)).str(),  // 14
        ppermute(p, "mp", {{0, 1}, {1, 0}}).str(),                  // 15: the terms change places
        psum(p, "mp").str(),                                        // 16
        psum_scatter(p, "mp", "batch").str(),                       // 17
        pmean(mean(x, "batch"), "dp").str(),                        // 18
    };
  })[0];
  REQUIRE(strs[0] == "f64[batch=2, embed=3] partial{mp}");
  REQUIRE(strs[1] == "f64[batch=2] partial{mp}");
  REQUIRE(strs[2] == "f32[e=2] partial-mean{dp}");
  REQUIRE(strs[3] == "f64[batch=2, embed=3] partial{mp}");
  REQUIRE(strs[4] == "f64[batch=2, embed=3] partial{mp}");
  REQUIRE(strs[5] == "f64[batch=2, embed=3] partial{mp}");
  REQUIRE(strs[6] == "f64[batch=2] partial{mp}");
  REQUIRE(strs[7] == "f64[e=3, batch=2] partial{mp}");
  REQUIRE(strs[8] == "f64[batch=4, embed=3] partial{mp}");
  REQUIRE(strs[9] == "f64[batch=2, embed=3] partial{mp}");
  REQUIRE(strs[10] == "f64[batch=2] partial{mp}");
  REQUIRE(strs[11] == "f64[batch=2, embed=3] partial{mp}");
  REQUIRE(strs[12] == "f64[batch=2, embed=3] varying{}");  // a known zero, Invariant
  REQUIRE(strs[13] == "f64[batch=2, embed=3] varying{}");
  REQUIRE(strs[14] == "f64[batch=2, embed=3] partial{mp}");
  REQUIRE(strs[15] == "f64[batch=2, embed=3] partial{mp}");
  REQUIRE(strs[16] == "f64[batch=2, embed=3] varying{}");
  REQUIRE(strs[17] == "f64[batch=1|mp, embed=3] varying{}");
  REQUIRE(strs[18] == "f32[e=2] varying{}");
}

TEST_CASE("a local mean takes constants and per-device values: pmean averages them", "[partial]") {
  auto got = runtime("dp=2").run([](Shard& s) {
    const Tensor x = s.shard(from_vector(Shape{{"batch", 4}}, std::vector<double>{1, 2, 3, 4}, DType::f64), {{"batch", "dp"}});
    const Tensor local = mean(square(x), "batch");                                   // partial-mean{dp}
    const Tensor aux = pvary(full(Shape{}, 10.0 * (1 + axis_index("dp").item()), DType::f64), "dp");  // per-device
    const Tensor loss = pmean(local + 0.5 + aux * 0.1, "dp");
    NAX_EXPECT_THROWS(psum(local + 0.5, "dp"));
    NAX_EXPECT_THROWS(local + sum(x, "batch"));  // a mean and a sum do not add
    return loss.item();
  });
  // mean of squares 7.5, plus 0.5, plus the mean of 1 and 2.
  for (double v : got) REQUIRE(v == 7.5 + 0.5 + 1.5);
}

TEST_CASE("linear combinations of partial sums finish to the host's values", "[partial]") {
  auto got = runtime("dp=2,mp=2").run([](Shard& s) {
    const Tensor p = partial_of(s);
    // Accumulated from zeros, scaled, negated, subtracted and masked before one psum.
    Tensor acc = zeros(Shape{{"batch", kB}, {"embed", kE}}, DType::f64);
    for (int k = 0; k < 3; ++k) acc = acc + p * static_cast<double>(k);
    const Tensor keep = gt(bias(), scalar(1.5, DType::f64));
    const Tensor combined = where(keep, acc - p * 0.5, zeros_like(p)) + (-p);
    // Each device's term weighted its own way: a weighted sum, still one sum of terms.
    const Tensor weights = pvary(full(Shape{}, 1.0 + axis_index("mp").item(), DType::f64), "mp");
    const Tensor by_rank = p * weights;
    NAX_EXPECT(by_rank.vary().partial_sum("mp"));
    const Tensor terms = p + as_partial(pvary(bias(), "mp") * (1.0 + axis_index("mp").item()), "mp");
    std::vector<std::vector<double>> out;
    for (const Tensor& t : {psum(combined, "mp"), psum(by_rank, "mp"), psum(terms, "mp"), psum(cumsum(p, "embed"), "mp")})
      out.push_back(s.gather(t).to_vector<double>());
    return out;
  });
  const int n = 2;  // mp
  std::vector<double> combined, by_rank, terms, cumulative;
  for (int b = 0; b < kB; ++b) {
    double running = 0;
    for (int e = 0; e < kE; ++e) {
      const double whole = hw(b, e);
      combined.push_back((e + 1 > 1.5 ? 3 * whole - 0.5 * whole : 0.0) - whole);
      double weighted = 0;  // mp rank r holds m = 2r, 2r + 1
      for (int r = 0; r < n; ++r)
        for (int m = 2 * r; m < 2 * r + 2; ++m) weighted += (1.0 + r) * (b + 0.5 * m + 1) * ((m + 1) * (e - 1) / 4.0);
      by_rank.push_back(weighted);
      terms.push_back((e + 1) * (1 + 2) + whole);  // bias e + 1 times 1 and 2
      running += whole;
      cumulative.push_back(running);
    }
  }
  for (const auto& device : got) {
    require_close(device[0], combined, 1e-12);
    require_close(device[1], by_rank, 1e-12);
    require_close(device[2], terms, 1e-12);
    require_close(device[3], cumulative, 1e-12);
  }
}

TEST_CASE("a reduce-scatter written with ppermute keeps its terms partial until as_split", "[partial]") {
  auto got = runtime("mp=2").run([](Shard& s) {
    const Tensor p = partial_of(s);  // [batch=2, embed=3], partial over mp
    const int r = static_cast<int>(axis_index("mp").item());
    // Device r ends with the sum of row r: it sends its term of row 1 - r and adds its own of row r.
    const Tensor sent = ppermute(slice(p, "batch", 1 - r, 2 - r), "mp", {{0, 1}, {1, 0}});
    const Tensor mine = slice(p, "batch", r, r + 1) + sent;
    const Tensor block = as_split(mine, "mp", "batch");
    const Tensor reference = psum_scatter(p, "mp", "batch");
    NAX_EXPECT(block.vary() == reference.vary());
    return std::vector<std::vector<double>>{s.gather(block).to_vector<double>(), s.gather(reference).to_vector<double>()};
  });
  std::vector<double> want;
  for (int b = 0; b < kB; ++b)
    for (int e = 0; e < kE; ++e) want.push_back(hw(b, e));
  for (const auto& device : got) {
    require_close(device[0], want, 1e-12);
    require_close(device[1], want, 1e-12);
  }
}

TEST_CASE("scatter_add of a batch cut over dp into zeros is a partial sum that psum finishes", "[partial]") {
  const std::vector<std::int32_t> ids{0, 2, 2, 1};
  auto got = runtime("dp=2").run([&](Shard& s) {
    const Tensor local_ids = s.shard(from_vector(Shape{{"batch", 4}}, ids), {{"batch", "dp"}});
    const Tensor rows = s.shard(from_vector(Shape{{"batch", 4}}, std::vector<double>{1, 2, 3, 4}, DType::f64), {{"batch", "dp"}});
    const Tensor added = scatter_add(zeros(Shape{{"vocab", 3}}, DType::f64), "vocab", local_ids, rows);
    NAX_EXPECT(added.vary().partial_sum("dp"));
    return s.gather(psum(added, "dp")).to_vector<double>();
  });
  for (const auto& device : got) REQUIRE(device == std::vector<double>{1, 4, 5});
}

TEST_CASE("known zeros: made by zeros, full(0) and zeros_like, lost by a write", "[partial]") {
  REQUIRE(zeros(Shape{{"i", 2}}).known_zero());
  REQUIRE(full(Shape{{"i", 2}}, 0.0).known_zero());
  REQUIRE_FALSE(full(Shape{{"i", 2}}, -0.0).known_zero());
  REQUIRE_FALSE(ones(Shape{{"i", 2}}).known_zero());
  REQUIRE(zeros_like(ones(Shape{{"i", 2}})).known_zero());
  REQUIRE(cast(zeros(Shape{{"i", 2}}), DType::f64).known_zero());
  Tensor written = zeros(Shape{{"i", 2}});
  written.mutable_data<float>()[0] = 5;
  REQUIRE_FALSE(written.known_zero());
  REQUIRE_FALSE((zeros(Shape{{"i", 2}}) + zeros(Shape{{"i", 2}})).known_zero());  // an op's result is not marked
  // A written "zero" added to a partial sum is refused like any Invariant value.
  REQUIRE_THROWS_WITH(runtime("mp=2").run([&](Shard& s) {
    Tensor acc = zeros(Shape{{"batch", kB}, {"embed", kE}}, DType::f64);
    acc.mutable_data<double>()[0] = 1;
    return (acc + partial_of(s)).str();
  }), Contains("add") && Contains("after the psum"));
}

TEST_CASE("gradients through partial sums equal finite differences", "[partial][grad]") {
  Tensor h = random_input(Shape{{"batch", 2}, {"mlp", 4}}, "h"), w = random_input(Shape{{"mlp", 4}, {"embed", 3}}, "w");
  Tensor c = random_input(Shape{{"embed", 3}}, "c");
  for (const std::string spec : {"mp=2", "dp=2,mp=2"}) {
    INFO("mesh " << spec);
    Runtime rt = Runtime::local(Mesh::parse(spec));
    const AxisRules rules = spec == "mp=2" ? AxisRules{{"mlp", "mp"}} : AxisRules{{"mlp", "mp"}, {"batch", "dp"}};
    check_mesh_gradients(rt, [&](Shard&, const std::vector<Tensor>& p) {
      const Tensor partial = dot(p[0], p[1], "mlp");                    // partial over mp
      const Tensor weights = pvary(full(Shape{}, 1.0 + axis_index("mp").item(), DType::f64), "mp");
      Tensor acc = zeros_like(partial);
      acc = acc + partial * p[2] - partial;                            // scaled by a parameter
      const Tensor weighted = psum(as_varying(partial, "mp") * weights, "mp");  // each term its own weight, on purpose
      const Tensor finished = psum(cumsum(concat({acc, -acc}, "embed"), "embed"), "mp");
      const Tensor loss = sum(tanh(finished) * finished, {"batch", "embed"}) + sum(weighted * weighted, {"batch", "embed"});
      return loss.vary().unreduced_mesh_axes().empty() ? loss : psum(loss, loss.vary().unreduced_mesh_axes());
    }, {h, w, c}, rules);
  }
}

TEST_CASE("the global view takes a partial sum as Partial(sum) and per-device values only with their reduction", "[partial][global]") {
  auto got = runtime("mp=2").run([](Shard& s) {
    const Tensor xs = s.shard(from_vector(Shape{{"i", 4}}, std::vector<double>{1, 2, 3, 4}, DType::f64), {{"i", "mp"}});
    NAX_EXPECT_THROWS(GlobalTensor::from_local(max(xs, "i")));  // per-device maxima: sum or max?
    const GlobalTensor largest = GlobalTensor::from_local(max(xs, "i"), {{"mp", ReduceOp::max}});
    const GlobalTensor total = GlobalTensor::from_local(sum(xs, "i"));
    NAX_EXPECT(total.placements().on("mp").is_partial() && total.placements().on("mp").op() == ReduceOp::sum);
    NAX_EXPECT_THROWS(GlobalTensor::from_local(sum(xs, "i"), {{"mp", ReduceOp::max}}));
    return std::vector<double>{redistribute(largest, Placements{}).local().item(), redistribute(total, Placements{}).local().item()};
  });
  for (const auto& v : got) REQUIRE(v == std::vector<double>{4, 10});
}
