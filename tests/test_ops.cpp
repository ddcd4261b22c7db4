// Elementwise ops, reductions and layout ops against element-by-element references.
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "helpers.h"

using namespace nax;
using nax::testing::at;
using nax::testing::for_each_index;

namespace {
Tensor rand(const Shape& s, const char* name, DType dtype = DType::f32) { return random_normal(s, 11, name, 1.0, dtype); }
}  // namespace

TEST_CASE("elementwise ops broadcast by axis name", "[ops]") {
  Tensor x = rand(Shape{{"batch", 3}, {"embed", 5}}, "x");
  Tensor bias = rand(Shape{{"embed", 5}}, "b");
  Tensor col = rand(Shape{{"seq", 4}, {"batch", 3}}, "c");
  auto vx = x.to_vector<double>(), vb = bias.to_vector<double>(), vc = col.to_vector<double>();

  Tensor y = x + bias;
  REQUIRE(y.shape() == x.shape());
  auto vy = y.to_vector<double>();
  for_each_index(y.shape(), [&](const auto& i) { REQUIRE(at(y, vy, i) == Approx(at(x, vx, i) + at(bias, vb, i))); });

  // Result axes: the left operand's, then the right's others.
  Tensor z = x * col;
  REQUIRE(z.shape() == Shape{{"batch", 3}, {"embed", 5}, {"seq", 4}});
  auto vz = z.to_vector<double>();
  for_each_index(z.shape(), [&](const auto& i) { REQUIRE(at(z, vz, i) == Approx(at(x, vx, i) * at(col, vc, i))); });

  Tensor w = bias - x;  // the broadcast operand on the left
  REQUIRE(w.shape() == Shape{{"embed", 5}, {"batch", 3}});
  auto vw = w.to_vector<double>();
  for_each_index(w.shape(), [&](const auto& i) { REQUIRE(at(w, vw, i) == Approx(at(bias, vb, i) - at(x, vx, i))); });
}

TEST_CASE("binary ops, comparisons and scalars match scalar code", "[ops]") {
  Tensor a = rand(Shape{{"i", 64}}, "a");
  Tensor b = rand(Shape{{"i", 64}}, "b");
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  struct Case {
    Tensor got;
    std::function<double(float, float)> want;
  };
  std::vector<Case> cases = {
      {a + b, [](float x, float y) { return x + y; }},      {a - b, [](float x, float y) { return x - y; }},
      {a * b, [](float x, float y) { return x * y; }},      {a / b, [](float x, float y) { return x / y; }},
      {maximum(a, b), [](float x, float y) { return std::max(x, y); }},
      {minimum(a, b), [](float x, float y) { return std::min(x, y); }},
      {pow(abs(a), b), [](float x, float y) { return std::pow(std::abs(x), y); }},
      {lt(a, b), [](float x, float y) { return x < y ? 1.0 : 0.0; }}, {ge(a, b), [](float x, float y) { return x >= y ? 1.0 : 0.0; }},
      {eq(a, a), [](float, float) { return 1.0; }},         {ne(a, b), [](float x, float y) { return x != y ? 1.0 : 0.0; }},
      {a * 2.0 + 1.0, [](float x, float) { return x * 2 + 1; }},
      {1.0 - a, [](float x, float) { return 1 - x; }},      {2.0 / b, [](float, float y) { return 2 / y; }},
  };
  for (auto& c : cases) {
    auto got = c.got.to_vector<double>();
    for (std::size_t i = 0; i < got.size(); ++i)
      REQUIRE(got[i] == Approx(c.want(static_cast<float>(va[i]), static_cast<float>(vb[i]))).epsilon(1e-5));
  }
}

TEST_CASE("unary ops match scalar code", "[ops]") {
  Tensor x = random_uniform(Shape{{"i", 50}}, 5, "x", 0.1, 3.0, DType::f64);
  auto v = x.to_vector<double>();
  auto check = [&](const Tensor& got, double (*f)(double)) {
    auto g = got.to_vector<double>();
    for (std::size_t i = 0; i < v.size(); ++i) REQUIRE(g[i] == Approx(f(v[i])).epsilon(1e-12));
  };
  check(exp(x), [](double t) { return std::exp(t); });
  check(log(x), [](double t) { return std::log(t); });
  check(sqrt(x), [](double t) { return std::sqrt(t); });
  check(rsqrt(x), [](double t) { return 1 / std::sqrt(t); });
  check(tanh(x), [](double t) { return std::tanh(t); });
  check(square(x), [](double t) { return t * t; });
  check(-x, [](double t) { return -t; });
  check(abs(-x), [](double t) { return t; });
}

TEST_CASE("integer and bf16 arithmetic", "[ops]") {
  Tensor i = arange({"i", 5}, DType::i32);
  REQUIRE((i * i + i).to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 2, 6, 12, 20});
  Tensor h = cast(arange({"i", 5}), DType::bf16);
  Tensor y = h * h + 0.5;
  REQUIRE(y.dtype() == DType::bf16);
  REQUIRE(y.to_vector<double>() == std::vector<double>{0.5, 1.5, 4.5, 9.5, 16.5});
}

