// The tree scatter: a dense tree whose absent terms are +0, evaluated sparsely (sparse_tree_sum in
// tree_sum.cuh: only the positions that pick the row are visited).
#include "kernels/cuda/tree_scatter.h"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <climits>
#include <cstddef>

#include "kernels/cuda/check.h"
#include "kernels/cuda/numeric.cuh"
#include "kernels/cuda/tree_sum.cuh"
#include "nax/core/error.h"

namespace nax::cuda {

namespace {

using detail::compute_t;
using detail::TreeShape;
using kernels::VocabRange;

constexpr int kThreads = 128;

__global__ void positions_kernel(std::int32_t* positions, std::int64_t count) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    positions[i] = static_cast<std::int32_t>(i);
}

// One block per run of equal sorted ids (from its first entry); runs of ids outside the range
// are skipped. Within a run the positions ascend (the sort is stable).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    tree_scatter_kernel(const std::int32_t* __restrict__ sorted_ids, const std::int32_t* __restrict__ positions, std::int64_t count,
                        VocabRange range, TreeShape shape, const T* __restrict__ grad, std::int64_t row, T* __restrict__ table_grad) {
  for (std::int64_t s = blockIdx.x; s < count; s += gridDim.x) {
    const std::int64_t id = sorted_ids[s];
    if (id < range.start || id >= range.start + range.local || (s > 0 && sorted_ids[s - 1] == id)) continue;
    std::int64_t end = s + 1;
    while (end < count && sorted_ids[end] == id) ++end;
    T* dst = table_grad + (id - range.start) * row;
    for (std::int64_t col = threadIdx.x; col < row; col += blockDim.x) {
      const auto term = [=](std::int64_t p) { return detail::widen(grad[p * row + col]); };
      dst[col] = detail::narrow<T>(detail::sparse_tree_sum<compute_t<T>>(positions + s, end - s, shape, term));
    }
  }
}

std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

void tree_scatter_add_rows(cudaStream_t stream, Workspace& workspace, DType dtype, const std::int32_t* ids, std::int64_t count,
                           VocabRange range, const void* grad, std::int64_t row, void* table_grad, const SumTree& tree) {
  const std::int64_t elements = range.local * row;
  if (elements <= 0) return;
  if (count > INT_MAX) fail("scatter_add_rows", "{} ids are more than the deterministic CUDA scatter sorts", count);
  NAX_CUDA_CHECK(cudaMemsetAsync(table_grad, 0, static_cast<std::size_t>(elements) * dtype_size(dtype), stream));
  if (count <= 0) return;
  const TreeShape shape = detail::tree_shape(tree, count, "scatter_add_rows");
  const int items = static_cast<int>(count);

  // Workspace: sorted ids, positions, sorted positions, then CUB's scratch.
  std::size_t sort_bytes = 0;
  NAX_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, ids, static_cast<std::int32_t*>(nullptr), 
                                                 static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr), items, 0,
                                                 32, stream));
  const std::size_t list = round_up(static_cast<std::size_t>(count) * sizeof(std::int32_t));
  char* base = static_cast<char*>(workspace.get(3 * list + sort_bytes));
  auto* sorted_ids = reinterpret_cast<std::int32_t*>(base);
  auto* positions = reinterpret_cast<std::int32_t*>(base + list);
  auto* sorted_positions = reinterpret_cast<std::int32_t*>(base + 2 * list);
  positions_kernel<<<detail::grid_for(static_cast<std::size_t>(count), 256), 256, 0, stream>>>(positions, count);
  NAX_CUDA_CHECK_LAUNCH();
  NAX_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 3 * list, sort_bytes, ids, sorted_ids, positions, sorted_positions, items, 0, 32,
                                                 stream));

  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>(count, 1 << 20));
  detail::with_floating_dtype(dtype, "scatter_add_rows", [&](auto tag) {
    using T = typename decltype(tag)::type;
    tree_scatter_kernel<T><<<blocks, kThreads, 0, stream>>>(sorted_ids, sorted_positions, count, range, shape, static_cast<const T*>(grad),
                                                             row, static_cast<T*>(table_grad));
    NAX_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace nax::cuda
