#pragma once
// A device: where a tensor's memory lives and which runtime worker computes on it.
// The host (index -1) holds tensors made outside Runtime::run. A device computes through its
// backend's kernels (nax/kernels/kernels.h), which the runtime hands it; only CPU devices' memory
// can be read by the host.
#include <memory>
#include <string>
#include <string_view>

#include "nax/core/allocator.h"

namespace nax {

namespace kernels {
class Kernels;  // the backend's raw compute: nax/kernels/kernels.h
}

enum class Backend { cpu, cuda };
std::string_view backend_name(Backend backend);
Backend parse_backend(std::string_view name);  // "cpu" or "cuda"; anything else is an error naming it

class Device {
 public:
  // `kernels`: the backend's compute for this device (kernels::cpu_kernels_ptr() for a CPU device).
  Device(int index, Backend backend, std::shared_ptr<Allocator> allocator, std::shared_ptr<kernels::Kernels> kernels);

  int index() const { return index_; }
  bool is_host() const { return index_ < 0; }
  Backend backend() const { return backend_; }
  Allocator& allocator() const { return *allocator_; }
  const std::shared_ptr<Allocator>& allocator_ptr() const { return allocator_; }
  kernels::Kernels& kernels() const { return *kernels_; }
  bool host_accessible() const;  // whether host code may read and write its memory directly
  std::string str() const;  // "cpu:3", "cuda:3" or "host"

  static const std::shared_ptr<Device>& host();
  // The device the calling thread computes on: a runtime worker's while it runs a shard's code,
  // the host elsewhere. New tensors live there unless told otherwise.
  static const std::shared_ptr<Device>& current();
  // Makes `device` (which must outlive it; null: the host) the calling thread's current device:
  // the runtime does, as its worker enters and leaves a shard.
  static void make_current(const std::shared_ptr<Device>* device);

 private:
  int index_;
  Backend backend_;
  std::shared_ptr<Allocator> allocator_;
  std::shared_ptr<kernels::Kernels> kernels_;
};

}  // namespace nax
