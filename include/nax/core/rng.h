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

// out[i] = uniform(key, first + i) or normal(key, first + i) for i < n, bit for bit, computed a
// batch of counters at a time so that the Philox rounds vectorise.
void uniform_run(Key key, std::uint64_t first, std::int64_t n, double* out);
void normal_run(Key key, std::uint64_t first, std::int64_t n, double* out);
// out[i] = float(scale * normal(key, first + i)), bit for bit, several times faster: the normals are
// computed with vectorised log/cos approximations whose error is far smaller than the distance to
// the nearest float rounding boundary for all but about 1 in 4000 elements, which take the exact path.
void normal_run_f32(Key key, std::uint64_t first, std::int64_t n, double scale, float* out);
// The approximate normals themselves (for tests measuring their error against normal()).
void normal_run_approx(Key key, std::uint64_t first, std::int64_t n, double* out);

}  // namespace nax::rng
