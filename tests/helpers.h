#pragma once
// Test helpers: comparisons against serial references.
#include <catch2/catch.hpp>
#include <nax/nax.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "comparison.h"

namespace nax::testing {

// got's elements against want, element-wise and NaN-safe (comparison.h).
inline void require_close(const Tensor& got, const std::vector<double>& want, double tol = 1e-5) {
  require_close(got.to_vector<double>(), want, tol);
}

inline void require_equal(const Tensor& got, const Tensor& want) {
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.to_vector<double>() == want.to_vector<double>());
}

// The mesh-axis groups to test on a mesh: each axis alone, all axes, all axes reversed (the
// group's ranks in the other order).
inline std::vector<std::vector<std::string>> groups_of(const Mesh& mesh) {
  std::vector<std::vector<std::string>> out;
  for (const auto& a : mesh.axis_names()) out.push_back({a});
  if (mesh.axes().size() > 1) {
    out.push_back(mesh.axis_names());
    auto reversed = mesh.axis_names();
    std::reverse(reversed.begin(), reversed.end());
    out.push_back(reversed);
  }
  return out;
}

// The meshes the mesh tests run on: 1, 2, 3, 4 and 8 devices, 1-D and 2-D.
inline std::vector<std::string> test_meshes() {
  return {"mp=1", "mp=2", "mp=3", "mp=4", "mp=8", "dp=2,mp=2", "mp=2,dp=2", "dp=2,mp=4", "dp=4,mp=2", "dp=3,mp=2"};
}

}  // namespace nax::testing

namespace nax::testing {

// Element of `t` at a named index (axes of t missing from `index` are an error).
inline double at(const Tensor& t, const std::vector<double>& values, const std::map<std::string, std::int64_t>& index) {
  auto strides = t.shape().strides();
  std::int64_t offset = 0;
  for (int i = 0; i < t.rank(); ++i) offset += index.at(t.shape()[i].name) * strides[static_cast<std::size_t>(i)];
  return values[static_cast<std::size_t>(offset)];
}

// Calls fn(index) for every named index of `shape`, row-major.
template <typename F>
void for_each_index(const Shape& shape, F&& fn) {
  std::map<std::string, std::int64_t> index;
  for (const auto& a : shape.axes()) index[a.name] = 0;
  if (shape.numel() == 0) return;
  while (true) {
    fn(index);
    int d = shape.rank() - 1;
    for (; d >= 0; --d) {
      auto& i = index[shape[d].name];
      if (++i < shape[d].size) break;
      i = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace nax::testing

// An assertion for code running on runtime worker threads, where Catch2's macros are not safe:
// it throws, Runtime::run rethrows on the test's thread, and Catch reports the message.
#define NAX_EXPECT(cond)                                                                                  \
  do {                                                                                                    \
    if (!(cond)) throw std::runtime_error(std::string("expectation failed: ") + #cond + " at " + __FILE__ + \
                                          ":" + std::to_string(__LINE__));                                \
  } while (0)

namespace nax::testing {
inline bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector<double>() == b.to_vector<double>();
}
}  // namespace nax::testing
