#pragma once
// Values between devices (transfer.cpp).
#include <cstdint>
#include <memory>

#include "nax/kernels/device.h"
#include "nax/tensor/tensor.h"

namespace nax::detail {

// x's values on `device` (x itself when already there): host <-> device or via the host.
Tensor transfer(const Tensor& x, const std::shared_ptr<Device>& device);

// A hash of x's bytes (read on the host; four independent multiply-xorshift lanes over 8-byte
// words, so that it runs near memory speed): equal bytes give equal hashes, on any device.
std::uint64_t content_hash64(const Tensor& x);
// content_hash64 cut to 48 bits so that it is exact in an f64: for comparing a value across the
// devices of a group with one small collective.
double content_hash48(const Tensor& x);

}  // namespace nax::detail
