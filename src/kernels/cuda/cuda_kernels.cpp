// CudaKernels: each method selects the GPU, then hands its stream (and, where a kernel needs them,
// the workspace, the uploader or the multiprocessor count) to the kernel of the same name.
#include "kernels/cuda/cuda_kernels.h"

#include <limits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/binary.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/layout.h"
#include "kernels/cuda/lookup.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/reduce.h"
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

// --- memory ---

void CudaKernels::copy_from_host(void* dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  DeviceGuard guard(gpu_);
  NAX_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream()));
}

void CudaKernels::copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  DeviceGuard guard(gpu_);
  NAX_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
  NAX_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void CudaKernels::copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  DeviceGuard guard(gpu_);
  // Default: under the device transport the source may sit on another GPU of the process.
  NAX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream()));
}

void CudaKernels::synchronize() {
  DeviceGuard guard(gpu_);
  NAX_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

// --- elementwise and layout ---

void CudaKernels::binary(kernels::BinaryOp op, DType dtype, const void* a, const void* b, void* out, const kernels::Layout<3>& layout) {
  DeviceGuard guard(gpu_);
  cuda::binary(stream(), op, dtype, a, b, out, layout);
}

void CudaKernels::unary(kernels::UnaryOp op, DType dtype, const void* in, void* out, std::int64_t n) {
  DeviceGuard guard(gpu_);
  cuda::unary(stream(), op, dtype, in, out, n);
}

void CudaKernels::fill(DType dtype, void* out, std::int64_t n, double value) {
  DeviceGuard guard(gpu_);
  cuda::fill(stream(), dtype, out, n, value);
}

void CudaKernels::copy(std::size_t element_size, const void* src, void* dst, const kernels::Layout<2>& layout) {
  DeviceGuard guard(gpu_);
  cuda::copy(stream(), element_size, src, dst, layout);
}

void CudaKernels::convert(DType from, const void* src, DType to, void* dst, std::int64_t n) {
  DeviceGuard guard(gpu_);
  cuda::convert(stream(), from, src, to, dst, n);
}

void CudaKernels::where(DType dtype, const void* cond, const void* a, const void* b, void* out, const kernels::Layout<4>& layout) {
  DeviceGuard guard(gpu_);
  cuda::where(stream(), dtype, cond, a, b, out, layout);
}

void CudaKernels::reduce(ReduceOp op, DType dtype, const void* in, void* out, std::int64_t out_count, const kernels::Layout<2>& layout,
                         const SumTree& tree) {
  DeviceGuard guard(gpu_);
  cuda::reduce(stream(), workspace_, multiprocessors_, op, dtype, in, out, out_count, layout, tree);
}

void CudaKernels::accumulate(ReduceOp op, DType dtype, void* dst, const void* src, std::size_t n) {
  DeviceGuard guard(gpu_);
  cuda::accumulate(stream(), op, dtype, dst, src, n);
}

// --- contraction ---

void CudaKernels::bind_thread() { NAX_CUDA_CHECK(cudaSetDevice(gpu_)); }

void CudaKernels::adamw(std::int64_t n, const float* p, const float* m, const float* v, const float* g, float* p_out, float* m_out,
                        float* v_out, const kernels::AdamWStep& step) {
  DeviceGuard guard(gpu_);
  cuda::adamw_step(stream(), static_cast<std::size_t>(n), p, m, v, g, p_out, m_out, v_out, step);
}

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

void CudaKernels::layer_norm_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale, const void* bias,
                                     double eps, void* y, void* mean, void* rstd) {
  DeviceGuard guard(gpu_);
  cuda::layer_norm_forward(stream(), dtype, rows, n, x, scale, bias, eps, y, mean, rstd);
}

void CudaKernels::layer_norm_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale, const void* mean,
                                      const void* rstd, const void* dy, void* dx, void* dscale, void* dbias, const SumTree& rows_tree) {
  DeviceGuard guard(gpu_);
  cuda::layer_norm_backward(stream(), workspace_, multiprocessors_, dtype, rows, n, x, scale, mean, rstd, dy, dx, dscale, dbias,
                            rows_tree);
}

