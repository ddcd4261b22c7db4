#pragma once
// The one way tests compare computed numbers with a reference: element by element, each element's
// error |got - want| / max(1, |want|) (absolute near zero, relative elsewhere), and a NaN or an
// infinity on either side that the other side does not match exactly counts as an infinite error,
// so that no comparison passes on a NaN (std::max(worst, NaN) would have dropped it).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <string>
#include <vector>

#include "nax/core/dtype.h"

namespace nax::testing {

// One element's error; infinite where either side is NaN, or infinite without the other matching.
inline double element_error(double got, double want) {
  if (std::isnan(got) || std::isnan(want)) return std::numeric_limits<double>::infinity();
  if (std::isinf(got) || std::isinf(want)) return got == want ? 0.0 : std::numeric_limits<double>::infinity();
  return std::abs(got - want) / std::max(1.0, std::abs(want));
}

struct Mismatch {
  double error = 0;      // the worst element's error (infinite for a NaN or a size mismatch)
  std::size_t index = 0;  // where it is
  double got = 0, want = 0;
};

// The worst element of got against want (sizes must match: else an infinite error).
template <typename G, typename W>
Mismatch worst_element(const std::vector<G>& got, const std::vector<W>& want) {
  Mismatch worst;
  if (got.size() != want.size()) {
    worst.error = std::numeric_limits<double>::infinity();
    return worst;
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double e = element_error(g, w);
    if (e > worst.error || (i == 0 && e == worst.error)) worst = {e, i, g, w};
  }
  return worst;
}

// The worst element's error (0 for empty vectors).
template <typename G, typename W>
double max_rel_error(const std::vector<G>& got, const std::vector<W>& want) {
  return worst_element(got, want).error;
}

inline double max_rel_error(const std::vector<double>& got, const std::vector<double>& want) {  // braced lists too
  return worst_element(got, want).error;
}

// Requires every element of got within tol of want, and says which element is worst when not.
template <typename G, typename W>
void require_close(const std::vector<G>& got, const std::vector<W>& want, double tol) {
  const Mismatch worst = worst_element(got, want);
  INFO("sizes " << got.size() << " and " << want.size() << "; worst element " << worst.index << ": got " << worst.got
                << ", want " << worst.want << ", error " << worst.error << " (tolerance " << tol << ")");
  REQUIRE(worst.error <= tol);
}

// The tolerance for a result computed in `dtype` from sums of `reduction_length` terms: a few
// units in the last place of the dtype, growing with the square root of the length (rounding
// errors of a long sum add up like a random walk), at least the dtype's own rounding.
inline double tolerance_for(DType dtype, std::int64_t reduction_length = 1) {
  double eps = 0;
  switch (dtype) {
    case DType::f64: eps = std::numeric_limits<double>::epsilon(); break;
    case DType::f32: eps = std::numeric_limits<float>::epsilon(); break;
    case DType::bf16: eps = 1.0 / 128; break;  // 8 significant bits: 2^-7
    default: eps = 0; break;  // integers: exact
  }
  return 8 * eps * std::sqrt(static_cast<double>(std::max<std::int64_t>(1, reduction_length)));
}

inline void require_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {  // braced lists too
  require_close<double, double>(got, want, tol);
}

// As require_close, for results that hold NaN by design (ops over NaN inputs): a NaN where want has
// a NaN counts as no error; a NaN on one side only is still an infinite error.
template <typename G, typename W>
void require_close_nan_matching(const std::vector<G>& got, const std::vector<W>& want, double tol) {
  std::vector<double> g(got.begin(), got.end()), w(want.begin(), want.end());
  if (g.size() == w.size())
    for (std::size_t i = 0; i < g.size(); ++i)
      if (std::isnan(g[i]) && std::isnan(w[i])) g[i] = w[i] = 0;
  require_close(g, w, tol);
}

// For results of long sums (GEMM, attention) whose elements may lie near zero: each element's
// error relative to the larger of |want| and the reference's root mean square, so an element that
// cancels to near zero is not held to a bound its rounding cannot meet, while a wrong element (a
// bad tile, a NaN, an unwritten output) still fails. Only the positions in `where` when given.
template <typename G>
Mismatch worst_element_scaled(const std::vector<G>& got, const std::vector<double>& want, const std::vector<std::int64_t>* where = nullptr) {
  Mismatch worst;
  if (got.size() != want.size()) {
    worst.error = std::numeric_limits<double>::infinity();
    return worst;
  }
  const std::size_t count = where != nullptr ? where->size() : want.size();
  auto position = [&](std::size_t n) { return where != nullptr ? static_cast<std::size_t>((*where)[n]) : n; };
  double squares = 0;
  for (std::size_t n = 0; n < count; ++n) squares += want[position(n)] * want[position(n)];
  const double rms = count == 0 ? 0.0 : std::sqrt(squares / static_cast<double>(count));
  for (std::size_t n = 0; n < count; ++n) {
    const std::size_t i = position(n);
    const double g = static_cast<double>(got[i]), w = want[i];
    double e = element_error(g, w);
    if (std::isfinite(e)) e = std::abs(g - w) / std::max({std::abs(w), rms, std::numeric_limits<double>::min()});
    if (e > worst.error || (n == 0 && e == worst.error)) worst = {e, i, g, w};
  }
  return worst;
}

// The tolerance for a kernel that accumulates `reduction_length` terms in f32 (f64 for f64) and
// rounds its result to `dtype` once: the accumulation's bound plus the final rounding's.
inline double accumulated_tolerance(DType dtype, std::int64_t reduction_length) {
  if (dtype == DType::f64) return tolerance_for(DType::f64, reduction_length);
  return tolerance_for(DType::f32, reduction_length) + (dtype == DType::f32 ? 0.0 : tolerance_for(dtype));
}

// CHECKs (not REQUIREs: a kernel test goes on to its other outputs) that `worst` is within tol,
// saying which element it is when not.
inline void check_within(const Mismatch& worst, std::size_t size, double tol, const std::string& what) {
  INFO(what << ": worst element " << worst.index << " of " << size << ": got " << worst.got << ", want " << worst.want
            << ", error " << worst.error << " (tolerance " << tol << ")");
  CHECK(worst.error <= tol);
}

// Every element within tol (element_error: relative above 1, absolute near zero), as a CHECK.
template <typename G>
void check_close(const std::vector<G>& got, const std::vector<double>& want, double tol, const std::string& what) {
  check_within(worst_element(got, want), want.size(), tol, what);
}

// Every element within tol of the reference's scale (worst_element_scaled), as a CHECK.
template <typename G>
void check_close_scaled(const std::vector<G>& got, const std::vector<double>& want, double tol, const std::string& what,
                        const std::vector<std::int64_t>* where = nullptr) {
  check_within(worst_element_scaled(got, want, where), want.size(), tol, what);
}

// Bit-for-bit equality, element by element (deterministic mode's promise): NaN payloads and signed
// zeros compared as bits, naming the first element that differs.
template <typename T>
void require_same_bits(const T* got, const T* want, std::size_t n, const std::string& what) {
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      INFO(what << ": element " << i << " of " << n << " differs: got " << std::setprecision(17) << static_cast<double>(got[i])
                << ", want " << static_cast<double>(want[i]));
      REQUIRE(false);
    }
  }
  SUCCEED();
}

template <typename T>
void require_same_bits(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  require_same_bits(got.data(), want.data(), got.size(), what);
}

// p blocks added in a psum's halving order, (b0 + b1) + (b2 + b3): the reference that a sum cut into
// blocks and finished by a deterministic psum must equal. A level with an odd count carries its
// last block up as it is (p = 6: ((b0 + b1) + (b2 + b3)) + (b4 + b5)).
template <typename T>
std::vector<T> add_pairwise(std::vector<std::vector<T>> blocks) {
  while (blocks.size() > 1) {
    std::vector<std::vector<T>> next;
    for (std::size_t b = 0; b < blocks.size(); b += 2) {
      if (b + 1 == blocks.size()) {
        next.push_back(std::move(blocks[b]));
        continue;
      }
      std::vector<T> sum(blocks[b].size());
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = blocks[b][i] + blocks[b + 1][i];
      next.push_back(std::move(sum));
    }
    blocks = std::move(next);
  }
  return blocks.front();
}

}  // namespace nax::testing
