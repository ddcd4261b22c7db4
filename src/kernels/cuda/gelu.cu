// GELU (tanh approximation), forward and backward, computed in f32.
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/map.cuh"

namespace nax::cuda {

namespace {

using detail::from_f32;
using detail::to_f32;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

template <typename T>
struct GeluForward {
  __device__ T operator()(T xt) const {
    const float x = to_f32(xt);
    const float t = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
    return from_f32<T>(0.5f * x * (1.0f + t));
  }
};

template <typename T>
struct GeluBackward {
  __device__ T operator()(T xt, T dyt) const {
    const float x = to_f32(xt);
    const float t = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    return from_f32<T>(to_f32(dyt) * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du));
  }
};

}  // namespace

void gelu_forward(cudaStream_t stream, const float* x, float* y, std::size_t n) { detail::map(stream, n, GeluForward<float>{}, y, x); }
void gelu_forward(cudaStream_t stream, const bf16_t* x, bf16_t* y, std::size_t n) { detail::map(stream, n, GeluForward<bf16_t>{}, y, x); }
void gelu_backward(cudaStream_t stream, const float* x, const float* dy, float* dx, std::size_t n) {
  detail::map(stream, n, GeluBackward<float>{}, dx, x, dy);
}
void gelu_backward(cudaStream_t stream, const bf16_t* x, const bf16_t* dy, bf16_t* dx, std::size_t n) {
  detail::map(stream, n, GeluBackward<bf16_t>{}, dx, x, dy);
}

}  // namespace nax::cuda
