// The rotary embedding: one thread per rotated pair, the pair index fastest. Each thread computes
// its angle and its sine and cosine in f64 (as the CPU does: positions in the thousands times f32
// frequencies would lose digits), then rotates in the compute type of the data.
#include "kernels/cuda/rotary.h"

#include "kernels/cuda/check.h"
#include "kernels/cuda/map.cuh"
#include "kernels/cuda/numeric.cuh"

namespace nax::cuda {

namespace {

using detail::compute_t;
using detail::narrow;
using detail::widen;

constexpr int kThreads = 256;

template <typename T>
__global__ void rotary_kernel(const kernels::RotarySizes s, T* data, const std::int64_t* __restrict__ outer_offsets,
                              std::int64_t outer_count, std::int64_t pairs) {
  using C = compute_t<T>;
  const std::int64_t total = outer_count * s.seq_len * pairs;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < total; index += stride) {
    const std::int64_t i = index % pairs;
    const std::int64_t rest = index / pairs;
    const std::int64_t t = rest % s.seq_len;
    const std::int64_t o = rest / s.seq_len;
    const double frequency = pow(s.base, -2.0 * static_cast<double>(i) / static_cast<double>(s.rotary_dims));
    const double angle = s.direction * static_cast<double>(t + s.position_offset) * frequency;
    double sine, cosine;
    sincos(angle, &sine, &cosine);
    const C c = static_cast<C>(cosine), sn = static_cast<C>(sine);
    T* row = data + outer_offsets[o] + t * s.seq_stride;
    T& x0 = row[2 * i * s.head_dim_stride];
    T& x1 = row[(2 * i + 1) * s.head_dim_stride];
    const C a = widen(x0), b = widen(x1);
    x0 = narrow<T>(a * c - b * sn);
    x1 = narrow<T>(b * c + a * sn);
  }
}

}  // namespace

void rotary_in_place(cudaStream_t stream, const kernels::RotarySizes& sizes, void* data, const std::int64_t* outer_offsets,
                     std::int64_t outer_count) {
  const std::int64_t pairs = sizes.rotary_dims / 2;
  if (pairs <= 0 || sizes.seq_len <= 0 || outer_count <= 0) return;
  detail::with_floating_dtype(sizes.dtype, "rotary_in_place", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto total = static_cast<std::size_t>(outer_count * sizes.seq_len * pairs);
    rotary_kernel<T><<<detail::grid_for(total, kThreads), kThreads, 0, stream>>>(sizes, static_cast<T*>(data), outer_offsets,
                                                                                  outer_count, pairs);
    NAX_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace nax::cuda
