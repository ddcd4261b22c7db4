#pragma once
// The elementwise launcher behind fill, cast, add, mul and GELU: a grid-stride loop applying a
// functor to element i of every input, 4 elements per thread per step through vector loads when
// all pointers allow it.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/check.h"

namespace nax::cuda::detail {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

constexpr int kVector = 4;

template <typename T>
struct alignas(sizeof(T) * kVector) Pack {
  T v[kVector];
};

// By value: each pack is one 8- or 16-byte load.
template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p, std::size_t i) {
  return reinterpret_cast<const Pack<T>*>(p)[i];
}

template <typename Out, typename F, typename... In>
__device__ __forceinline__ Pack<Out> apply_pack(const F& f, Pack<In>... in) {
  Pack<Out> out;
#pragma unroll
  for (int k = 0; k < kVector; ++k) out.v[k] = f(in.v[k]...);
  return out;
}

template <bool Vectorised, typename Out, typename F, typename... In>
__global__ void map_kernel(std::size_t n, F f, Out* out, const In*... in) {  // out may alias an input
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t done = 0;
  if constexpr (Vectorised) {
    const std::size_t packs = n / kVector;
    for (std::size_t i = first; i < packs; i += stride)
      reinterpret_cast<Pack<Out>*>(out)[i] = apply_pack<Out>(f, load_pack(in, i)...);
    done = packs * kVector;
  }
  for (std::size_t i = done + first; i < n; i += stride) out[i] = f(in[i]...);
}

template <typename T>
bool aligned_for_packs(const T* p) {
  return reinterpret_cast<std::uintptr_t>(p) % alignof(Pack<T>) == 0;
}

// Enough blocks to fill the GPU several times over; the loop covers the rest.
inline unsigned grid_for(std::size_t items, int threads) {
  const std::size_t blocks = (items + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, 65536));
}

template <typename Out, typename F, typename... In>
void map(cudaStream_t stream, std::size_t n, F f, Out* out, const In*... in) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  const bool vectorised = n >= kVector && aligned_for_packs(out) && (aligned_for_packs(in) && ...);
  if (vectorised) map_kernel<true><<<grid_for(n / kVector, kThreads), kThreads, 0, stream>>>(n, f, out, in...);
  else map_kernel<false><<<grid_for(n, kThreads), kThreads, 0, stream>>>(n, f, out, in...);
  NAX_CUDA_CHECK_LAUNCH();
}

}  // namespace nax::cuda::detail
