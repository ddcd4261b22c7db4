#include "nax/core/device.h"

#include <fmt/format.h>

#include "kernels/kernels.h"
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
  if (!kernels_) kernels_ = kernels::cpu_kernels_ptr();
}

bool Device::host_accessible() const { return kernels_->host_accessible(); }

std::string Device::str() const { return is_host() ? "host" : fmt::format("{}:{}", backend_name(backend_), index_); }

const std::shared_ptr<Device>& Device::host() {
  static const std::shared_ptr<Device> host =
      std::make_shared<Device>(-1, Backend::cpu, make_caching_host_allocator());
  return host;
}

}  // namespace nax
