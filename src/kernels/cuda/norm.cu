// layer_norm and softmax: a group of threads per row (a warp when n <= 1024, else a block of 256),
// each thread striding over the row, the row's sums combined across the group (group_reduce.cuh).
// Rows are re-read from global memory (L1/L2) for each pass rather than staged in shared memory.
// layer_norm's parameter gradients are column sums over rows: a second kernel gives each block
// 32 columns and a chunk of rows, and the chunks' partials are added in chunk order; in
// deterministic mode they are tree sums over rows instead (tree_sums, one output per column).
#include "kernels/cuda/norm.h"

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/group_reduce.cuh"
#include "kernels/cuda/numeric.cuh"
#include "kernels/cuda/tree_sum.cuh"
#include "nax/core/error.h"

namespace nax::cuda {

namespace {

using detail::compute_t;
using detail::convert_to;
using detail::narrow;
using detail::widen;

constexpr int kThreads = 256;

__device__ __forceinline__ float exp_of(float x) { return expf(x); }
__device__ __forceinline__ double exp_of(double x) { return exp(x); }
__device__ __forceinline__ float log_of(float x) { return logf(x); }
__device__ __forceinline__ double log_of(double x) { return log(x); }
__device__ __forceinline__ float inverse_sqrt(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ double inverse_sqrt(double x) { return 1.0 / sqrt(x); }

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The row a thread works on, and its lane in the row's group.
template <int Group>
__device__ __forceinline__ std::int64_t row_index() {
  return static_cast<std::int64_t>(blockIdx.x) * (kThreads / Group) + threadIdx.x / Group;
}
template <int Group>
__device__ __forceinline__ int lane_index() {
  return static_cast<int>(threadIdx.x) % Group;
}

// body(std::integral_constant<int, Group>{}) with the group size for rows of n elements, and the
// grid that covers `rows` rows.
template <typename Body>
void with_row_group(std::int64_t rows, std::int64_t n, Body&& body) {
  auto run = [&](auto group) {
    const std::int64_t blocks = ceil_div(rows, kThreads / decltype(group)::value);
    if (blocks > 0x7fffffff) fail("row kernel", "{} rows are too many for one grid", rows);
    body(group, static_cast<unsigned>(blocks));
  };
  if (n <= 1024) run(std::integral_constant<int, 32>{});
  else run(std::integral_constant<int, kThreads>{});
}

template <typename T, int Group>
__global__ void __launch_bounds__(kThreads)
    layer_norm_forward_kernel(std::int64_t rows, std::int64_t n, const T* __restrict__ x, const T* __restrict__ scale,
                              const T* __restrict__ bias, compute_t<T> eps, T* __restrict__ y, compute_t<T>* __restrict__ mean,
                              compute_t<T>* __restrict__ rstd) {
  using C = compute_t<T>;
  const std::int64_t row = row_index<Group>();
  const int lane = lane_index<Group>();
  if (row >= rows) return;  // the whole group leaves together
  const T* xr = x + row * n;
  T* yr = y + row * n;
  C sum = 0;
  for (std::int64_t i = lane; i < n; i += Group) sum += widen(xr[i]);
  const C mu = detail::group_sum<Group>(sum) / static_cast<C>(n);
  C squares = 0;  // about the mean: no cancellation when the mean is large against the spread
  for (std::int64_t i = lane; i < n; i += Group) {
    const C d = widen(xr[i]) - mu;
    squares += d * d;
  }
  const C rs = inverse_sqrt(detail::group_sum<Group>(squares) / static_cast<C>(n) + eps);
  for (std::int64_t i = lane; i < n; i += Group) yr[i] = narrow<T>((widen(xr[i]) - mu) * rs * widen(scale[i]) + widen(bias[i]));
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// With xhat = (x - mean) rstd and h = dy scale: dx = rstd (h - mean(h) - xhat mean(h xhat)).
template <typename T, int Group>
__global__ void __launch_bounds__(kThreads)
    layer_norm_backward_kernel(std::int64_t rows, std::int64_t n, const T* __restrict__ x, const T* __restrict__ scale,
                               const compute_t<T>* __restrict__ mean, const compute_t<T>* __restrict__ rstd,
                               const T* __restrict__ dy, T* __restrict__ dx) {
  using C = compute_t<T>;
  const std::int64_t row = row_index<Group>();
  const int lane = lane_index<Group>();
  if (row >= rows) return;
  const T* xr = x + row * n;
  const T* gr = dy + row * n;
  const C mu = mean[row], rs = rstd[row];
  detail::Pair<C> sums{0, 0};
  for (std::int64_t i = lane; i < n; i += Group) {
    const C h = widen(gr[i]) * widen(scale[i]);
    sums.first += h;
    sums.second += h * (widen(xr[i]) - mu) * rs;
  }
  sums = detail::group_sum<Group>(sums);
  const C h_mean = sums.first / static_cast<C>(n), hx_mean = sums.second / static_cast<C>(n);
  T* dxr = dx + row * n;
  for (std::int64_t i = lane; i < n; i += Group) {
    const C xhat = (widen(xr[i]) - mu) * rs;
    dxr[i] = narrow<T>(rs * (widen(gr[i]) * widen(scale[i]) - h_mean - xhat * hx_mean));
  }
}

constexpr int kColumns = 32, kRowLanes = 8;

// Block (kColumns x kRowLanes): columns [32 blockIdx.x, +32), rows of chunk blockIdx.y. Writes
// the chunk's sums of dy xhat and dy at [chunk * n + column].
template <typename T, typename Out>
__global__ void __launch_bounds__(kColumns* kRowLanes)
    layer_norm_params_kernel(std::int64_t rows, std::int64_t n, std::int64_t rows_per_chunk, const T* __restrict__ x,
                             const compute_t<T>* __restrict__ mean, const compute_t<T>* __restrict__ rstd,
                             const T* __restrict__ dy, Out* __restrict__ dscale, Out* __restrict__ dbias) {
  using C = compute_t<T>;
  __shared__ C scale_sums[kRowLanes][kColumns + 1];
  __shared__ C bias_sums[kRowLanes][kColumns + 1];
  const std::int64_t column = static_cast<std::int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  const std::int64_t chunk = blockIdx.y;
  const std::int64_t begin = chunk * rows_per_chunk, end = min(rows, begin + rows_per_chunk);
  C ds = 0, db = 0;
  if (column < n) {
    for (std::int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      const C g = widen(dy[r * n + column]);
      ds += g * (widen(x[r * n + column]) - mean[r]) * rstd[r];
      db += g;
    }
  }
  scale_sums[threadIdx.y][threadIdx.x] = ds;
  bias_sums[threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y != 0 || column >= n) return;
  for (int lane = 1; lane < kRowLanes; ++lane) {
    ds += scale_sums[lane][threadIdx.x];
    db += bias_sums[lane][threadIdx.x];
  }
  dscale[chunk * n + column] = convert_to<Out>(ds);
  dbias[chunk * n + column] = convert_to<Out>(db);
}

template <typename T>
__global__ void sum_chunks_kernel(std::int64_t chunks, std::int64_t n, const compute_t<T>* __restrict__ scale_partials,
                                  const compute_t<T>* __restrict__ bias_partials, T* __restrict__ dscale, T* __restrict__ dbias) {
  const std::int64_t column = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= n) return;
  compute_t<T> ds = 0, db = 0;
  for (std::int64_t c = 0; c < chunks; ++c) {
    ds += scale_partials[c * n + column];
    db += bias_partials[c * n + column];
  }
  dscale[column] = narrow<T>(ds);
  dbias[column] = narrow<T>(db);
}

template <typename T>
void layer_norm_params(cudaStream_t stream, Workspace& workspace, int multiprocessors, std::int64_t rows, std::int64_t n,
                       const T* x, const compute_t<T>* mean, const compute_t<T>* rstd, const T* dy, T* dscale, T* dbias) {
  using C = compute_t<T>;
  const std::int64_t column_blocks = ceil_div(n, kColumns);
  const std::int64_t target_blocks = static_cast<std::int64_t>(std::max(multiprocessors, 1)) * 8;
  std::int64_t chunks = std::clamp<std::int64_t>(std::min(ceil_div(target_blocks, column_blocks), ceil_div(rows, 32)), 1, 65535);
  const std::int64_t rows_per_chunk = ceil_div(rows, chunks);
  chunks = ceil_div(rows, rows_per_chunk);
  const dim3 block(kColumns, kRowLanes);
  const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(chunks));
  if (chunks == 1) {
    layer_norm_params_kernel<T, T><<<grid, block, 0, stream>>>(rows, n, rows_per_chunk, x, mean, rstd, dy, dscale, dbias);
    NAX_CUDA_CHECK_LAUNCH();
    return;
  }
  auto* partials = static_cast<C*>(workspace.get(static_cast<std::size_t>(2 * chunks * n) * sizeof(C)));
  C* scale_partials = partials;
  C* bias_partials = partials + chunks * n;
  layer_norm_params_kernel<T, C><<<grid, block, 0, stream>>>(rows, n, rows_per_chunk, x, mean, rstd, dy, scale_partials, bias_partials);
  NAX_CUDA_CHECK_LAUNCH();
  sum_chunks_kernel<T><<<static_cast<unsigned>(ceil_div(n, kThreads)), kThreads, 0, stream>>>(chunks, n, scale_partials,
                                                                                              bias_partials, dscale, dbias);
  NAX_CUDA_CHECK_LAUNCH();
}

// Deterministic mode's parameter gradients: column o's term of row i, dy * xhat (the CPU's
// rounding: xhat = (x - mean) * rstd first) or dy.
template <typename T, bool Scale>
struct LayerNormParamTerms {
  std::int64_t n;
  const T* x;
  const compute_t<T>* mean;
  const compute_t<T>* rstd;
  const T* dy;
  T* out;
  __device__ compute_t<T> operator()(std::int64_t o, std::int64_t i) const {
    const compute_t<T> g = widen(dy[i * n + o]);
    if constexpr (!Scale) return g;
    const compute_t<T> xhat = detail::mul_rn(detail::sub_rn(widen(x[i * n + o]), mean[i]), rstd[i]);
    return detail::mul_rn(g, xhat);
  }
  __device__ void finish(std::int64_t o, compute_t<T> sum) const { out[o] = narrow<T>(sum); }
};

template <typename T>
void layer_norm_params_tree(cudaStream_t stream, Workspace& workspace, std::int64_t rows, std::int64_t n, const T* x,
                            const compute_t<T>* mean, const compute_t<T>* rstd, const T* dy, T* dscale, T* dbias,
                            const SumTree& tree) {
  using C = compute_t<T>;
  const LayerNormParamTerms<T, true> scale_terms{n, x, mean, rstd, dy, dscale};
  detail::tree_sums<C>(stream, workspace, scale_terms, n, rows, tree, "layer_norm_backward");
  const LayerNormParamTerms<T, false> bias_terms{n, x, mean, rstd, dy, dbias};
  detail::tree_sums<C>(stream, workspace, bias_terms, n, rows, tree, "layer_norm_backward");
}

template <typename T, int Group>
__global__ void __launch_bounds__(kThreads)
    softmax_forward_kernel(std::int64_t rows, std::int64_t n, const T* __restrict__ x, T* __restrict__ y, bool log) {
  using C = compute_t<T>;
  const std::int64_t row = row_index<Group>();
  const int lane = lane_index<Group>();
  if (row >= rows) return;
  const T* xr = x + row * n;
  T* yr = y + row * n;
  C m = -INFINITY;
  for (std::int64_t i = lane; i < n; i += Group) {
    const C v = widen(xr[i]);
    m = v > m ? v : m;
  }
  m = detail::group_max<Group>(m);
  C total = 0;
  for (std::int64_t i = lane; i < n; i += Group) total += exp_of(widen(xr[i]) - m);
  total = detail::group_sum<Group>(total);
  if (log) {
    const C lse = m + log_of(total);
    for (std::int64_t i = lane; i < n; i += Group) yr[i] = narrow<T>(widen(xr[i]) - lse);
  } else {
    const C inverse = C{1} / total;
    for (std::int64_t i = lane; i < n; i += Group) yr[i] = narrow<T>(exp_of(widen(xr[i]) - m) * inverse);
  }
}

template <typename T, int Group>
__global__ void __launch_bounds__(kThreads) softmax_backward_kernel(std::int64_t rows, std::int64_t n, const T* __restrict__ y,
                                                                    const T* __restrict__ dy, T* __restrict__ dx, bool log) {
  using C = compute_t<T>;
  const std::int64_t row = row_index<Group>();
  const int lane = lane_index<Group>();
  if (row >= rows) return;
  const T* yr = y + row * n;
  const T* gr = dy + row * n;
  T* dxr = dx + row * n;
  C sum = 0;
  for (std::int64_t i = lane; i < n; i += Group) sum += log ? widen(gr[i]) : widen(gr[i]) * widen(yr[i]);
  sum = detail::group_sum<Group>(sum);
  for (std::int64_t i = lane; i < n; i += Group) {
    const C g = widen(gr[i]), v = widen(yr[i]);
    dxr[i] = narrow<T>(log ? g - exp_of(v) * sum : v * (g - sum));
  }
}

}  // namespace

void layer_norm_forward(cudaStream_t stream, DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale,
                        const void* bias, double eps, void* y, void* mean, void* rstd) {
  if (rows <= 0 || n <= 0) return;
  detail::with_floating_dtype(dtype, "layer_norm_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_row_group(rows, n, [&](auto group, unsigned blocks) {
      layer_norm_forward_kernel<T, decltype(group)::value><<<blocks, kThreads, 0, stream>>>(
          rows, n, static_cast<const T*>(x), static_cast<const T*>(scale), static_cast<const T*>(bias),
          static_cast<compute_t<T>>(eps), static_cast<T*>(y), static_cast<compute_t<T>*>(mean),
          static_cast<compute_t<T>*>(rstd));
      NAX_CUDA_CHECK_LAUNCH();
    });
  });
}

