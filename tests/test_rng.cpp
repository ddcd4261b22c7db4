// The fast random paths (batched Philox, vectorised normals, threaded tensor fill) against the
// scalar generator they replace: the same bits for the same (seed, name, index).
#include <bit>
#include <cstring>

#include "helpers.h"
#include "nax/core/rng.h"

using namespace nax;

namespace {
// Counters to start runs at: 0, odd, across the 32-bit boundary of the counter's low word, far out.
const std::vector<std::uint64_t> kFirsts = {0, 5, (1ull << 32) - 7, (1ull << 40) + 3};
constexpr std::int64_t kRun = (1 << 18) + 13;  // not a multiple of the batch

std::uint64_t ulps_apart(double a, double b) {
  if ((a < 0) != (b < 0)) return a == b ? 0 : ~0ull;
  auto x = std::bit_cast<std::uint64_t>(std::abs(a)), y = std::bit_cast<std::uint64_t>(std::abs(b));
  return x > y ? x - y : y - x;
}
}  // namespace

TEST_CASE("rng runs equal the scalar uniform and normal bit for bit", "[core][rng]") {
  std::vector<double> run(kRun);
  for (auto first : kFirsts) {
    rng::Key key = rng::make_key(first, "run");
    rng::uniform_run(key, first, kRun, run.data());
    for (std::int64_t i = 0; i < kRun; ++i) REQUIRE(run[i] == rng::uniform(key, first + i));
    rng::normal_run(key, first, kRun, run.data());
    for (std::int64_t i = 0; i < kRun; ++i) REQUIRE(run[i] == rng::normal(key, first + i));
  }
}

TEST_CASE("fast f32 normals equal float(scale * normal) bit for bit", "[core][rng]") {
  std::vector<float> fast(kRun);
  std::int64_t mismatches = 0;
  for (auto first : kFirsts)
    for (double scale : {1.0, 0.02, 3.7, -0.5}) {
      rng::Key key = rng::make_key(7, "f32");
      rng::normal_run_f32(key, first, kRun, scale, fast.data());
      for (std::int64_t i = 0; i < kRun; ++i) {
        const float want = static_cast<float>(scale * rng::normal(key, first + i));
        mismatches += std::memcmp(&want, &fast[static_cast<std::size_t>(i)], sizeof want) != 0;
      }
    }
  REQUIRE(mismatches == 0);
}

TEST_CASE("the vectorised normal's error stays far inside the f32 path's margin", "[core][rng]") {
  // normal_run_f32 trusts the approximation where v is over 2^16 double ulps from a float rounding
  // midpoint; the approximation must be orders of magnitude closer than that.
  std::vector<double> approx(kRun);
  std::uint64_t worst = 0;
  for (auto first : kFirsts) {
    rng::Key key = rng::make_key(11, "approx");
    rng::normal_run_approx(key, first, kRun, approx.data());
    for (std::int64_t i = 0; i < kRun; ++i) worst = std::max(worst, ulps_apart(approx[i], rng::normal(key, first + i)));
  }
  INFO("worst error " << worst << " ulps");
  REQUIRE(worst <= 64);
}

TEST_CASE("random tensors (threaded fill) equal the scalar generator in every dtype", "[core][rng]") {
  const Shape shape{{"a", 600}, {"b", 1031}};  // over 2^19 elements: filled by several threads where there are cores
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    std::vector<double> normal(static_cast<std::size_t>(shape.numel())), uniform(normal.size());
    rng::Key kn = rng::make_key(3, "n"), ku = rng::make_key(3, "u");
    for (std::size_t i = 0; i < normal.size(); ++i) {
      normal[i] = 0.02 * rng::normal(kn, i);
      uniform[i] = -2 + (5 - -2) * rng::uniform(ku, i);
    }
    INFO(dtype_name(dtype));
    nax::testing::require_equal(random_normal(shape, 3, "n", 0.02, dtype), from_vector(shape, normal, dtype));
    nax::testing::require_equal(random_uniform(shape, 3, "u", -2, 5, dtype), from_vector(shape, uniform, dtype));
  }
}

TEST_CASE("a device's block of a random tensor is the same slice of the whole", "[core][rng]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=3"));
  const Shape shape{{"a", 4}, {"b", 3003}, {"c", 5}};
  Tensor whole = random_normal(shape, 9, "w", 0.5);
  rt.run([&](Shard& s) {
    AxisRules rules{{"a", "dp"}, {"b", "mp"}};
    Tensor block = s.random_normal(shape, rules, 9, "w", 0.5);
    NAX_EXPECT(nax::testing::same_values(block, s.shard(whole, rules)));
    return 0;
  });
}