namespace {
// x rounded to bf16 by arithmetic, apart from the bit manipulations under test: 8 significant bits
// (fewer below 2^-126, bf16's subnormals), ties to even; past bf16's largest value an infinity.
float bf16_reference(float x) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  int e = 0;
  static_cast<void>(std::frexp(x, &e));  // |x| = m 2^e, 0.5 <= m < 1
  const double quantum = std::ldexp(1.0, std::max(e - 8, -133));
  return static_cast<float>(std::nearbyint(static_cast<double>(x) / quantum) * quantum);
}
float from_bits(bf16 h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h.bits) << 16); }
}  // namespace

TEST_CASE("bf16 elementwise ops give the bits of widening to f32, the f32 op and one rounding", "[ops][bf16]") {
  // Values whose f32 results land on bf16 ties, overflow, underflow, NaN and infinities, and a
  // broadcast (b along j only) and a transposed operand, so that every stride pattern is met. The
  // reference widens the operands' bits, applies the op in f32 and rounds by arithmetic, all here.
  std::vector<float> va, vb;
  const std::vector<float> specials = {0.0f, -0.0f, 1.0f, 1.0f + 0x1.0p-8f, 3.0e38f, -3.0e38f, 1.0e-39f, INFINITY, -INFINITY, NAN};
  for (int i = 0; i < 37; ++i)
    for (int j = 0; j < 23; ++j) {
      const float t = static_cast<float>(std::sin(0.7 * i + 1.3 * j)) * std::ldexp(1.0f, (i * 7 + j) % 40 - 20);
      va.push_back(specials[static_cast<std::size_t>(i * 23 + j) % specials.size()] * (j % 3 == 0 ? 1.0f : 0.0f) + t);
    }
  for (int j = 0; j < 23; ++j) vb.push_back(j % 5 == 0 ? specials[static_cast<std::size_t>(j) % specials.size()] : 0.37f * static_cast<float>(j - 11));
  const Tensor a = cast(from_vector(Shape{{"i", 37}, {"j", 23}}, va), DType::bf16);
  const Tensor b = cast(from_vector(Shape{{"j", 23}}, vb), DType::bf16);
  const Tensor at = transpose(cast(from_vector(Shape{{"j", 23}, {"i", 37}}, va), DType::bf16), {"i", "j"});
  const auto ha = a.to_vector<bf16>(), hb = b.to_vector<bf16>(), hat = at.to_vector<bf16>();
  REQUIRE(ha.size() == 37 * 23);
  REQUIRE(hat.size() == 37 * 23);
  // got[i, j] against f(x[i, j], y[i, j]) rounded, x and y given per (i, j) as bf16 values
  auto check = [](const Tensor& got, const std::function<float(std::size_t, std::size_t)>& want) {
    REQUIRE(got.dtype() == DType::bf16);
    const auto g = got.to_vector<bf16>();
    REQUIRE(g.size() == 37 * 23);
    for (std::size_t i = 0; i < 37; ++i)
      for (std::size_t j = 0; j < 23; ++j) {
        const float w = bf16_reference(want(i, j)), h = from_bits(g[i * 23 + j]);
        INFO("element (" << i << ", " << j << "): " << h << " vs " << w);
        REQUIRE(((std::isnan(h) && std::isnan(w)) || std::bit_cast<std::uint32_t>(h) == std::bit_cast<std::uint32_t>(w)));
      }
  };
  auto x = [&](std::size_t i, std::size_t j) { return from_bits(ha[i * 23 + j]); };
  auto xt = [&](std::size_t i, std::size_t j) { return from_bits(hat[i * 23 + j]); };
  auto y = [&](std::size_t, std::size_t j) { return from_bits(hb[j]); };
  check(a + b, [&](auto i, auto j) { return x(i, j) + y(i, j); });
  check(transpose(b - a, {"i", "j"}), [&](auto i, auto j) { return y(i, j) - x(i, j); });  // b's axes first: [j, i]
  check(a * at, [&](auto i, auto j) { return x(i, j) * xt(i, j); });
  check(a / b, [&](auto i, auto j) { return x(i, j) / y(i, j); });
  check(maximum(a, at), [&](auto i, auto j) { return x(i, j) > xt(i, j) ? x(i, j) : xt(i, j); });
  check(minimum(at, b), [&](auto i, auto j) { return xt(i, j) < y(i, j) ? xt(i, j) : y(i, j); });
  check(pow(abs(a), b), [&](auto i, auto j) { return std::pow(std::fabs(x(i, j)), y(i, j)); });
  check(lt(a, b), [&](auto i, auto j) { return x(i, j) < y(i, j) ? 1.0f : 0.0f; });
  check(eq(a, at), [&](auto i, auto j) { return x(i, j) == xt(i, j) ? 1.0f : 0.0f; });
}

