// The CUDA attention kernels instantiated per dtype and padded head_dim (the shapes: Tiles
// below), and their launchers (attention_launch.h). The kernels' bodies: attention_forward.cuh,
// attention_backward.cuh and attention_deterministic_dq.cuh, on the tile code of
// attention_warp.cuh. The entry points, checks and the batches' offsets are in attention.cpp.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_backward.cuh"
#include "kernels/cuda/attention_deterministic_dq.cuh"
#include "kernels/cuda/attention_forward.cuh"
#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/attention_warp.cuh"
#include "kernels/cuda/check.h"

namespace nax::cuda::attention_detail {

namespace {

// The tile shapes by dtype and head_dim (host side): f(shape) with a ForwardShape, BackwardShape
// or DqShape value. bf16 (tensor cores): 4 warps, 64 query rows per forward block and 64 keys
// per tile (32 at head_dim 256, whose O accumulator alone is 128 registers a thread); backward
// 64 keys x 64 queries with dk, dv in chunks of up to 128 columns (each chunk recomputes S and
// dP: fewer chunks, less work, but dk, dv and dq accumulators of 128 columns take 255 registers
// with a few bytes of spill). f32 (FMAs): smaller tiles where its rows, twice as wide, would not
// fit shared memory, and 64-column chunks.
template <typename T>
struct Tiles;

template <>
struct Tiles<bf16_t> {
  template <typename F>
  static void forward(int head_dim, F&& f) {
    if (head_dim <= 64) f(ForwardShape<bf16_t, 64, 64, 4>{});
    else if (head_dim <= 128) f(ForwardShape<bf16_t, 128, 64, 4>{});
    else f(ForwardShape<bf16_t, 256, 32, 4>{});
  }
  template <typename F>
  static void backward(int head_dim, F&& f) {
    if (head_dim <= 64) f(BackwardShape<bf16_t, 64, 64, 4>{});
    else if (head_dim <= 128) f(BackwardShape<bf16_t, 128, 128, 4>{});
    else f(BackwardShape<bf16_t, 256, 128, 4>{});
  }
  template <typename F>
  static void dq(int head_dim, F&& f) {
    if (head_dim <= 64) f(DqShape<bf16_t, 64, 64, 64, 4>{});
    else if (head_dim <= 128) f(DqShape<bf16_t, 128, 64, 128, 4>{});
    else f(DqShape<bf16_t, 256, 32, 128, 4>{});
  }
};

template <>
struct Tiles<float> {
  template <typename F>
  static void forward(int head_dim, F&& f) {
    if (head_dim <= 64) f(ForwardShape<float, 64, 64, 4>{});
    else if (head_dim <= 128) f(ForwardShape<float, 128, 32, 4>{});
    else f(ForwardShape<float, 256, 32, 4>{});
  }
  template <typename F>
  static void backward(int head_dim, F&& f) {
    if (head_dim <= 64) f(BackwardShape<float, 64, 64, 4>{});
    else if (head_dim <= 128) f(BackwardShape<float, 128, 64, 2>{});
    else f(BackwardShape<float, 256, 64, 2>{});
  }
  template <typename F>
  static void dq(int head_dim, F&& f) {
    if (head_dim <= 64) f(DqShape<float, 64, 64, 64, 4>{});
    else if (head_dim <= 128) f(DqShape<float, 128, 32, 64, 2>{});
    else f(DqShape<float, 256, 32, 64, 2>{});
  }
};

template <typename T, int D, int BN, int W>
__global__ void __launch_bounds__(32 * W) forward_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(16) char smem[];
  forward_block<T, D, BN, W>(p, smem, static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x));
}

template <typename T, int D, int DC, int W>
__global__ void __launch_bounds__(32 * W) backward_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(16) char smem[];
  backward_block<T, D, DC, W>(p, smem, static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x));
}

template <typename T, int D, int BN, int DC, int W>
__global__ void __launch_bounds__(32 * W) deterministic_dq_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(16) char smem[];
  dq_block<T, D, BN, DC, W>(p, smem, static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x));
}

