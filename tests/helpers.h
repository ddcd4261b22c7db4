#pragma once
// Test helpers: comparisons against serial references.
#include <catch2/catch.hpp>
#include <nax/nax.h>

#include <cmath>
#include <vector>

namespace nax::testing {

inline double max_rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    double scale = std::max(1.0, std::abs(want[i]));
    double err = std::abs(got[i] - want[i]) / scale;
    if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
  }
  return worst;
}

inline void require_close(const Tensor& got, const std::vector<double>& want, double tol = 1e-5) {
  REQUIRE(max_rel_error(got.to_vector<double>(), want) <= tol);
}

inline void require_equal(const Tensor& got, const Tensor& want) {
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.to_vector<double>() == want.to_vector<double>());
}

// The meshes the mesh tests run on: 1, 2, 3, 4 and 8 devices, 1-D and 2-D.
inline std::vector<std::string> test_meshes() {
  return {"mp=1", "mp=2", "mp=3", "mp=4", "mp=8", "dp=2,mp=2", "mp=2,dp=2", "dp=2,mp=4", "dp=4,mp=2", "dp=3,mp=2"};
}

}  // namespace nax::testing
