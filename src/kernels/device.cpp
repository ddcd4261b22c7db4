// The members of core's Device that need the kernel interface: core holds a device's kernels
// without knowing them, so that core includes nothing above it.
#include "nax/core/device.h"
#include "nax/kernels/kernels.h"

namespace nax {

bool Device::host_accessible() const { return kernels_->host_accessible(); }

const std::shared_ptr<Device>& Device::host() {
  static const std::shared_ptr<Device> host =
      std::make_shared<Device>(-1, Backend::cpu, make_caching_host_allocator(), kernels::cpu_kernels_ptr());
  return host;
}

}  // namespace nax
