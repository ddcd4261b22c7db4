// dot: contraction over named axes, against a direct sum, for every layout class the GEMM path
// distinguishes (plain, transposed operands, batch axes anywhere, several contracted axes).
#include "helpers.h"
#include "nax/kernels/kernels.h"

using namespace nax;
using nax::testing::at;
using nax::testing::for_each_index;

namespace {

// sum over `contract` of a * b, element by element.
void require_dot_matches(const Tensor& a, const Tensor& b, const std::vector<std::string>& contract, double tol) {
  Tensor c = dot(a, b, contract);
  auto va = a.to_vector<double>(), vb = b.to_vector<double>(), vc = c.to_vector<double>();
  std::vector<Axis> k_axes;
  for (const auto& k : contract) k_axes.push_back({k, a.shape().size(k)});
  for_each_index(c.shape(), [&](const auto& out_index) {
    double want = 0;
    for_each_index(Shape(k_axes), [&](const auto& k_index) {
      auto index = out_index;
      index.insert(k_index.begin(), k_index.end());
      want += at(a, va, index) * at(b, vb, index);
    });
    REQUIRE(at(c, vc, out_index) == Approx(want).epsilon(tol).margin(tol));
  });
}

Tensor rand(const Shape& s, const char* name, DType dtype = DType::f64) { return random_normal(s, 5, name, 1.0, dtype); }

}  // namespace

TEST_CASE("dot: result axes are batch, left free, right free", "[ops][dot]") {
  Tensor q = rand(Shape{{"b", 2}, {"s", 3}, {"h", 4}, {"d", 5}}, "q");
  Tensor k = rand(Shape{{"b", 2}, {"t", 6}, {"h", 4}, {"d", 5}}, "k");
  Tensor scores = dot(q, k, "d");
  REQUIRE(scores.shape() == Shape{{"b", 2}, {"h", 4}, {"s", 3}, {"t", 6}});
}

TEST_CASE("dot matches a direct sum for every operand layout", "[ops][dot]") {
  const Shape mk{{"m", 7}, {"k", 5}}, km{{"k", 5}, {"m", 7}}, kn{{"k", 5}, {"n", 6}}, nk{{"n", 6}, {"k", 5}};
  SECTION("plain and transposed operands") {
    for (const auto& sa : {mk, km})
      for (const auto& sb : {kn, nk}) require_dot_matches(rand(sa, "a"), rand(sb, "b"), {"k"}, 1e-12);
  }
  SECTION("batch axes leading, in the middle, or in different orders") {
    Tensor q = rand(Shape{{"b", 2}, {"s", 3}, {"h", 4}, {"d", 5}}, "q");
    Tensor k = rand(Shape{{"b", 2}, {"t", 6}, {"h", 4}, {"d", 5}}, "k");
    require_dot_matches(q, k, {"d"}, 1e-12);
    Tensor k2 = rand(Shape{{"h", 4}, {"d", 5}, {"t", 6}, {"b", 2}}, "k2");
    require_dot_matches(q, k2, {"d"}, 1e-12);
  }
  SECTION("several contracted axes, in either operand's order") {
    Tensor a = rand(Shape{{"x", 3}, {"h", 4}, {"d", 5}}, "a");
    Tensor w = rand(Shape{{"h", 4}, {"d", 5}, {"y", 2}}, "w");
    require_dot_matches(a, w, {"h", "d"}, 1e-12);
    Tensor w2 = rand(Shape{{"d", 5}, {"y", 2}, {"h", 4}}, "w2");
    require_dot_matches(a, w2, {"d", "h"}, 1e-12);
  }
  SECTION("vector products and outer products") {
    Tensor u = rand(Shape{{"k", 9}}, "u"), v = rand(Shape{{"k", 9}}, "v");
    require_dot_matches(u, v, {"k"}, 1e-12);
    REQUIRE(dot(u, v, "k").shape() == Shape{});
    Tensor w = rand(Shape{{"n", 4}}, "w");
    require_dot_matches(u, w, {}, 1e-12);
  }
  SECTION("size-one and empty axes") {
    require_dot_matches(rand(Shape{{"m", 1}, {"k", 5}}, "a"), rand(Shape{{"n", 1}, {"k", 5}}, "b"), {"k"}, 1e-12);
    Tensor e = dot(zeros(Shape{{"m", 3}, {"k", 0}}, DType::f64), zeros(Shape{{"k", 0}, {"n", 2}}, DType::f64), "k");
    REQUIRE(e.to_vector<double>() == std::vector<double>(6, 0.0));
  }
}

TEST_CASE("dot in f32 and bf16", "[ops][dot]") {
  Tensor a = rand(Shape{{"m", 8}, {"k", 16}}, "a", DType::f32), b = rand(Shape{{"k", 16}, {"n", 4}}, "b", DType::f32);
  require_dot_matches(a, b, {"k"}, 1e-5);
  Tensor c = dot(cast(a, DType::bf16), cast(b, DType::bf16), "k");
  REQUIRE(c.dtype() == DType::bf16);
  auto got = c.to_vector<double>();
  auto want = dot(cast(cast(a, DType::bf16), DType::f32), cast(cast(b, DType::bf16), DType::f32), "k").to_vector<double>();
  REQUIRE(nax::testing::max_rel_error(got, want) < 1e-2);
}

