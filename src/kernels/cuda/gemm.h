#pragma once
// GEMM through cuBLASLt, in row-major terms: C = alpha op(A) op(B) + beta C (+ bias) (then GELU),
// with op(A) m x k, op(B) k x n and C m x n, all row-major with the given row strides; optionally
// a strided batch. Inputs f32 or bf16 (both the same), output f32 or bf16, accumulation in f32
// (CUBLAS_COMPUTE_32F: f32 inputs are not rounded to tf32); or f64 throughout (CUBLAS_COMPUTE_64F).
// Each context caches its plans (descriptors, layouts and the heuristic's algorithm) by shape.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "nax/core/dtype.h"

namespace nax::cuda {

struct GemmPlanCache;  // gemm.cpp

// The cuBLASLt handle and workspace of one device; not thread-safe (one per thread or stream).
class GemmContext {
 public:
  static constexpr std::size_t kDefaultWorkspace = std::size_t{32} << 20;  // 32 MiB, as NVIDIA advises for Hopper

  explicit GemmContext(int device, std::size_t workspace_bytes = kDefaultWorkspace);
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  int device() const { return device_; }
  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }
  std::size_t workspace_bytes() const { return workspace_bytes_; }
  GemmPlanCache& plans() const { return *plans_; }

 private:
  int device_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_;
  std::unique_ptr<GemmPlanCache> plans_;
};

enum class GemmEpilogue { none, bias, gelu, bias_gelu };

struct GemmArgs {
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false;  // A is stored k x m (row-major) and used transposed
  bool trans_b = false;  // B is stored n x k (row-major) and used transposed
  DType input = DType::bf16;   // A and B
  DType output = DType::bf16;  // C (and the bias)
  std::int64_t lda = 0, ldb = 0, ldc = 0;  // row strides in elements of A, B, C as stored; 0: packed rows
  int batch = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between matrices of the batch
  GemmEpilogue epilogue = GemmEpilogue::none;
  const void* bias = nullptr;  // n elements of the output type, added to every row of C
  double alpha = 1.0, beta = 0.0;  // C = alpha op(A) op(B) + beta C, before the epilogue
};

void gemm_lt(GemmContext& context, cudaStream_t stream, const GemmArgs& args, const void* a, const void* b, void* c);

}  // namespace nax::cuda
