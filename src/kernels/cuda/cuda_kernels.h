#pragma once
// The CUDA backend of the kernel interface (nax/kernels/kernels.h) for one GPU: every method selects
// the GPU and enqueues its work on the one compute stream, in call order, and returns; only
// copy_to_host and synchronize wait. f32, f64, bf16 (f32 arithmetic and accumulation inside the
// kernels) and i32 where the kernel has integer semantics. Not thread-safe: one worker per GPU.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/binary.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/layout.h"
#include "kernels/cuda/lookup.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/resources.h"
#include "nax/kernels/kernels.h"

namespace nax::cuda {

class CudaKernels final : public kernels::Kernels {
 public:
  explicit CudaKernels(int gpu);
  ~CudaKernels() override;
  CudaKernels(const CudaKernels&) = delete;
  CudaKernels& operator=(const CudaKernels&) = delete;

  int gpu() const { return gpu_; }
  cudaStream_t stream() const { return stream_.get(); }

  Backend backend() const override { return Backend::cuda; }
  bool computes(DType dtype) const override;

  // From pageable host memory the source may be reused on return (the driver stages it); from
  // pinned memory the copy is truly asynchronous: leave the source alone until synchronize().
  void copy_from_host(void* dst, const void* host_src, std::size_t bytes) override {
    if (bytes == 0) return;
    DeviceGuard guard(gpu_);
    NAX_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream()));
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    DeviceGuard guard(gpu_);
    NAX_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
    NAX_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void copy_bytes(void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    DeviceGuard guard(gpu_);
    // Default: under the device transport the source may sit on another GPU of the process.
    NAX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream()));
  }
  void synchronize() override {
    DeviceGuard guard(gpu_);
    NAX_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }

  void binary(kernels::BinaryOp op, DType dtype, const void* a, const void* b, void* out,
              const kernels::Layout<3>& layout) override {
    DeviceGuard guard(gpu_);
    cuda::binary(stream(), op, dtype, a, b, out, layout);
  }
  void unary(kernels::UnaryOp op, DType dtype, const void* in, void* out, std::int64_t n) override {
    DeviceGuard guard(gpu_);
    cuda::unary(stream(), op, dtype, in, out, n);
  }
  void fill(DType dtype, void* out, std::int64_t n, double value) override {
    DeviceGuard guard(gpu_);
    cuda::fill(stream(), dtype, out, n, value);
  }
  void copy(std::size_t element_size, const void* src, void* dst, const kernels::Layout<2>& layout) override {
    DeviceGuard guard(gpu_);
    cuda::copy(stream(), element_size, src, dst, layout);
  }
  void convert(DType from, const void* src, DType to, void* dst, std::int64_t n) override {
    DeviceGuard guard(gpu_);
    cuda::convert(stream(), from, src, to, dst, n);
  }
  void where(DType dtype, const void* cond, const void* a, const void* b, void* out, const kernels::Layout<4>& layout) override {
    DeviceGuard guard(gpu_);
    cuda::where(stream(), dtype, cond, a, b, out, layout);
  }
  void reduce(ReduceOp op, DType dtype, const void* in, void* out, std::int64_t out_count, const kernels::Layout<2>& layout,
              const SumTree& tree) override {
    DeviceGuard guard(gpu_);
    cuda::reduce(stream(), workspace_, multiprocessors_, op, dtype, in, out, out_count, layout, tree);
  }
  void accumulate(ReduceOp op, DType dtype, void* dst, const void* src, std::size_t n) override {
    DeviceGuard guard(gpu_);
    cuda::accumulate(stream(), op, dtype, dst, src, n);
  }

  void bind_thread() override;
  void gemm(DType dtype, const kernels::GemmShape& shape, const void* a, const void* b, void* c) override;
  void adamw(std::int64_t n, const float* p, const float* m, const float* v, const float* g, float* p_out, float* m_out,
             float* v_out, const kernels::AdamWStep& step) override {
    DeviceGuard guard(gpu_);
    cuda::adamw_step(stream(), static_cast<std::size_t>(n), p, m, v, g, p_out, m_out, v_out, step);
  }

  void gelu_forward(DType dtype, std::int64_t n, const void* x, void* y) override;
  void gelu_backward(DType dtype, std::int64_t n, const void* x, const void* dy, void* dx) override;
  void layer_norm_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale, const void* bias,
                          double eps, void* y, void* mean, void* rstd) override {
    DeviceGuard guard(gpu_);
    cuda::layer_norm_forward(stream(), dtype, rows, n, x, scale, bias, eps, y, mean, rstd);
  }
  void layer_norm_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale, const void* mean,
                           const void* rstd, const void* dy, void* dx, void* dscale, void* dbias,
                           const SumTree& rows_tree) override {
    DeviceGuard guard(gpu_);
    cuda::layer_norm_backward(stream(), workspace_, multiprocessors_, dtype, rows, n, x, scale, mean, rstd, dy, dx, dscale, dbias,
                              rows_tree);
  }
  void softmax_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, void* y, bool log) override {
    DeviceGuard guard(gpu_);
    cuda::softmax_forward(stream(), dtype, rows, n, x, y, log);
  }
  void softmax_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* y, const void* dy, void* dx,
                        bool log) override {
    DeviceGuard guard(gpu_);
    cuda::softmax_backward(stream(), dtype, rows, n, y, dy, dx, log);
  }

  std::int64_t attention_forward_scratch(const kernels::AttentionSizes& sizes) override {
    return cuda::attention_forward_scratch(sizes);
  }
  std::int64_t attention_backward_scratch(const kernels::AttentionSizes& sizes) override {
    return cuda::attention_backward_scratch(sizes);
  }
  void causal_attention_forward(const kernels::AttentionSizes& sizes, const kernels::InMatrices& q, const kernels::InMatrices& k,
                                const kernels::InMatrices& v, const kernels::OutMatrices& out, void* lse,
                                void* scratch) override {
    DeviceGuard guard(gpu_);
    cuda::attention_forward(stream(), sizes, q, k, v, out, lse, scratch);
  }
  void causal_attention_backward(const kernels::AttentionSizes& sizes, const kernels::InMatrices& q, const kernels::InMatrices& k,
                                 const kernels::InMatrices& v, const kernels::InMatrices& out, const kernels::InMatrices& dout,
                                 const void* lse, const void* dlse, const kernels::OutMatrices& dq,
                                 const kernels::OutMatrices& dk, const kernels::OutMatrices& dv, void* scratch) override {
    DeviceGuard guard(gpu_);
    cuda::attention_backward(stream(), sizes, q, k, v, out, dout, lse, dlse, dq, dk, dv, scratch);
  }
  void rotary_in_place(const kernels::RotarySizes& sizes, void* data, const std::int64_t* outer_offsets,
                       std::int64_t outer_count) override;

  void gather_rows(const std::int32_t* ids, std::int64_t count, kernels::VocabRange range, const void* table,
                   std::size_t row_bytes, void* out) override {
    DeviceGuard guard(gpu_);
    cuda::gather_rows(stream(), ids, count, range, table, row_bytes, out);
  }
  void scatter_add_rows(DType dtype, const std::int32_t* ids, std::int64_t count, kernels::VocabRange range, const void* grad,
                        std::int64_t row, void* table_grad, const SumTree& tree) override {
    DeviceGuard guard(gpu_);
    cuda::scatter_add_rows(stream(), workspace_, dtype, ids, count, range, grad, row, table_grad, tree);
  }
  void pick_forward(const std::int32_t* targets, kernels::VocabRange range, const kernels::PickLayout& where, const void* logits,
                    std::size_t element_size, void* out) override {
    DeviceGuard guard(gpu_);
    cuda::pick_forward(stream(), targets, range, where, logits, element_size, out);
  }
  void pick_backward(DType dtype, const std::int32_t* targets, kernels::VocabRange range, const kernels::PickLayout& where,
                     const void* grad, void* logits_grad, std::int64_t logits_count) override {
    DeviceGuard guard(gpu_);
    cuda::pick_backward(stream(), dtype, targets, range, where, grad, logits_grad, logits_count);
  }

 private:
  int gpu_;
  int multiprocessors_ = 0;
  Stream stream_;  // declared first: the members below enqueue frees on it when destroyed
  GemmContext gemm_;
  Workspace workspace_;
  Uploader uploads_;
};

}  // namespace nax::cuda
