#pragma once
// CUDA kernels on raw device pointers: one function per op, each enqueued on
// `stream` and returning at once; a bad launch raises a nax::Error. bf16 is computed in f32.
// Pointers need only their type's alignment; 16-byte-aligned ones take a vectorised path.
// The dtype-generic kernels behind CudaKernels are declared by concept: layout.h, binary.h,
// reduce.h, norm.h, lookup.h, rotary.h, gemm.h, attention.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "nax/kernels/kernels.h"

namespace nax::cuda {

using bf16_t = __nv_bfloat16;

void fill(cudaStream_t stream, float* out, std::size_t n, float value);
void fill(cudaStream_t stream, bf16_t* out, std::size_t n, float value);

// Round to nearest even (f32 -> bf16); exact the other way.
void cast(cudaStream_t stream, const float* in, bf16_t* out, std::size_t n);
void cast(cudaStream_t stream, const bf16_t* in, float* out, std::size_t n);

// out[i] = a[i] + b[i] and a[i] * b[i]; out may alias a or b.
void add(cudaStream_t stream, const float* a, const float* b, float* out, std::size_t n);
void add(cudaStream_t stream, const bf16_t* a, const bf16_t* b, bf16_t* out, std::size_t n);
void mul(cudaStream_t stream, const float* a, const float* b, float* out, std::size_t n);
void mul(cudaStream_t stream, const bf16_t* a, const bf16_t* b, bf16_t* out, std::size_t n);

// GELU, tanh approximation: y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); dx = dy * y'(x).
// f64 computes in f64.
void gelu_forward(cudaStream_t stream, const float* x, float* y, std::size_t n);
void gelu_forward(cudaStream_t stream, const bf16_t* x, bf16_t* y, std::size_t n);
void gelu_forward(cudaStream_t stream, const double* x, double* y, std::size_t n);
void gelu_backward(cudaStream_t stream, const float* x, const float* dy, float* dx, std::size_t n);
void gelu_backward(cudaStream_t stream, const bf16_t* x, const bf16_t* dy, bf16_t* dx, std::size_t n);
void gelu_backward(cudaStream_t stream, const double* x, const double* dy, double* dx, std::size_t n);

// One AdamW step (src/nn/optim.cpp's formula), in place on f32 master weights and moments:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr * ((m / c1) / (sqrt(v / c2) + eps) + weight_decay * p),  c_i = 1 - b_i^step
// `step` counts from 1. The optimizer decays only matrices: pass weight_decay 0 for the others.
// When param_bf16 is not null it receives the updated weights rounded to bf16.
struct AdamWConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  std::int64_t step = 1;
};
void adamw_step(cudaStream_t stream, float* param, float* m, float* v, const float* grad, bf16_t* param_bf16, std::size_t n,
                const AdamWConfig& config);
// The same out of place, with the coefficients of the kernel interface (nax/kernels/kernels.h).
void adamw_step(cudaStream_t stream, std::size_t n, const float* param, const float* m, const float* v, const float* grad,
                float* param_out, float* m_out, float* v_out, const kernels::AdamWStep& step);

}  // namespace nax::cuda