// bf16 dot, through the CPU's bf16 GEMM where it has one (oneDNN) or widened to f32 otherwise:
// each element the f32 sum of the bf16 products, rounded once to bf16. Checked element by element
// against f64 on the same bf16 values, for plain, transposed and strided batched GEMM views.
TEST_CASE("bf16 dot rounds each element once from an f32-accumulated sum", "[ops][dot]") {
  INFO("this CPU's GEMM takes bf16 itself: " << Device::host()->kernels().gemm_computes(DType::bf16));
  struct Case {
    Shape a, b;
    Names contract;
  };
  const std::vector<Case> cases = {
      {Shape{{"m", 33}, {"k", 70}}, Shape{{"k", 70}, {"n", 17}}, {"k"}},
      {Shape{{"k", 64}, {"m", 20}}, Shape{{"n", 12}, {"k", 64}}, {"k"}},  // both operands transposed in memory
      {Shape{{"b", 3}, {"s", 16}, {"h", 2}, {"d", 32}}, Shape{{"b", 3}, {"t", 16}, {"h", 2}, {"d", 32}}, {"d"}},  // batched, strided
  };
  for (const auto& c : cases) {
    const Tensor a = cast(rand(c.a, "a", DType::f32), DType::bf16), b = cast(rand(c.b, "b", DType::f32), DType::bf16);
    const Tensor got = dot(a, b, c.contract);
    REQUIRE(got.dtype() == DType::bf16);
    const Tensor exact = dot(cast(a, DType::f64), cast(b, DType::f64), c.contract);
    const Tensor magnitude = dot(abs(cast(a, DType::f64)), abs(cast(b, DType::f64)), c.contract);
    const auto g = transpose(cast(got, DType::f64), exact.shape().names()).to_vector<double>();
    const auto e = exact.to_vector<double>(), m = magnitude.to_vector<double>();
    for (std::size_t i = 0; i < e.size(); ++i) {
      INFO(a.str() << " . " << b.str() << " element " << i << ": " << g[i] << " vs " << e[i]);
      REQUIRE(std::abs(g[i] - e[i]) <= std::ldexp(std::abs(e[i]), -8) + 1e-5 * m[i]);  // half a bf16 ulp, plus f32 sums
    }
  }
}

// f32 dot with products large enough for the CPU's oneDNN GEMM (under NAX_F32_GEMM=onednn, where
// oneDNN is there: ctest runs this case so too; OpenBLAS otherwise), against f64 on the same values
// element by element: plain, transposed in memory, batched with strides, a batch axis in between.
TEST_CASE("f32 dot of a transformer's sizes is the f64 sum to f32 accuracy, in every GEMM view", "[ops][dot]") {
  struct Case {
    Shape a, b;
    Names contract;
  };
  const std::vector<Case> cases = {
      {Shape{{"m", 96}, {"k", 130}}, Shape{{"k", 130}, {"n", 80}}, {"k"}},
      {Shape{{"k", 128}, {"m", 70}}, Shape{{"n", 72}, {"k", 128}}, {"k"}},  // both operands transposed in memory
      {Shape{{"b", 3}, {"s", 64}, {"h", 2}, {"d", 64}}, Shape{{"b", 3}, {"t", 64}, {"h", 2}, {"d", 64}}, {"d"}},  // batched, strided
      {Shape{{"s", 64}, {"b", 4}, {"e", 96}}, Shape{{"e", 96}, {"f", 64}}, {"e"}},
  };
  for (const auto& c : cases) {
    const Tensor a = rand(c.a, "a", DType::f32), b = rand(c.b, "b", DType::f32);
    const Tensor got = dot(a, b, c.contract);
    REQUIRE(got.dtype() == DType::f32);
    const Tensor exact = dot(cast(a, DType::f64), cast(b, DType::f64), c.contract);
    const Tensor magnitude = dot(abs(cast(a, DType::f64)), abs(cast(b, DType::f64)), c.contract);
    const auto g = transpose(cast(got, DType::f64), exact.shape().names()).to_vector<double>();
    const auto e = exact.to_vector<double>(), m = magnitude.to_vector<double>();
    for (std::size_t i = 0; i < e.size(); ++i) {
      INFO(a.str() << " . " << b.str() << " element " << i << ": " << g[i] << " vs " << e[i]);
      REQUIRE(std::abs(g[i] - e[i]) <= 1e-5 * m[i] + 1e-30);  // f32 sums of f32 products; NaN fails
    }
  }
}

TEST_CASE("dot copies no operand when the strides allow a GEMM view", "[ops][dot]") {
  auto& alloc = Device::host()->allocator();
  Tensor q = rand(Shape{{"b", 2}, {"s", 8}, {"h", 4}, {"d", 16}}, "q", DType::f32);
  Tensor k = rand(Shape{{"b", 2}, {"t", 8}, {"h", 4}, {"d", 16}}, "k", DType::f32);
  Tensor w = rand(Shape{{"d", 16}, {"e", 8}}, "w", DType::f32);
  Tensor wt = rand(Shape{{"e", 8}, {"d", 16}}, "wt", DType::f32);
  for (auto [a, b] : {std::pair{q, k}, std::pair{q, w}, std::pair{q, wt}}) {
    auto before = alloc.stats().allocations;
    Tensor c = dot(a, b, "d");
    REQUIRE(alloc.stats().allocations - before == 1);  // the result only
  }
}
