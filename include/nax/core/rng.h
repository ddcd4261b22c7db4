#pragma once
// Counter-based random numbers (Philox-4x32-10): element i of a random tensor is a pure function of
// (seed, name, i), where i is the element's global row-major index. Any device's block of a global
// random tensor is therefore the same whatever the mesh.
#include <cstdint>
#include <string_view>

namespace nax::rng {

struct Key {
  std::uint32_t k0 = 0, k1 = 0;
};

Key make_key(std::uint64_t seed, std::string_view name);
// Four independent 32-bit words for counter `index` under `key`.
void philox(Key key, std::uint64_t index, std::uint32_t out[4]);
double uniform(Key key, std::uint64_t index);  // in [0, 1)
double normal(Key key, std::uint64_t index);   // standard normal (Box-Muller)

}  // namespace nax::rng
