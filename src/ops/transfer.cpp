// Values between devices: copies to and from the host, and the hashes that compare a value across
// devices with one small collective.
#include "ops/transfer.h"

#include <cstring>

#include "nax/kernels/kernels.h"
#include "ops/op_entry.h"

namespace nax::detail {

Tensor transfer(const Tensor& x, const std::shared_ptr<Device>& device) {
  if (x.device_ptr() == device) return x;
  if (!x.device().host_accessible()) return transfer(trace::made(x.on_host()), device);
  Tensor out = make_result(x.shape(), x.dtype(), x.vary(), device);
  device->kernels().copy_from_host(out.raw_mutable(), x.raw(), x.nbytes());
  return out;
}

namespace {
std::uint64_t mix(std::uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}
}  // namespace

std::uint64_t content_hash64(const Tensor& x) {
  const Tensor readable = x.on_host();
  const auto* bytes = static_cast<const unsigned char*>(readable.raw());
  const std::size_t n = readable.nbytes();
  constexpr std::uint64_t kMul = 0x9E3779B97F4A7C15ull;
  std::uint64_t lane[4] = {n, n ^ 1, n ^ 2, n ^ 3};
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) {
      std::uint64_t w;
      std::memcpy(&w, bytes + i + 8 * k, 8);
      lane[k] = (lane[k] ^ w) * kMul;
      lane[k] ^= lane[k] >> 29;
    }
  std::uint64_t h = mix(lane[0]) ^ mix(lane[1] + 1) * 3 ^ mix(lane[2] + 2) * 5 ^ mix(lane[3] + 3) * 7;
  for (; i < n; ++i) h = (h ^ bytes[i]) * kMul;
  return mix(h);
}

double content_hash48(const Tensor& x) { return static_cast<double>(content_hash64(x) >> 16); }

}  // namespace nax::detail
