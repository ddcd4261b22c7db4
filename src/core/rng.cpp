#include "nax/core/rng.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>

namespace nax::rng {

namespace {
std::uint64_t fnv1a(std::string_view s, std::uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::uint64_t mix64(std::uint64_t z) {  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}
}  // namespace

Key make_key(std::uint64_t seed, std::string_view name) {
  std::uint64_t h = mix64(fnv1a(name, 0xcbf29ce484222325ull) ^ mix64(seed));
  return {static_cast<std::uint32_t>(h), static_cast<std::uint32_t>(h >> 32)};
}

void philox(Key key, std::uint64_t index, std::uint32_t out[4]) {
  std::uint32_t c0 = static_cast<std::uint32_t>(index), c1 = static_cast<std::uint32_t>(index >> 32), c2 = 0, c3 = 0;
  std::uint32_t k0 = key.k0, k1 = key.k1;
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, hi0, lo0);
    mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    std::uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

namespace {
constexpr int batch = 16;  // counters per vectorised Philox pass (one AVX-512 register of words)

// The first two Philox words of counters first .. first + batch - 1: the same rounds as philox(),
// on vectors of 64-bit lanes holding 32-bit words (GCC vector extensions: the 32x32->64-bit products
// become vector multiplies, which the auto-vectoriser does not find).
using Lanes = std::uint64_t __attribute__((vector_size(batch * sizeof(std::uint64_t))));

void philox_batch(Key key, std::uint64_t first, std::uint32_t w0[batch], std::uint32_t w1[batch]) {
  constexpr std::uint64_t low = 0xffffffffull;
  Lanes index;
  for (int j = 0; j < batch; ++j) index[j] = first + static_cast<std::uint64_t>(j);
  Lanes c0 = index & low, c1 = index >> 32, c2 = index ^ index, c3 = c2;
  std::uint64_t k0 = key.k0, k1 = key.k1;
  for (int round = 0; round < 10; ++round) {
    const Lanes p0 = c0 * 0xD2511F53ull, p1 = c2 * 0xCD9E8D57ull;
    c0 = (p1 >> 32) ^ c1 ^ k0, c1 = p1 & low, c2 = (p0 >> 32) ^ c3 ^ k1, c3 = p0 & low;
    k0 = (k0 + 0x9E3779B9u) & low;
    k1 = (k1 + 0xBB67AE85u) & low;
  }
  for (int j = 0; j < batch; ++j) w0[j] = static_cast<std::uint32_t>(c0[j]), w1[j] = static_cast<std::uint32_t>(c1[j]);
}

double uniform_of(std::uint32_t w0, std::uint32_t w1) {
  std::uint64_t bits = (static_cast<std::uint64_t>(w0) << 21) ^ w1;  // 53 random bits
  return static_cast<double>(bits & ((1ull << 53) - 1)) * 0x1.0p-53;
}

double normal_of(std::uint32_t w0, std::uint32_t w1) {
  double u1 = (static_cast<double>(w0) + 1.0) * 0x1.0p-32;  // (0, 1]
  double u2 = static_cast<double>(w1) * 0x1.0p-32;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

template <double (*Of)(std::uint32_t, std::uint32_t)>
void run(Key key, std::uint64_t first, std::int64_t n, double* out) {
  std::uint32_t w0[batch], w1[batch];
  for (std::int64_t i = 0; i < n; i += batch) {
    philox_batch(key, first + static_cast<std::uint64_t>(i), w0, w1);
    const std::int64_t m = std::min<std::int64_t>(batch, n - i);
    for (std::int64_t j = 0; j < m; ++j) out[i + j] = Of(w0[j], w1[j]);
  }
}
}  // namespace

void uniform_run(Key key, std::uint64_t first, std::int64_t n, double* out) { run<uniform_of>(key, first, n, out); }
void normal_run(Key key, std::uint64_t first, std::int64_t n, double* out) { run<normal_of>(key, first, n, out); }

namespace {
// Vectorisable approximations of the two transcendental steps of normal_of. Their relative error is
// a few units in the last place of a double (measured by test_core against normal()), far inside
// the margin that normal_run_f32 demands before trusting them.

// log(x) for x in (0, 1]: x = 2^e m with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh((m - 1) / (m + 1)).
[[gnu::always_inline]] inline double log_approx(double x) {
  std::uint64_t bits = std::bit_cast<std::uint64_t>(x);
  std::int64_t e = static_cast<std::int64_t>(bits >> 52) - 1023;
  double m = std::bit_cast<double>((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);  // [1, 2)
  const bool high = m > std::numbers::sqrt2;
  m = high ? 0.5 * m : m;
  e = high ? e + 1 : e;
  const double s = (m - 1.0) / (m + 1.0), s2 = s * s;
  double p = 1.0 / 21;
  p = p * s2 + 1.0 / 19, p = p * s2 + 1.0 / 17, p = p * s2 + 1.0 / 15, p = p * s2 + 1.0 / 13, p = p * s2 + 1.0 / 11;
  p = p * s2 + 1.0 / 9, p = p * s2 + 1.0 / 7, p = p * s2 + 1.0 / 5, p = p * s2 + 1.0 / 3;
  const double log_m = 2.0 * s + 2.0 * s * s2 * p;
  constexpr double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;  // fdlibm's split
  const double de = static_cast<double>(e);
  return de * ln2_hi + (log_m + de * ln2_lo);
}

// cos(p) for p in [0, 2 pi): p - k pi/2 reduced with fdlibm's three-part pi/2, then the sin or cos series.
[[gnu::always_inline]] inline double cos_approx(double p) {
  constexpr double two_over_pi = 6.36619772367581382433e-01, round = 0x1.8p52;
  constexpr double pio2_1 = 1.57079632673412561417e+00, pio2_2 = 6.07710050630396597660e-11,
                   pio2_3 = 2.02226624871116645580e-21;
  const double shifted = p * two_over_pi + round;
  const std::uint64_t k = std::bit_cast<std::uint64_t>(shifted) & 3;
  const double kd = shifted - round;
  const double r = ((p - kd * pio2_1) - kd * pio2_2) - kd * pio2_3, r2 = r * r;
  double c = 1.0 / 6402373705728000.0;  // 1/18!
  c = c * (-r2) + 1.0 / 20922789888000.0, c = c * (-r2) + 1.0 / 87178291200.0, c = c * (-r2) + 1.0 / 479001600.0;
  c = c * (-r2) + 1.0 / 3628800.0, c = c * (-r2) + 1.0 / 40320.0, c = c * (-r2) + 1.0 / 720.0, c = c * (-r2) + 1.0 / 24.0;
  c = c * (-r2) + 0.5;
  const double cos_r = 1.0 - r2 * c;
  double s = 1.0 / 355687428096000.0;  // 1/17!
  s = s * (-r2) + 1.0 / 1307674368000.0, s = s * (-r2) + 1.0 / 6227020800.0, s = s * (-r2) + 1.0 / 39916800.0;
  s = s * (-r2) + 1.0 / 362880.0, s = s * (-r2) + 1.0 / 5040.0, s = s * (-r2) + 1.0 / 120.0, s = s * (-r2) + 1.0 / 6.0;
  const double sin_r = r - r * r2 * s;
  const double v = (k & 1) ? sin_r : cos_r;
  return (k == 1 || k == 2) ? -v : v;
}

[[gnu::always_inline]] inline double normal_approx_of(std::uint32_t w0, std::uint32_t w1) {
  double u1 = (static_cast<double>(w0) + 1.0) * 0x1.0p-32;
  double u2 = static_cast<double>(w1) * 0x1.0p-32;
  return std::sqrt(-2.0 * log_approx(u1)) * cos_approx(2.0 * std::numbers::pi * u2);
}

// Whether double v rounds to the same float as every double within `margin` units in the last place
// of it: v is a normal float's size and not near a rounding midpoint (low 29 bits near 2^28).
[[gnu::always_inline]] inline bool rounds_safely_to_float(double v) {
  constexpr std::int64_t margin = 1 << 16;
  const double a = std::fabs(v);
  const std::int64_t low = static_cast<std::int64_t>(std::bit_cast<std::uint64_t>(v) & ((1ull << 29) - 1));
  const std::int64_t from_midpoint = low - (1 << 28);
  return a > 0x1.0p-120 && a < 0x1.0p120 && (from_midpoint > margin || from_midpoint < -margin);
}
}  // namespace

void normal_run_approx(Key key, std::uint64_t first, std::int64_t n, double* out) { run<normal_approx_of>(key, first, n, out); }

void normal_run_f32(Key key, std::uint64_t first, std::int64_t n, double scale, float* out) {
  std::uint32_t w0[batch], w1[batch];
  double v[batch];
  for (std::int64_t i = 0; i < n; i += batch) {
    philox_batch(key, first + static_cast<std::uint64_t>(i), w0, w1);
    for (int j = 0; j < batch; ++j) v[j] = scale * normal_approx_of(w0[j], w1[j]);
    int unsafe = 0;
    for (int j = 0; j < batch; ++j) unsafe += !rounds_safely_to_float(v[j]);
    const std::int64_t m = std::min<std::int64_t>(batch, n - i);
    for (std::int64_t j = 0; j < m; ++j) out[i + j] = static_cast<float>(v[j]);
    if (unsafe == 0) continue;
    for (std::int64_t j = 0; j < m; ++j)
      if (!rounds_safely_to_float(v[j])) out[i + j] = static_cast<float>(scale * normal_of(w0[j], w1[j]));
  }
}

double uniform(Key key, std::uint64_t index) {
  std::uint32_t w[4];
  philox(key, index, w);
  return uniform_of(w[0], w[1]);
}

double normal(Key key, std::uint64_t index) {
  std::uint32_t w[4];
  philox(key, index, w);
  return normal_of(w[0], w[1]);
}

}  // namespace nax::rng