TEST_CASE("reductions over one or several named axes", "[ops]") {
  Tensor x = rand(Shape{{"a", 3}, {"b", 4}, {"c", 5}}, "x", DType::f64);
  auto vx = x.to_vector<double>();
  for (std::vector<std::string> axes : {std::vector<std::string>{"a"}, {"b"}, {"c"}, {"a", "c"}, {"c", "a", "b"}}) {
    Tensor s = sum(x, axes), m = max(x, axes), n = min(x, axes), avg = mean(x, axes);
    auto vs = s.to_vector<double>(), vm = m.to_vector<double>(), vn = n.to_vector<double>(), va = avg.to_vector<double>();
    for_each_index(s.shape(), [&](const auto& out_index) {
      double total = 0, hi = -INFINITY, lo = INFINITY;
      int count = 0;
      for_each_index(x.shape(), [&](const auto& in_index) {
        for (const auto& [name, value] : out_index)
          if (in_index.at(name) != value) return;
        double v = at(x, vx, in_index);
        total += v, hi = std::max(hi, v), lo = std::min(lo, v), ++count;
      });
      REQUIRE(at(s, vs, out_index) == Approx(total).epsilon(1e-12));
      REQUIRE(at(m, vm, out_index) == hi);
      REQUIRE(at(n, vn, out_index) == lo);
      REQUIRE(at(avg, va, out_index) == Approx(total / count).epsilon(1e-12));
    });
  }
  REQUIRE(sum(x, {"a", "b", "c"}).item() == Approx(std::accumulate(vx.begin(), vx.end(), 0.0)));
}

TEST_CASE("rename, transpose, split and merge axes", "[ops]") {
  Tensor x = arange({"i", 24});
  Tensor r = rename(x, "i", "k");
  REQUIRE(r.shape() == Shape{{"k", 24}});
  REQUIRE(r.same_storage(x));  // renaming moves no data

  Tensor s = split_axis(x, "i", {{"a", 2}, {"b", 3}, {"c", 4}});
  REQUIRE(s.shape() == Shape{{"a", 2}, {"b", 3}, {"c", 4}});
  REQUIRE(s.same_storage(x));

  Tensor t = transpose(s, {"c", "a", "b"});
  auto vs = s.to_vector<double>(), vt = t.to_vector<double>();
  for_each_index(t.shape(), [&](const auto& i) { REQUIRE(at(t, vt, i) == at(s, vs, i)); });

  Tensor swapped = rename(s, {{"a", "b"}, {"b", "a"}});
  REQUIRE(swapped.shape() == Shape{{"b", 2}, {"a", 3}, {"c", 4}});

  Tensor m = merge_axes(s, {"b", "c"}, "bc");  // adjacent and in order: no copy
  REQUIRE(m.shape() == Shape{{"a", 2}, {"bc", 12}});
  REQUIRE(m.same_storage(x));
  Tensor m2 = merge_axes(s, {"c", "a"}, "ca");  // brought together where c stands... c is not first, so where "c" is
  REQUIRE(m2.shape() == Shape{{"b", 3}, {"ca", 8}});
  auto v2 = m2.to_vector<double>();
  for_each_index(s.shape(), [&](const auto& i) {
    REQUIRE(at(m2, v2, {{"b", i.at("b")}, {"ca", i.at("c") * 2 + i.at("a")}}) == at(s, vs, i));
  });
}

TEST_CASE("slice and concat along a named axis", "[ops]") {
  Tensor x = split_axis(arange({"i", 24}), "i", {{"a", 4}, {"b", 6}});
  Tensor s = slice(x, "b", 2, 5);
  REQUIRE(s.shape() == Shape{{"a", 4}, {"b", 3}});
  auto vx = x.to_vector<double>(), vs = s.to_vector<double>();
  for_each_index(s.shape(), [&](const auto& i) { REQUIRE(at(s, vs, i) == at(x, vx, {{"a", i.at("a")}, {"b", i.at("b") + 2}})); });

  Tensor joined = concat({slice(x, "b", 0, 2), slice(x, "b", 2, 6)}, "b");
  nax::testing::require_equal(joined, x);
  // Operands in another axis order are brought to the first one's.
  Tensor mixed = concat({slice(x, "a", 0, 1), transpose(slice(x, "a", 1, 4), {"b", "a"})}, "a");
  nax::testing::require_equal(mixed, x);
  REQUIRE(slice(x, "a", 2, 2).numel() == 0);
}

TEST_CASE("cast between f32, f64, bf16 and i32", "[ops]") {
  Tensor x = from_vector(Shape{{"i", 4}}, std::vector<double>{1.5, -2.25, 3.0, 1e10}, DType::f64);
  REQUIRE(cast(x, DType::f32).to_vector<double>() == std::vector<double>{1.5, -2.25, 3.0, 1e10});
  REQUIRE(cast(x, DType::i32).to_vector<std::int32_t>()[1] == -2);
  Tensor h = cast(x, DType::bf16);
  REQUIRE(h.dtype() == DType::bf16);
  REQUIRE(h.to_vector<double>()[0] == 1.5);
  REQUIRE(std::abs(h.to_vector<double>()[3] - 1e10) / 1e10 < 1e-2);
  REQUIRE(cast(x, DType::f64).same_storage(x));
}
