#include "nax/core/rng.h"

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

double uniform(Key key, std::uint64_t index) {
  std::uint32_t w[4];
  philox(key, index, w);
  std::uint64_t bits = (static_cast<std::uint64_t>(w[0]) << 21) ^ w[1];  // 53 random bits
  return static_cast<double>(bits & ((1ull << 53) - 1)) * 0x1.0p-53;
}

double normal(Key key, std::uint64_t index) {
  std::uint32_t w[4];
  philox(key, index, w);
  double u1 = (static_cast<double>(w[0]) + 1.0) * 0x1.0p-32;  // (0, 1]
  double u2 = static_cast<double>(w[1]) * 0x1.0p-32;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace nax::rng
