// dot: contraction over named axes, against a direct sum, for every layout class the GEMM path
// distinguishes (plain, transposed operands, batch axes anywhere, several contracted axes).
#include "helpers.h"
#include "nax/kernels/kernels.h"

using namespace nax;
using nax::testing::at;
using nax::testing::for_each_index;

namespace {

// Each element of dot(a, b, contract) summed directly in f64 on the host: fn(index, sum of the
// products, sum of their magnitudes), over the elements of `out` (dot's result shape).
template <typename F>
void for_each_host_sum(const Tensor& a, const Tensor& b, const Names& contract, const Shape& out, F&& fn) {
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  std::vector<Axis> k_axes;
  for (const auto& k : contract.list()) k_axes.push_back({k, a.shape().size(k)});
  for_each_index(out, [&](const auto& out_index) {
    double sum = 0, magnitude = 0;
    for_each_index(Shape(k_axes), [&](const auto& k_index) {
      auto index = out_index;
      index.insert(k_index.begin(), k_index.end());
      const double product = at(a, va, index) * at(b, vb, index);
      sum += product, magnitude += std::abs(product);
    });
    fn(out_index, sum, magnitude);
  });
}

// sum over `contract` of a * b, element by element.
void require_dot_matches(const Tensor& a, const Tensor& b, const std::vector<std::string>& contract, double tol) {
  Tensor c = dot(a, b, contract);
  const auto vc = c.to_vector<double>();
  for_each_host_sum(a, b, contract, c.shape(), [&](const auto& index, double want, double) {
    REQUIRE(at(c, vc, index) == Approx(want).epsilon(tol).margin(tol));
  });
}

// dot(a, b, contract) within `bound(sum, magnitude)` of the host's f64 sum at every element (NaN fails).
template <typename Bound>
void require_dot_within(const Tensor& a, const Tensor& b, const Names& contract, DType dtype, Bound&& bound) {
  const Tensor got = dot(a, b, contract);
  REQUIRE(got.dtype() == dtype);
  const auto g = got.to_vector<double>();
  for_each_host_sum(a, b, contract, got.shape(), [&](const auto& index, double want, double magnitude) {
    const double value = at(got, g, index);
    INFO(a.str() << " . " << b.str() << ": " << value << " vs " << want);
    REQUIRE(std::abs(value - want) <= bound(want, magnitude));
  });
}

struct DotCase {
  Shape a, b;
  Names contract;
};

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
  const std::vector<DotCase> cases = {
      {Shape{{"m", 33}, {"k", 70}}, Shape{{"k", 70}, {"n", 17}}, {"k"}},
      {Shape{{"k", 64}, {"m", 20}}, Shape{{"n", 12}, {"k", 64}}, {"k"}},  // both operands transposed in memory
      {Shape{{"b", 3}, {"s", 16}, {"h", 2}, {"d", 32}}, Shape{{"b", 3}, {"t", 16}, {"h", 2}, {"d", 32}}, {"d"}},  // batched, strided
  };
  for (const auto& c : cases) {
    const Tensor a = cast(rand(c.a, "a", DType::f32), DType::bf16), b = cast(rand(c.b, "b", DType::f32), DType::bf16);
    // half a bf16 ulp, plus f32 sums
    require_dot_within(a, b, c.contract, DType::bf16, [](double sum, double magnitude) { return std::ldexp(std::abs(sum), -8) + 1e-5 * magnitude; });
  }
}

// f32 dot with products large enough for the CPU's oneDNN GEMM (64^3 multiply-adds per matrix;
// under NAX_F32_GEMM=onednn, where oneDNN is there: ctest runs this case so too; OpenBLAS
// otherwise), against the host's f64 sums element by element: plain, transposed in memory, batched
// with strides, a batch axis in between.
TEST_CASE("f32 dot of oneDNN's sizes is the f64 sum to f32 accuracy, in every GEMM view", "[ops][dot]") {
  const std::vector<DotCase> cases = {
      {Shape{{"m", 72}, {"k", 66}}, Shape{{"k", 66}, {"n", 64}}, {"k"}},
      {Shape{{"k", 64}, {"m", 66}}, Shape{{"n", 70}, {"k", 64}}, {"k"}},  // both operands transposed in memory
      {Shape{{"b", 2}, {"s", 64}, {"h", 1}, {"d", 64}}, Shape{{"b", 2}, {"t", 64}, {"h", 1}, {"d", 64}}, {"d"}},  // batched, strided
      {Shape{{"s", 32}, {"b", 2}, {"e", 64}}, Shape{{"e", 64}, {"f", 66}}, {"e"}},
  };
  for (const auto& c : cases)
    require_dot_within(rand(c.a, "a", DType::f32), rand(c.b, "b", DType::f32), c.contract, DType::f32,
                       [](double, double magnitude) { return 1e-5 * magnitude + 1e-30; });  // f32 sums of f32 products
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
