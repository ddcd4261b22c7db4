#include "kernels/cuda/cuda_allocator.h"

#include <atomic>

#include "kernels/cuda/check.h"
#include "nax/core/error.h"

namespace nax::cuda {

namespace {

constexpr std::size_t kMinimumBlock = 256;  // cudaMalloc's alignment
std::atomic<void (*)(int)> before_free{nullptr};

class CachingDeviceAllocator final : public CachingAllocator {
 public:
  explicit CachingDeviceAllocator(int device) : CachingAllocator(kMinimumBlock), device_(device) {}
  ~CachingDeviceAllocator() override {
    try {
      empty_cache();
    } catch (...) {  // a destructor must not throw; the driver may already be shutting down
    }
  }

 private:
  void* raw_allocate(std::size_t bytes) override {
    DeviceGuard guard(device_);
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, bytes) == cudaSuccess) return ptr;
    (void)cudaGetLastError();  // clear the error: the caller retries after emptying the cache
    return nullptr;
  }

  void raw_free(void* ptr) override {
    if (auto hook = before_free.load()) hook(device_);
    DeviceGuard guard(device_);
    NAX_CUDA_CHECK(cudaFree(ptr));
  }

  [[noreturn]] void out_of_memory(std::size_t bytes, const AllocatorStats& stats) override {
    fail("CachingDeviceAllocator", "cudaMalloc of {} bytes on device {} failed: out of memory ({} bytes in use, {} reserved)", bytes,
         device_, stats.bytes_in_use, stats.bytes_reserved);
  }

  int device_;
};

}  // namespace

void set_before_device_free(void (*hook)(int gpu)) { before_free.store(hook); }

std::size_t device_size_class(std::size_t bytes) { return caching_size_class(bytes, kMinimumBlock); }

std::shared_ptr<Allocator> make_caching_device_allocator(int device) {
  if (device < 0 || device >= cuda_device_count())
    fail("make_caching_device_allocator", "device {} is out of range: {} CUDA devices", device, cuda_device_count());
  return std::make_shared<CachingDeviceAllocator>(device);
}

}  // namespace nax::cuda
