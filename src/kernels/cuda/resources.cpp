#include "kernels/cuda/resources.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/check.h"

namespace nax::cuda {

Stream::Stream(int device) : device_(device) {
  DeviceGuard guard(device_);
  NAX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

Stream::~Stream() {
  QuietDeviceGuard guard(device_);
  (void)cudaStreamDestroy(stream_);
}

Workspace::Workspace(int device, cudaStream_t stream) : device_(device), stream_(stream) {}

Workspace::~Workspace() {
  if (buffer_ == nullptr) return;
  QuietDeviceGuard guard(device_);
  (void)cudaFreeAsync(buffer_, stream_);
}

void* Workspace::get(std::size_t bytes) {
  if (bytes <= capacity_) return buffer_;
  DeviceGuard guard(device_);
  const std::size_t grown = std::max(bytes, 2 * capacity_);
  if (buffer_ != nullptr) {
    NAX_CUDA_CHECK(cudaFreeAsync(buffer_, stream_));
    buffer_ = nullptr;
    capacity_ = 0;
  }
  NAX_CUDA_CHECK(cudaMallocAsync(&buffer_, grown, stream_));
  capacity_ = grown;
  return buffer_;
}

Uploader::Uploader(int device, cudaStream_t stream, int slots)
    : device_(device), stream_(stream), slots_(static_cast<std::size_t>(slots)), device_buffer_(device, stream) {
  DeviceGuard guard(device_);
  for (auto& slot : slots_) NAX_CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
}

Uploader::~Uploader() {
  QuietDeviceGuard guard(device_);
  for (auto& slot : slots_) {
    if (slot.copied != nullptr) {
      (void)cudaEventSynchronize(slot.copied);
      (void)cudaEventDestroy(slot.copied);
    }
    if (slot.host != nullptr) (void)cudaFreeHost(slot.host);
  }
}

const void* Uploader::upload(const void* host, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  DeviceGuard guard(device_);
  Slot& slot = slots_[next_++ % slots_.size()];
  NAX_CUDA_CHECK(cudaEventSynchronize(slot.copied));  // an event never recorded is complete
  if (slot.capacity < bytes) {
    if (slot.host != nullptr) NAX_CUDA_CHECK(cudaFreeHost(slot.host));
    slot.host = nullptr;
    slot.capacity = 0;
    const std::size_t grown = std::max<std::size_t>(bytes, 4096);
    NAX_CUDA_CHECK(cudaMallocHost(&slot.host, grown));
    slot.capacity = grown;
  }
  std::memcpy(slot.host, host, bytes);
  void* device = device_buffer_.get(bytes);
  NAX_CUDA_CHECK(cudaMemcpyAsync(device, slot.host, bytes, cudaMemcpyHostToDevice, stream_));
  NAX_CUDA_CHECK(cudaEventRecord(slot.copied, stream_));
  return device;
}

}  // namespace nax::cuda
