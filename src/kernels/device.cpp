// A device: its backend, allocator and kernels, the host device, and the device the calling
// thread computes on.
#include "nax/kernels/device.h"

#include <fmt/format.h>

#include "nax/core/error.h"
#include "nax/kernels/kernels.h"

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

bool Device::host_accessible() const { return kernels_->host_accessible(); }

const std::shared_ptr<Device>& Device::host() {
  static const std::shared_ptr<Device> host =
      std::make_shared<Device>(-1, Backend::cpu, make_caching_host_allocator(), kernels::cpu_kernels_ptr());
  return host;
}

namespace {
thread_local const std::shared_ptr<Device>* t_current = nullptr;
}  // namespace

const std::shared_ptr<Device>& Device::current() { return t_current != nullptr ? *t_current : host(); }

void Device::make_current(const std::shared_ptr<Device>* device) { t_current = device; }

}  // namespace nax
