#pragma once
// Shared by the CUDA benchmarks: device buffers, random bf16 data (never zeros: they can run
// faster than real data), timing with CUDA events and the device's peak.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kernels/cuda/check.h"
#include "nax/core/dtype.h"

namespace bench {

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) { NAX_CUDA_CHECK(cudaMalloc(&ptr_, std::max<std::size_t>(bytes, 16))); }
  ~DeviceBuffer() { (void)cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

// n bf16 values uniform in [-1, 1) from a 64-bit LCG seeded with `seed`, into device memory.
inline void fill_random_bf16(void* device, std::size_t n, std::uint64_t seed) {
  std::vector<nax::bf16> host(n);
  std::uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (auto& x : host) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = nax::bf16(static_cast<float>(static_cast<double>(s >> 11) * (2.0 / 9007199254740992.0) - 1.0));
  }
  NAX_CUDA_CHECK(cudaMemcpy(device, host.data(), n * sizeof(nax::bf16), cudaMemcpyHostToDevice));
}

// Milliseconds of the work `fn` enqueues on a stream, between two events.
class EventTimer {
 public:
  EventTimer() {
    NAX_CUDA_CHECK(cudaEventCreate(&start_));
    NAX_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  template <typename F>
  double ms(cudaStream_t stream, F&& fn) {
    NAX_CUDA_CHECK(cudaEventRecord(start_, stream));
    fn();
    NAX_CUDA_CHECK(cudaEventRecord(stop_, stream));
    NAX_CUDA_CHECK(cudaEventSynchronize(stop_));
    float elapsed = 0;
    NAX_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start_, stop_));
    return elapsed;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// The device's dense bf16 tensor-core peak in TFLOP/s: SMs x boost clock x dense bf16 FLOPs per
// SM per clock of its architecture (sm_80: 2048, sm_90: 4096, as NVIDIA's A100 and H100/H200
// datasheets give: 312 and 989 TFLOP/s), or 0 where the architecture's figure is not listed here.
inline double dense_bf16_peak_tflops(int device = 0) {
  cudaDeviceProp prop{};
  NAX_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  int clock_khz = 0;
  NAX_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  double per_sm_per_clock = 0;
  if (prop.major == 8 && prop.minor == 0) per_sm_per_clock = 2048;
  if (prop.major == 9 && prop.minor == 0) per_sm_per_clock = 4096;
  return per_sm_per_clock * prop.multiProcessorCount * clock_khz * 1e3 / 1e12;
}

// "42.0%" of the peak, or "?" when the peak is not known.
inline std::string fraction_of_peak(double tflops, double peak_tflops) {
  if (peak_tflops <= 0) return "?";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", 100.0 * tflops / peak_tflops);
  return text;
}

// The median of `reps` event-timed runs of fn after `warmup` untimed ones.
template <typename F>
double median_ms(cudaStream_t stream, int warmup, int reps, F&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  NAX_CUDA_CHECK(cudaStreamSynchronize(stream));
  EventTimer timer;
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) times.push_back(timer.ms(stream, fn));
  return median(std::move(times));
}

}  // namespace bench
