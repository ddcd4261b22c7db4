#pragma once
// What a CUDA device's kernels own besides their code: the compute stream, a scratch buffer in
// device memory, and the staging that carries small host arrays (offsets) to the device without
// waiting for the stream. Everything is ordered on the one stream; none of it is thread-safe.
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace nax::cuda {

// A non-blocking stream on `device` (it does not wait for the legacy default stream).
class Stream {
 public:
  explicit Stream(int device);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

// Device scratch for kernels that need a temporary (partial sums, an f32 copy of a bf16 table).
// get() returns at least `bytes`, valid for work enqueued on the stream until the next get(): a
// larger request frees the old buffer in stream order (cudaFreeAsync), so kernels enqueued
// earlier still read it safely.
class Workspace {
 public:
  Workspace(int device, cudaStream_t stream);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get(std::size_t bytes);

 private:
  int device_;
  cudaStream_t stream_;
  void* buffer_ = nullptr;
  std::size_t capacity_ = 0;
};

// Host arrays to the device, asynchronously: upload() copies the caller's bytes into a pinned
// staging slot (the caller may free its array at once), enqueues the copy to a device buffer and
// returns that buffer, valid for work enqueued before the next upload(). Slots are reused round
// robin; reusing one waits for the copy that last read it (an event), long done in practice.
class Uploader {
 public:
  Uploader(int device, cudaStream_t stream, int slots = 32);
  ~Uploader();
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;
  const void* upload(const void* host, std::size_t bytes);

 private:
  struct Slot {
    void* host = nullptr;  // pinned
    std::size_t capacity = 0;
    cudaEvent_t copied = nullptr;  // recorded after the copy out of `host`
  };
  int device_;
  cudaStream_t stream_;
  std::vector<Slot> slots_;
  std::size_t next_ = 0;
  Workspace device_buffer_;
};

}  // namespace nax::cuda
