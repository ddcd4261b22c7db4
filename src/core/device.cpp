#include "nax/core/device.h"

#include <fmt/format.h>

#include "nax/core/error.h"

namespace nax {

std::string_view backend_name(Backend backend) { return backend == Backend::cuda ? "cuda" : "cpu"; }

Backend parse_backend(std::string_view name) {
  for (Backend b : {Backend::cpu, Backend::cuda})
    if (backend_name(b) == name) return b;
  fail("backend", "expects cpu or cuda, got '{}'", name);
}

Device::Device(int index, Backend backend, std::shared_ptr<Allocator> allocator, std::shared_ptr<kernels::Kernels> kernels)
    : index_(index), backend_(backend), allocator_(std::move(allocator)), kernels_(std::move(kernels)) {
  if (!allocator_ || !kernels_) fail("Device", "device {} needs an allocator and kernels", index);
}

std::string Device::str() const { return is_host() ? "host" : fmt::format("{}:{}", backend_name(backend_), index_); }

}  // namespace nax