void CudaKernels::softmax_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, void* y, bool log) {
  DeviceGuard guard(gpu_);
  cuda::softmax_forward(stream(), dtype, rows, n, x, y, log);
}

void CudaKernels::softmax_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* y, const void* dy, void* dx, bool log) {
  DeviceGuard guard(gpu_);
  cuda::softmax_backward(stream(), dtype, rows, n, y, dy, dx, log);
}

std::int64_t CudaKernels::attention_forward_scratch(const kernels::AttentionSizes& sizes) {
  return cuda::attention_forward_scratch(sizes);
}

std::int64_t CudaKernels::attention_backward_scratch(const kernels::AttentionSizes& sizes) {
  return cuda::attention_backward_scratch(sizes);
}

void CudaKernels::causal_attention_forward(const kernels::AttentionSizes& sizes, const kernels::InMatrices& q,
                                           const kernels::InMatrices& k, const kernels::InMatrices& v, const kernels::OutMatrices& out,
                                           void* lse, void* scratch) {
  DeviceGuard guard(gpu_);
  cuda::attention_forward(stream(), sizes, q, k, v, out, lse, scratch);
}

void CudaKernels::causal_attention_backward(const kernels::AttentionSizes& sizes, const kernels::InMatrices& q,
                                            const kernels::InMatrices& k, const kernels::InMatrices& v, const kernels::InMatrices& out,
                                            const kernels::InMatrices& dout, const void* lse, const kernels::OutMatrices& dq,
                                            const kernels::OutMatrices& dk, const kernels::OutMatrices& dv, void* scratch) {
  DeviceGuard guard(gpu_);
  cuda::attention_backward(stream(), sizes, q, k, v, out, dout, lse, dq, dk, dv, scratch);
}

void CudaKernels::rotary_in_place(const kernels::RotarySizes& sizes, void* data, const std::int64_t* outer_offsets,
                                  std::int64_t outer_count) {
  if (outer_count <= 0 || sizes.seq_len <= 0 || sizes.rotary_dims < 2) return;
  DeviceGuard guard(gpu_);
  const auto* offsets =
      static_cast<const std::int64_t*>(uploads_.upload(outer_offsets, static_cast<std::size_t>(outer_count) * sizeof(std::int64_t)));
  cuda::rotary_in_place(stream(), sizes, data, offsets, outer_count);
}

// --- lookups ---

void CudaKernels::gather_rows(const std::int32_t* ids, std::int64_t count, kernels::VocabRange range, const void* table,
                              std::size_t row_bytes, void* out) {
  DeviceGuard guard(gpu_);
  cuda::gather_rows(stream(), ids, count, range, table, row_bytes, out);
}

void CudaKernels::scatter_add_rows(DType dtype, const std::int32_t* ids, std::int64_t count, kernels::VocabRange range, const void* grad,
                                   std::int64_t row, void* table_grad, const SumTree& tree) {
  DeviceGuard guard(gpu_);
  cuda::scatter_add_rows(stream(), workspace_, dtype, ids, count, range, grad, row, table_grad, tree);
}

void CudaKernels::pick_forward(const std::int32_t* targets, kernels::VocabRange range, const kernels::PickLayout& where,
                               const void* logits, std::size_t element_size, void* out) {
  DeviceGuard guard(gpu_);
  cuda::pick_forward(stream(), targets, range, where, logits, element_size, out);
}

void CudaKernels::pick_backward(DType dtype, const std::int32_t* targets, kernels::VocabRange range, const kernels::PickLayout& where,
                                const void* grad, void* logits_grad, std::int64_t logits_count) {
  DeviceGuard guard(gpu_);
  cuda::pick_backward(stream(), dtype, targets, range, where, grad, logits_grad, logits_count);
}

}  // namespace nax::cuda
