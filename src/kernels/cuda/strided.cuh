#pragma once
// Strided operands in device code: a kernels::Layout<K> travels by value as a kernel parameter
// (__grid_constant__: read in place, not copied per thread) and each thread turns its flat index,
// row-major over the layout's dimensions, into K element offsets by div/mod. Flat indices are
// 32-bit where the element count allows (a 64-bit division costs several times a 32-bit one).
#include <cstdint>
#include <limits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/map.cuh"
#include "kernels/cuda/numeric.cuh"
#include "nax/kernels/kernels.h"

namespace nax::cuda::detail {

template <int K>
struct Offsets {
  std::int64_t at[K];
};

template <int K, typename Index>
__device__ __forceinline__ Offsets<K> offsets_of(const kernels::Layout<K>& layout, Index flat) {
  Offsets<K> o;
#pragma unroll
  for (int k = 0; k < K; ++k) o.at[k] = 0;
  for (int d = layout.rank - 1; d > 0; --d) {
    const Index size = static_cast<Index>(layout.sizes[d]);
    const Index next = flat / size;
    const auto i = static_cast<std::int64_t>(flat - next * size);
#pragma unroll
    for (int k = 0; k < K; ++k) o.at[k] += i * layout.strides[k][d];
    flat = next;
  }
#pragma unroll
  for (int k = 0; k < K; ++k) o.at[k] += static_cast<std::int64_t>(flat) * layout.strides[k][0];
  return o;
}

template <int K>
std::int64_t element_count(const kernels::Layout<K>& layout) {
  std::int64_t count = 1;
  for (int d = 0; d < layout.rank; ++d) count *= layout.sizes[d];
  return count;
}

// Whether a coalesced layout is one run of consecutive elements in every operand.
template <int K>
bool is_contiguous(const kernels::Layout<K>& layout) {
  if (layout.rank != 1) return false;
  for (int k = 0; k < K; ++k)
    if (layout.strides[k][0] != 1) return false;
  return true;
}

// body(TypeTag<Index>{}): 32-bit when i + the grid's stride cannot wrap, else 64-bit.
template <typename Body>
void with_index_type(std::int64_t count, Body&& body) {
  if (count <= std::numeric_limits<std::int32_t>::max()) body(TypeTag<std::uint32_t>{});
  else body(TypeTag<std::uint64_t>{});
}

// f(flat, offsets) for every element of the layout, a grid-stride loop.
template <int K, typename Index, typename F>
__global__ void strided_kernel(const __grid_constant__ kernels::Layout<K> layout, Index count, F f) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) f(i, offsets_of(layout, i));
}

// Runs f over a coalesced, non-empty layout.
template <int K, typename F>
void for_each_strided(cudaStream_t stream, const kernels::Layout<K>& layout, F f) {
  const std::int64_t count = element_count(layout);
  if (count == 0) return;
  constexpr int kThreads = 256;
  with_index_type(count, [&](auto index) {
    using Index = typename decltype(index)::type;
    strided_kernel<K, Index><<<grid_for(static_cast<std::size_t>(count), kThreads), kThreads, 0, stream>>>(layout, static_cast<Index>(count), f);
  });
  NAX_CUDA_CHECK_LAUNCH();
}

}  // namespace nax::cuda::detail
