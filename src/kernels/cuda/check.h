#pragma once
// Error checks for the CUDA backend: a failed CUDA runtime, cuBLAS(Lt) or NCCL call becomes a
// nax::Error naming the call, where it was made and the library's own message. Free of fmt and
// of the cuBLAS and NCCL headers, so that .cu files can include it.
#include <cuda_runtime.h>

namespace nax::cuda {

[[noreturn]] void throw_cuda_error(const char* call, const char* file, int line, cudaError_t status);
[[noreturn]] void throw_cublas_error(const char* call, const char* file, int line, int status);
[[noreturn]] void throw_nccl_error(const char* call, const char* file, int line, int status);

// CUDA devices visible to this process; 0 (never an error) where there is no driver or no GPU.
int cuda_device_count();

// Makes `device` current for its lifetime, then restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// The same for destructors: never throws; where the device cannot be switched it is left as is.
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int device) noexcept;
  ~QuietDeviceGuard();
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

}  // namespace nax::cuda

#define NAX_CUDA_CHECK(call)                                                                          \
  do {                                                                                                \
    const cudaError_t nax_cuda_status_ = (call);                                                      \
    if (nax_cuda_status_ != cudaSuccess) ::nax::cuda::throw_cuda_error(#call, __FILE__, __LINE__, nax_cuda_status_); \
  } while (0)

// After a kernel launch: a bad configuration shows up here, not at the launch.
#define NAX_CUDA_CHECK_LAUNCH() NAX_CUDA_CHECK(cudaGetLastError())

#define NAX_CUBLAS_CHECK(call)                                                                             \
  do {                                                                                                     \
    const int nax_cublas_status_ = static_cast<int>(call);                                                 \
    if (nax_cublas_status_ != 0) ::nax::cuda::throw_cublas_error(#call, __FILE__, __LINE__, nax_cublas_status_); \
  } while (0)

#define NAX_NCCL_CHECK(call)                                                                           \
  do {                                                                                                 \
    const int nax_nccl_status_ = static_cast<int>(call);                                               \
    if (nax_nccl_status_ != 0) ::nax::cuda::throw_nccl_error(#call, __FILE__, __LINE__, nax_nccl_status_); \
  } while (0)
