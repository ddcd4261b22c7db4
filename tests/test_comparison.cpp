// The comparison helpers (comparison.h, helpers.h) cannot pass by accident: a NaN planted in a
// result, or in a reference, fails every one of them, and so does a mismatched infinity or size.
#include <cmath>
#include <limits>

#include "helpers.h"

using nax::testing::element_error;
using nax::testing::max_rel_error;
using nax::testing::worst_element;

namespace {
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();
}  // namespace

TEST_CASE("a NaN anywhere is an infinite error", "[unit][comparison]") {
  const std::vector<double> want{1.0, 2.0, 3.0};
  for (std::size_t at = 0; at < want.size(); ++at) {
    std::vector<double> got = want;
    got[at] = kNaN;
    INFO("NaN planted at " << at);
    CHECK(std::isinf(max_rel_error(got, want)));
    CHECK(std::isinf(max_rel_error(want, got)));  // in the reference too
    CHECK(worst_element(got, want).index == at);
    CHECK(std::isinf(max_rel_error(std::vector<float>(got.begin(), got.end()), want)));
  }
  CHECK(std::isinf(element_error(kNaN, kNaN)));
}

TEST_CASE("infinities must match exactly; sizes must match", "[unit][comparison]") {
  CHECK(element_error(kInf, kInf) == 0);
  CHECK(std::isinf(element_error(kInf, -kInf)));
  CHECK(std::isinf(element_error(1e300, kInf)));
  CHECK(std::isinf(max_rel_error(std::vector<double>{1.0}, std::vector<double>{1.0, 2.0})));
  CHECK(max_rel_error(std::vector<double>{}, std::vector<double>{}) == 0);
}

TEST_CASE("the error is absolute near zero and relative elsewhere", "[unit][comparison]") {
  CHECK(element_error(1e-3, 0.0) == Approx(1e-3));
  CHECK(element_error(1001.0, 1000.0) == Approx(1e-3));
  CHECK(max_rel_error(std::vector<double>{1.0, 2.0, 3.5}, std::vector<double>{1.0, 2.0, 3.0}) == Approx(0.5 / 3.0));
}

TEST_CASE("tolerances grow with the dtype's rounding and the reduction length", "[unit][comparison]") {
  using nax::DType;
  using nax::testing::tolerance_for;
  CHECK(tolerance_for(DType::f64) < tolerance_for(DType::f32));
  CHECK(tolerance_for(DType::f32) < tolerance_for(DType::bf16));
  CHECK(tolerance_for(DType::f32, 4096) > tolerance_for(DType::f32, 16));
  CHECK(tolerance_for(DType::i32) == 0);
}

// Catch2's [!shouldfail]: these pass only if the REQUIRE inside fails.
TEST_CASE("require_close fails on a NaN in a vector", "[unit][comparison][!shouldfail]") {
  nax::testing::require_close(std::vector<double>{1.0, kNaN}, std::vector<double>{1.0, 2.0}, 1e300);
}

TEST_CASE("require_close fails on a NaN in a tensor", "[unit][comparison][!shouldfail]") {
  const nax::Tensor t = nax::from_vector(nax::Shape{{"i", 2}}, std::vector<double>{1.0, kNaN});
  nax::testing::require_close(t, std::vector<double>{1.0, 2.0}, 1e300);
}

TEST_CASE("require_close_nan_matching accepts NaN against NaN", "[unit][comparison]") {
  nax::testing::require_close_nan_matching(std::vector<double>{1.0, kNaN, -kInf}, std::vector<double>{1.0, kNaN, -kInf}, 0);
}

TEST_CASE("require_close_nan_matching fails on a NaN against a number", "[unit][comparison][!shouldfail]") {
  nax::testing::require_close_nan_matching(std::vector<double>{1.0, kNaN}, std::vector<double>{1.0, 2.0}, 1e300);
}

TEST_CASE("require_close_nan_matching fails on a number against a NaN", "[unit][comparison][!shouldfail]") {
  nax::testing::require_close_nan_matching(std::vector<double>{1.0, 2.0}, std::vector<double>{1.0, kNaN}, 1e300);
}

TEST_CASE("the scaled comparison of long sums: near-zero elements against the RMS, NaNs and bad tiles fail", "[unit][comparison]") {
  using nax::testing::worst_element_scaled;
  const std::vector<double> want{100.0, -100.0, 1e-9, 100.0};
  std::vector<double> got = want;
  got[2] = 1e-6;  // a cancelled element off by 1e-6: tiny against the RMS (about 87)
  CHECK(worst_element_scaled(got, want).error < 1e-7);
  got[3] = 0.0;  // an unwritten element
  CHECK(worst_element_scaled(got, want).error == Approx(1.0));
  CHECK(worst_element_scaled(got, want).index == 3);
  got[3] = kNaN;
  CHECK(worst_element_scaled(got, want).error == kInf);
  const std::vector<std::int64_t> where{0, 1, 2};  // positions outside `where` are not compared
  CHECK(worst_element_scaled(got, want, &where).error < 1e-7);
  CHECK(worst_element_scaled(std::vector<double>{1.0}, want).error == kInf);
  CHECK(nax::testing::accumulated_tolerance(nax::DType::bf16, 64) > nax::testing::tolerance_for(nax::DType::bf16));
  CHECK(nax::testing::accumulated_tolerance(nax::DType::f32, 64) == nax::testing::tolerance_for(nax::DType::f32, 64));
}
