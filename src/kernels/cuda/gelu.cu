// GELU (tanh approximation), forward and backward, computed in f32 (f64 for f64).
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/map.cuh"
#include "kernels/cuda/numeric.cuh"

namespace nax::cuda {

namespace {

using detail::compute_t;
using detail::narrow;
using detail::widen;

constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kCubic = 0.044715;

__device__ __forceinline__ float tanh_of(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_of(double x) { return tanh(x); }

template <typename T>
struct GeluForward {
  __device__ T operator()(T xt) const {
    using C = compute_t<T>;
    const C x = widen(xt), c = static_cast<C>(kSqrt2OverPi), k = static_cast<C>(kCubic);
    const C t = tanh_of(c * (x + k * x * x * x));
    return narrow<T>(C{0.5} * x * (C{1} + t));
  }
};

template <typename T>
struct GeluBackward {
  __device__ T operator()(T xt, T dyt) const {
    using C = compute_t<T>;
    const C x = widen(xt), c = static_cast<C>(kSqrt2OverPi), k = static_cast<C>(kCubic);
    const C t = tanh_of(c * (x + k * x * x * x));
    const C du = c * (C{1} + C{3} * k * x * x);
    return narrow<T>(widen(dyt) * (C{0.5} * (C{1} + t) + C{0.5} * x * (C{1} - t * t) * du));
  }
};

}  // namespace

void gelu_forward(cudaStream_t stream, const float* x, float* y, std::size_t n) { detail::map(stream, n, GeluForward<float>{}, y, x); }
void gelu_forward(cudaStream_t stream, const bf16_t* x, bf16_t* y, std::size_t n) { detail::map(stream, n, GeluForward<bf16_t>{}, y, x); }
void gelu_forward(cudaStream_t stream, const double* x, double* y, std::size_t n) { detail::map(stream, n, GeluForward<double>{}, y, x); }
void gelu_backward(cudaStream_t stream, const float* x, const float* dy, float* dx, std::size_t n) {
  detail::map(stream, n, GeluBackward<float>{}, dx, x, dy);
}
void gelu_backward(cudaStream_t stream, const bf16_t* x, const bf16_t* dy, bf16_t* dx, std::size_t n) {
  detail::map(stream, n, GeluBackward<bf16_t>{}, dx, x, dy);
}
void gelu_backward(cudaStream_t stream, const double* x, const double* dy, double* dx, std::size_t n) {
  detail::map(stream, n, GeluBackward<double>{}, dx, x, dy);
}

}  // namespace nax::cuda
