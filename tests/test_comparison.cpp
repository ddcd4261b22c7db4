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
