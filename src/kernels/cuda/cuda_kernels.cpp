// CudaKernels' methods that do more than hand the stream to the kernel of the same name (those are
// defined in cuda_kernels.h).
#include "kernels/cuda/cuda_kernels.h"

#include <limits>

#include "kernels/cuda/rotary.h"
#include "kernels/cuda/tree_gemm.h"
#include "nax/core/error.h"

namespace nax::cuda {

namespace {

int multiprocessor_count(int gpu) {
  int count = 0;
  NAX_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, gpu));
  return count;
}

}  // namespace

CudaKernels::CudaKernels(int gpu)
    : gpu_(gpu),
      multiprocessors_(multiprocessor_count(gpu)),
      stream_(gpu),
      gemm_(gpu),
      workspace_(gpu, stream_.get()),
      uploads_(gpu, stream_.get()) {}

CudaKernels::~CudaKernels() {
  // Kernels still queued may read the workspace and the staging buffers freed below.
  QuietDeviceGuard guard(gpu_);
  (void)cudaStreamSynchronize(stream_.get());
}

bool CudaKernels::computes(DType dtype) const {
  switch (dtype) {
    case DType::f32:
    case DType::f64:
    case DType::bf16:
    case DType::i32: return true;
  }
  return false;
}

void CudaKernels::bind_thread() { NAX_CUDA_CHECK(cudaSetDevice(gpu_)); }

void CudaKernels::gemm(DType dtype, const kernels::GemmShape& shape, const void* a, const void* b, void* c) {
  DeviceGuard guard(gpu_);
  if (shape.m <= 0 || shape.n <= 0 || shape.batch <= 0) return;
  if (shape.k <= 0) {  // an empty sum: C = beta C
    kernels::Layout<1> matrices;
    matrices.rank = 3;
    matrices.sizes[0] = shape.batch, matrices.sizes[1] = shape.m, matrices.sizes[2] = shape.n;
    matrices.strides[0][0] = shape.stride_c, matrices.strides[0][1] = shape.ldc, matrices.strides[0][2] = 1;
    cuda::scale(stream(), dtype, c, matrices, shape.beta);
    return;
  }
  if (shape.tree.on) return tree_gemm(stream(), dtype, shape, a, b, c);
  if (shape.batch > std::numeric_limits<int>::max()) fail("gemm", "a batch of {} matrices is too many for cuBLASLt", shape.batch);
  GemmArgs args;
  args.m = shape.m, args.n = shape.n, args.k = shape.k;
  args.trans_a = shape.trans_a, args.trans_b = shape.trans_b;
  args.input = args.output = dtype;
  args.lda = shape.lda, args.ldb = shape.ldb, args.ldc = shape.ldc;
  args.batch = static_cast<int>(shape.batch);
  args.stride_a = shape.stride_a, args.stride_b = shape.stride_b, args.stride_c = shape.stride_c;
  args.beta = shape.beta;
  gemm_lt(gemm_, stream(), args, a, b, c);
}

// --- transformer pieces ---

void CudaKernels::gelu_forward(DType dtype, std::int64_t n, const void* x, void* y) {
  if (n <= 0) return;
  DeviceGuard guard(gpu_);
  const auto count = static_cast<std::size_t>(n);
  switch (dtype) {
    case DType::f32: return cuda::gelu_forward(stream(), static_cast<const float*>(x), static_cast<float*>(y), count);
    case DType::f64: return cuda::gelu_forward(stream(), static_cast<const double*>(x), static_cast<double*>(y), count);
    case DType::bf16: return cuda::gelu_forward(stream(), static_cast<const bf16_t*>(x), static_cast<bf16_t*>(y), count);
    default: fail("gelu_forward", "computes in f32, f64 or bf16, got {}", dtype_name(dtype));
  }
}

void CudaKernels::gelu_backward(DType dtype, std::int64_t n, const void* x, const void* dy, void* dx) {
  if (n <= 0) return;
  DeviceGuard guard(gpu_);
  const auto count = static_cast<std::size_t>(n);
  switch (dtype) {
    case DType::f32:
      return cuda::gelu_backward(stream(), static_cast<const float*>(x), static_cast<const float*>(dy), static_cast<float*>(dx), count);
    case DType::f64:
      return cuda::gelu_backward(stream(), static_cast<const double*>(x), static_cast<const double*>(dy), static_cast<double*>(dx), count);
    case DType::bf16:
      return cuda::gelu_backward(stream(), static_cast<const bf16_t*>(x), static_cast<const bf16_t*>(dy), static_cast<bf16_t*>(dx), count);
    default: fail("gelu_backward", "computes in f32, f64 or bf16, got {}", dtype_name(dtype));
  }
}

void CudaKernels::rotary_in_place(const kernels::RotarySizes& sizes, void* data, const std::int64_t* outer_offsets,
                                  std::int64_t outer_count) {
  if (outer_count <= 0 || sizes.seq_len <= 0 || sizes.rotary_dims < 2) return;
  DeviceGuard guard(gpu_);
  const auto* offsets =
      static_cast<const std::int64_t*>(uploads_.upload(outer_offsets, static_cast<std::size_t>(outer_count) * sizeof(std::int64_t)));
  cuda::rotary_in_place(stream(), sizes, data, offsets, outer_count);
}

}  // namespace nax::cuda
