// The tree GEMM: a block of 16 x 16 threads computes a 16 x 16 tile of C, one element a thread.
// The block walks k in steps of 16, staging the A and B tiles in shared memory (loaded so that
// neighbouring threads read neighbouring addresses whatever the transposes); every thread then
// feeds the same k sequence to its TreeDot (tree_sum.cuh): acc = fma(a, b, acc), and at each
// leaf's end the leaf goes onto the thread's TreeStack and acc restarts from +0. Simple rather
// than fast: deterministic mode's price, paid only when asked for.
#include "kernels/cuda/tree_gemm.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/check.h"
#include "kernels/cuda/numeric.cuh"
#include "kernels/cuda/tree_sum.cuh"
#include "nax/core/error.h"

namespace nax::cuda {

namespace {

using detail::compute_t;
using detail::narrow;
using detail::widen;

constexpr int kTile = 16;

struct TreeGemmParams {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  std::int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  double beta = 0.0;
  detail::TreeShape tree;
};

__host__ __device__ std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// as[r][s] = A(row0 + r, k0 + s) and bs[s][c] = B(k0 + s, col0 + c), zero outside the matrices.
// A(i, j) is a[i lda + j], or a[j lda + i] when transposed; B likewise.
template <typename T, typename Acc>
__device__ __forceinline__ void load_tiles(const TreeGemmParams& p, const T* a, const T* b, std::int64_t row0, std::int64_t col0,
                                           std::int64_t k0, Acc (&as)[kTile][kTile + 1], Acc (&bs)[kTile][kTile + 1]) {
  const int x = static_cast<int>(threadIdx.x), y = static_cast<int>(threadIdx.y);
  if (p.trans_a) {  // x runs along A's stored rows' contiguous index: the row of op(A)
    const std::int64_t i = row0 + x, j = k0 + y;
    as[x][y] = i < p.m && j < p.k ? widen(a[j * p.lda + i]) : Acc{0};
  } else {
    const std::int64_t i = row0 + y, j = k0 + x;
    as[y][x] = i < p.m && j < p.k ? widen(a[i * p.lda + j]) : Acc{0};
  }
  if (p.trans_b) {
    const std::int64_t i = k0 + x, j = col0 + y;
    bs[x][y] = i < p.k && j < p.n ? widen(b[j * p.ldb + i]) : Acc{0};
  } else {
    const std::int64_t i = k0 + y, j = col0 + x;
    bs[y][x] = i < p.k && j < p.n ? widen(b[i * p.ldb + j]) : Acc{0};
  }
}

template <typename T>
__global__ void __launch_bounds__(kTile* kTile)
    tree_gemm_kernel(const __grid_constant__ TreeGemmParams p, const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c) {
  using Acc = compute_t<T>;
  __shared__ Acc as[kTile][kTile + 1];
  __shared__ Acc bs[kTile][kTile + 1];
  const int x = static_cast<int>(threadIdx.x), y = static_cast<int>(threadIdx.y);
  const std::int64_t tiles_m = ceil_div(p.m, kTile), tiles_n = ceil_div(p.n, kTile);
  for (std::int64_t t = blockIdx.z; t < p.batch; t += gridDim.z)
    for (std::int64_t tm = blockIdx.y; tm < tiles_m; tm += gridDim.y)
      for (std::int64_t tn = blockIdx.x; tn < tiles_n; tn += gridDim.x) {
        const T* at = a + t * p.stride_a;
        const T* bt = b + t * p.stride_b;
        const std::int64_t row0 = tm * kTile, col0 = tn * kTile;
        detail::TreeDot<Acc> dot(p.tree.leaf);
        for (std::int64_t k0 = 0; k0 < p.k; k0 += kTile) {
          load_tiles(p, at, bt, row0, col0, k0, as, bs);
          __syncthreads();
          const int steps = static_cast<int>(min(static_cast<std::int64_t>(kTile), p.k - k0));
          for (int s = 0; s < steps; ++s) dot.add(as[y][s], bs[s][x]);
          __syncthreads();  // every thread is done with the tiles before the next load
        }
        const std::int64_t row = row0 + y, col = col0 + x;
        if (row < p.m && col < p.n) {
          T* out = c + t * p.stride_c + row * p.ldc + col;
          Acc sum = dot.result();
          if (p.beta != 0.0) sum = detail::add_rn(sum, detail::mul_rn(static_cast<Acc>(p.beta), widen(*out)));
          *out = narrow<T>(sum);
        }
      }
}

TreeGemmParams params_of(const kernels::GemmShape& s) {
  TreeGemmParams p;
  p.trans_a = s.trans_a, p.trans_b = s.trans_b;
  p.m = s.m, p.n = s.n, p.k = s.k;
  p.lda = s.lda != 0 ? s.lda : (s.trans_a ? s.m : s.k);
  p.ldb = s.ldb != 0 ? s.ldb : (s.trans_b ? s.k : s.n);
  p.ldc = s.ldc != 0 ? s.ldc : s.n;
  p.batch = s.batch, p.stride_a = s.stride_a, p.stride_b = s.stride_b, p.stride_c = s.stride_c;
  p.beta = s.beta;
  p.tree = detail::tree_shape(s.tree, s.k, "gemm");
  return p;
}

}  // namespace

void tree_gemm(cudaStream_t stream, DType dtype, const kernels::GemmShape& shape, const void* a, const void* b, void* c) {
  if (shape.m <= 0 || shape.n <= 0 || shape.k <= 0 || shape.batch <= 0)
    fail("gemm", "the tree GEMM needs m, n, k and batch > 0, got m={} n={} k={} batch={}", shape.m, shape.n, shape.k, shape.batch);
  const TreeGemmParams p = params_of(shape);
  const dim3 block(kTile, kTile);
  const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>(ceil_div(p.n, kTile), 1 << 30)),
                  static_cast<unsigned>(std::min<std::int64_t>(ceil_div(p.m, kTile), 65535)),
                  static_cast<unsigned>(std::min<std::int64_t>(p.batch, 65535)));
  detail::with_floating_dtype(dtype, "gemm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    tree_gemm_kernel<T><<<grid, block, 0, stream>>>(p, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(c));
    NAX_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace nax::cuda