void layer_norm_backward(cudaStream_t stream, Workspace& workspace, int multiprocessors, DType dtype, std::int64_t rows,
                         std::int64_t n, const void* x, const void* scale, const void* mean, const void* rstd, const void* dy,
                         void* dx, void* dscale, void* dbias, const SumTree& rows_tree) {
  if (n <= 0) return;
  if (rows <= 0) {  // empty sums
    NAX_CUDA_CHECK(cudaMemsetAsync(dscale, 0, static_cast<std::size_t>(n) * dtype_size(dtype), stream));
    NAX_CUDA_CHECK(cudaMemsetAsync(dbias, 0, static_cast<std::size_t>(n) * dtype_size(dtype), stream));
    return;
  }
  detail::with_floating_dtype(dtype, "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* px = static_cast<const T*>(x);
    const auto* pmean = static_cast<const compute_t<T>*>(mean);
    const auto* prstd = static_cast<const compute_t<T>*>(rstd);
    const auto* pdy = static_cast<const T*>(dy);
    with_row_group(rows, n, [&](auto group, unsigned blocks) {
      layer_norm_backward_kernel<T, decltype(group)::value><<<blocks, kThreads, 0, stream>>>(
          rows, n, px, static_cast<const T*>(scale), pmean, prstd, pdy, static_cast<T*>(dx));
      NAX_CUDA_CHECK_LAUNCH();
    });
    if (rows_tree.on)
      layer_norm_params_tree(stream, workspace, rows, n, px, pmean, prstd, pdy, static_cast<T*>(dscale), static_cast<T*>(dbias),
                             rows_tree);
    else
      layer_norm_params(stream, workspace, multiprocessors, rows, n, px, pmean, prstd, pdy, static_cast<T*>(dscale),
                        static_cast<T*>(dbias));
  });
}

void softmax_forward(cudaStream_t stream, DType dtype, std::int64_t rows, std::int64_t n, const void* x, void* y, bool log) {
  if (rows <= 0 || n <= 0) return;
  detail::with_floating_dtype(dtype, "softmax_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_row_group(rows, n, [&](auto group, unsigned blocks) {
      softmax_forward_kernel<T, decltype(group)::value>
          <<<blocks, kThreads, 0, stream>>>(rows, n, static_cast<const T*>(x), static_cast<T*>(y), log);
      NAX_CUDA_CHECK_LAUNCH();
    });
  });
}

void softmax_backward(cudaStream_t stream, DType dtype, std::int64_t rows, std::int64_t n, const void* y, const void* dy, void* dx,
                      bool log) {
  if (rows <= 0 || n <= 0) return;
  detail::with_floating_dtype(dtype, "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_row_group(rows, n, [&](auto group, unsigned blocks) {
      softmax_backward_kernel<T, decltype(group)::value><<<blocks, kThreads, 0, stream>>>(
          rows, n, static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), log);
      NAX_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace nax::cuda