template <typename T>
__global__ void __launch_bounds__(32 * kRowWarps) delta_kernel(const __grid_constant__ Params p) {
  delta_rows<T, kRowWarps>(p, static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x));
}

template <typename T>
__global__ void __launch_bounds__(32 * kRowWarps) dq_kernel(const __grid_constant__ Params p) {
  dq_rows<T, kRowWarps>(p, static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x));
}

// attention.cpp keeps every grid under 2^31 blocks.
unsigned grid(std::int64_t blocks) { return static_cast<unsigned>(blocks); }

// f(T{}) with T the kernels' element type.
template <typename F>
void with_type(bool bf16, F&& f) {
  if (bf16) f(bf16_t{});
  else f(float{});
}

// One pass of a tile shape: `kernel` over `blocks` blocks, with the shape's threads and shared
// memory. Above 48 KiB of dynamic shared memory a kernel must opt in, on each device. Asked at
// every launch (a host-side attribute write, microseconds): every kernel here has the same type,
// so a flag kept per template instance would be shared by all of them.
template <typename Shape, typename Kernel>
void launch_shape(cudaStream_t stream, const Params& p, std::int64_t blocks, Kernel kernel) {
  if (blocks == 0) return;
  if (Shape::kSmem > 48 * 1024)
    NAX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Shape::kSmem)));
  kernel<<<grid(blocks), Shape::kThreads, Shape::kSmem, stream>>>(p);
  NAX_CUDA_CHECK_LAUNCH();
}

// A row kernel (delta_rows, dq_rows): one warp per row.
template <typename Kernel>
void launch_rows(cudaStream_t stream, const Params& p, Kernel kernel) {
  const std::int64_t blocks = row_blocks(p);
  if (blocks == 0) return;
  kernel<<<grid(blocks), 32 * kRowWarps, 0, stream>>>(p);
  NAX_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::int64_t dq_accum_stride(std::int64_t head_dim) { return (head_dim + 7) / 8 * 8; }

std::size_t backward_scratch_bytes(std::int64_t batches, std::int64_t tq, std::int64_t head_dim) {
  const std::size_t rows = static_cast<std::size_t>(batches) * static_cast<std::size_t>(tq);
  const std::size_t delta = (rows * sizeof(float) + 255) / 256 * 256;
  return 256 + delta + rows * static_cast<std::size_t>(dq_accum_stride(head_dim)) * sizeof(float);
}

void launch_forward(cudaStream_t stream, bool bf16, const Params& p) {
  with_type(bf16, [&](auto t) {
    using T = decltype(t);
    Tiles<T>::forward(p.head_dim, [&](auto shape) {
      using S = decltype(shape);
      launch_shape<S>(stream, p, forward_blocks<S>(p), forward_kernel<T, S::kD, S::kBN, S::kW>);
    });
  });
}

void launch_backward_delta(cudaStream_t stream, bool bf16, const Params& p) {
  with_type(bf16, [&](auto t) { launch_rows(stream, p, delta_kernel<decltype(t)>); });
}

void launch_backward_main(cudaStream_t stream, bool bf16, const Params& p) {
  with_type(bf16, [&](auto t) {
    using T = decltype(t);
    Tiles<T>::backward(p.head_dim, [&](auto shape) {
      using S = decltype(shape);
      launch_shape<S>(stream, p, backward_blocks<S>(p), backward_kernel<T, S::kD, S::kDC, S::kW>);
    });
  });
}

void launch_backward_dq(cudaStream_t stream, bool bf16, const Params& p) {
  with_type(bf16, [&](auto t) { launch_rows(stream, p, dq_kernel<decltype(t)>); });
}

void launch_backward_dq_deterministic(cudaStream_t stream, bool bf16, const Params& p) {
  with_type(bf16, [&](auto t) {
    using T = decltype(t);
    Tiles<T>::dq(p.head_dim, [&](auto shape) {
      using S = decltype(shape);
      launch_shape<S>(stream, p, dq_blocks<S>(p), deterministic_dq_kernel<T, S::kD, S::kBN, S::kDC, S::kW>);
    });
  });
}

}  // namespace nax::cuda::attention_detail
