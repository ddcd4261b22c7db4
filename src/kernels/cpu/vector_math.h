#pragma once
// Building blocks that the compiler can vectorise without -ffast-math: an f32 exp and tanh, and
// row reductions kept in independent lanes (one running sum or max cannot be reordered; lanes can).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <utility>

#include "nax/core/dtype.h"

namespace nax::cpu {

// bf16 <-> f32 on the raw bits, a strided run at a time, written so that the compiler vectorises
// them: widening is exact; rounding is bf16(float)'s (nax/core/dtype.h's bf16_bits_of).
inline void widen_bf16(const std::uint16_t* in, std::int64_t stride, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(in[i * stride]) << 16);
}
inline void round_to_bf16(const float* in, std::uint16_t* out, std::int64_t stride, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i * stride] = bf16_bits_of(std::bit_cast<std::uint32_t>(in[i]));
}

// exp(x) in f32: x = n ln2 + r with |r| <= ln2/2, exp(r) by its Taylor series to degree 7
// (relative error about 1e-8, below f32's rounding), 2^n written into the exponent bits. Inputs
// are clamped to [-87, 88], where 2^n stays a normal number.
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  constexpr float kRoundingShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float shifted = x * 1.44269504f + kRoundingShift;
  const float n = shifted - kRoundingShift;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // ln2 in two parts, exact n * hi
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t exponent = std::bit_cast<std::int32_t>(shifted) - std::bit_cast<std::int32_t>(kRoundingShift);
  return p * std::bit_cast<float>((exponent + 127) << 23);
}

// exp and tanh: the vectorisable forms in f32, the library's in f64.
inline float exp_of(float x) { return fast_exp(x); }
inline double exp_of(double x) { return std::exp(x); }
inline float tanh_of(float x) {
  // tanh(x) = sign(x) (1 - 2 / (exp(2|x|) + 1)): no cancellation for large |x|, and for small
  // |x| the error stays near f32's rounding of the result.
  const float e = fast_exp(2.0f * std::abs(x));
  return std::copysign(1.0f - 2.0f / (e + 1.0f), x);
}
inline double tanh_of(double x) { return std::tanh(x); }

constexpr int kLanes = 16;

// Sums of first(i) and second(i) over i < n, where term(i) returns the pair.
template <typename T, typename Term>
std::pair<T, T> lane_sums(std::int64_t n, Term&& term) {
  T first[kLanes] = {}, second[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const auto [a, b] = term(i + l);
      first[l] += a;
      second[l] += b;
    }
  T a_total = 0, b_total = 0;
  for (; i < n; ++i) {
    const auto [a, b] = term(i);
    a_total += a;
    b_total += b;
  }
  for (int l = 0; l < kLanes; ++l) a_total += first[l], b_total += second[l];
  return {a_total, b_total};
}

template <typename T, typename Term>
T lane_sum(std::int64_t n, Term&& term) {
  return lane_sums<T>(n, [&term](std::int64_t i) { return std::pair<T, T>{term(i), T{0}}; }).first;
}

template <typename T>
T lane_max(const T* x, std::int64_t n) {
  T best[kLanes];
  std::fill(best, best + kLanes, -INFINITY);
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) best[l] = std::max(best[l], x[i + l]);
  T total = -INFINITY;
  for (; i < n; ++i) total = std::max(total, x[i]);
  for (int l = 0; l < kLanes; ++l) total = std::max(total, best[l]);
  return total;
}

}  // namespace nax::cpu
