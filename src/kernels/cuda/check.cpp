#include "kernels/cuda/check.h"

#include <cublas_api.h>
#include <nccl.h>

#include "nax/core/error.h"

namespace nax::cuda {

void throw_cuda_error(const char* call, const char* file, int line, cudaError_t status) {
  fail("cuda", "{} failed at {}:{}: {} ({})", call, file, line, cudaGetErrorString(status), cudaGetErrorName(status));
}

void throw_cublas_error(const char* call, const char* file, int line, int status) {
  fail("cublas", "{} failed at {}:{}: {}", call, file, line, cublasGetStatusString(static_cast<cublasStatus_t>(status)));
}

void throw_nccl_error(const char* call, const char* file, int line, int status) {
  fail("nccl", "{} failed at {}:{}: {}", call, file, line, ncclGetErrorString(static_cast<ncclResult_t>(status)));
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it, so that it does not surface at a later check
    return 0;
  }
  return count;
}

DeviceGuard::DeviceGuard(int device) {
  NAX_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) {
    NAX_CUDA_CHECK(cudaSetDevice(device));
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) (void)cudaSetDevice(previous_);
}

QuietDeviceGuard::QuietDeviceGuard(int device) noexcept {
  if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) changed_ = cudaSetDevice(device) == cudaSuccess;
}

QuietDeviceGuard::~QuietDeviceGuard() {
  if (changed_) (void)cudaSetDevice(previous_);
}

}  // namespace nax::cuda
