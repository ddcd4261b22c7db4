#include "nax/core/device.h"

#include <fmt/format.h>

namespace nax {

Device::Device(int index, Backend backend, std::shared_ptr<Allocator> allocator)
    : index_(index), backend_(backend), allocator_(std::move(allocator)) {}

std::string Device::str() const { return is_host() ? "host" : fmt::format("cpu:{}", index_); }

const std::shared_ptr<Device>& Device::host() {
  static const std::shared_ptr<Device> host =
      std::make_shared<Device>(-1, Backend::cpu, make_caching_host_allocator());
  return host;
}

}  // namespace nax
