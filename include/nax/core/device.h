#pragma once
// A device: where a tensor's memory lives and which runtime worker computes on it.
// The host (index -1) holds tensors made outside Runtime::run.
#include <memory>
#include <string>

#include "nax/core/allocator.h"

namespace nax {

namespace detail {
class DeviceContext;  // runtime side: the device's communicators
}

enum class Backend { cpu };

class Device {
 public:
  Device(int index, Backend backend, std::shared_ptr<Allocator> allocator);

  int index() const { return index_; }
  bool is_host() const { return index_ < 0; }
  Backend backend() const { return backend_; }
  Allocator& allocator() const { return *allocator_; }
  const std::shared_ptr<Allocator>& allocator_ptr() const { return allocator_; }
  std::string str() const;  // "cpu:3" or "host"

  static const std::shared_ptr<Device>& host();

 private:
  int index_;
  Backend backend_;
  std::shared_ptr<Allocator> allocator_;
};

}  // namespace nax
