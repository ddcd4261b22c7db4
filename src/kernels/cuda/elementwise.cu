// fill, cast, add and mul.
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/map.cuh"

namespace nax::cuda {

namespace {

using detail::from_f32;
using detail::to_f32;

template <typename T>
struct Constant {
  float value;
  __device__ T operator()() const { return from_f32<T>(value); }
};

template <typename To>
struct Cast {
  template <typename From>
  __device__ To operator()(From x) const { return from_f32<To>(to_f32(x)); }
};

template <typename T>
struct Add {
  __device__ T operator()(T a, T b) const { return from_f32<T>(to_f32(a) + to_f32(b)); }
};

template <typename T>
struct Mul {
  __device__ T operator()(T a, T b) const { return from_f32<T>(to_f32(a) * to_f32(b)); }
};

}  // namespace

void fill(cudaStream_t stream, float* out, std::size_t n, float value) { detail::map(stream, n, Constant<float>{value}, out); }
void fill(cudaStream_t stream, bf16_t* out, std::size_t n, float value) { detail::map(stream, n, Constant<bf16_t>{value}, out); }

void cast(cudaStream_t stream, const float* in, bf16_t* out, std::size_t n) { detail::map(stream, n, Cast<bf16_t>{}, out, in); }
void cast(cudaStream_t stream, const bf16_t* in, float* out, std::size_t n) { detail::map(stream, n, Cast<float>{}, out, in); }

void add(cudaStream_t stream, const float* a, const float* b, float* out, std::size_t n) { detail::map(stream, n, Add<float>{}, out, a, b); }
void add(cudaStream_t stream, const bf16_t* a, const bf16_t* b, bf16_t* out, std::size_t n) {
  detail::map(stream, n, Add<bf16_t>{}, out, a, b);
}
void mul(cudaStream_t stream, const float* a, const float* b, float* out, std::size_t n) { detail::map(stream, n, Mul<float>{}, out, a, b); }
void mul(cudaStream_t stream, const bf16_t* a, const bf16_t* b, bf16_t* out, std::size_t n) {
  detail::map(stream, n, Mul<bf16_t>{}, out, a, b);
}

}  // namespace nax::cuda
