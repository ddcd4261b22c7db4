// gather_rows: one thread per word of the output (the widest of 16, 8, 4, 2, 1 bytes that the row
// size and both pointers allow). scatter_add_rows and pick_backward: zero the destination, then
// one thread per source element adds it atomically (ids may repeat). pick_forward: zero the
// output, then one thread per target. The order of atomic adds varies from run to run, so sums of
// repeated ids may differ in their last bits.
#include "kernels/cuda/lookup.h"

#include <cstdint>

#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/map.cuh"
#include "kernels/cuda/numeric.cuh"
#include "kernels/cuda/strided.cuh"
#include "kernels/cuda/tree_scatter.h"

namespace nax::cuda {

namespace {

using detail::convert_to;
using detail::Offsets;
using kernels::VocabRange;

constexpr int kThreads = 256;

__device__ __forceinline__ bool holds(const VocabRange& range, std::int64_t id) {
  return id >= range.start && id < range.start + range.local;
}

__device__ __forceinline__ void atomic_add(float* at, float v) { atomicAdd(at, v); }
__device__ __forceinline__ void atomic_add(double* at, double v) { atomicAdd(at, v); }
__device__ __forceinline__ void atomic_add(__nv_bfloat16* at, __nv_bfloat16 v) { atomicAdd(at, v); }

template <typename W>
__global__ void gather_kernel(const std::int32_t* __restrict__ ids, std::int64_t count, VocabRange range, const W* __restrict__ table,
                              std::int64_t words, W* __restrict__ out) {
  const std::int64_t total = count * words;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const std::int64_t row = i / words;
    const std::int64_t id = ids[row];
    out[i] = holds(range, id) ? table[(id - range.start) * words + (i - row * words)] : W{};
  }
}

template <typename T, typename Acc>
__global__ void scatter_add_kernel(const std::int32_t* __restrict__ ids, std::int64_t count, VocabRange range,
                                   const T* __restrict__ grad, std::int64_t row, Acc* table) {
  const std::int64_t total = count * row;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const std::int64_t r = i / row;
    const std::int64_t id = ids[r];
    if (holds(range, id)) atomic_add(&table[(id - range.start) * row + (i - r * row)], convert_to<Acc>(grad[i]));
  }
}

template <typename U>
struct PickAt {
  const std::int32_t* targets;
  VocabRange range;
  std::int64_t vocab_stride;
  const U* logits;
  U* out;
  template <typename Index>
  __device__ void operator()(Index, const Offsets<2>& o) const {
    const std::int64_t target = targets[o.at[0]];
    if (holds(range, target)) out[o.at[0]] = logits[o.at[1] + (target - range.start) * vocab_stride];
  }
};

template <typename T>
struct PickAddAt {
  const std::int32_t* targets;
  VocabRange range;
  std::int64_t vocab_stride;
  const T* grad;
  T* logits_grad;
  template <typename Index>
  __device__ void operator()(Index, const Offsets<2>& o) const {
    const std::int64_t target = targets[o.at[0]];
    if (holds(range, target)) atomic_add(&logits_grad[o.at[1] + (target - range.start) * vocab_stride], grad[o.at[0]]);
  }
};

std::size_t word_size(std::size_t row_bytes, const void* a, const void* b) {
  for (std::size_t w : {16, 8, 4, 2})
    if (row_bytes % w == 0 && reinterpret_cast<std::uintptr_t>(a) % w == 0 && reinterpret_cast<std::uintptr_t>(b) % w == 0) return w;
  return 1;
}

template <typename W>
void gather_words(cudaStream_t stream, const std::int32_t* ids, std::int64_t count, VocabRange range, const void* table,
                  std::size_t row_bytes, void* out) {
  const auto words = static_cast<std::int64_t>(row_bytes / sizeof(W));
  gather_kernel<W><<<detail::grid_for(static_cast<std::size_t>(count * words), kThreads), kThreads, 0, stream>>>(
      ids, count, range, static_cast<const W*>(table), words, static_cast<W*>(out));
  NAX_CUDA_CHECK_LAUNCH();
}

template <typename T, typename Acc>
void scatter_add(cudaStream_t stream, const std::int32_t* ids, std::int64_t count, VocabRange range, const T* grad, std::int64_t row,
                 Acc* table) {
  NAX_CUDA_CHECK(cudaMemsetAsync(table, 0, static_cast<std::size_t>(range.local * row) * sizeof(Acc), stream));
  if (count == 0) return;
  scatter_add_kernel<T, Acc><<<detail::grid_for(static_cast<std::size_t>(count * row), kThreads), kThreads, 0, stream>>>(
      ids, count, range, grad, row, table);
  NAX_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gather_rows(cudaStream_t stream, const std::int32_t* ids, std::int64_t count, VocabRange range, const void* table,
                 std::size_t row_bytes, void* out) {
  if (count <= 0 || row_bytes == 0) return;
  switch (word_size(row_bytes, table, out)) {
    case 16: return gather_words<uint4>(stream, ids, count, range, table, row_bytes, out);
    case 8: return gather_words<std::uint64_t>(stream, ids, count, range, table, row_bytes, out);
    case 4: return gather_words<std::uint32_t>(stream, ids, count, range, table, row_bytes, out);
    case 2: return gather_words<std::uint16_t>(stream, ids, count, range, table, row_bytes, out);
    default: return gather_words<std::uint8_t>(stream, ids, count, range, table, row_bytes, out);
  }
}

void scatter_add_rows(cudaStream_t stream, Workspace& workspace, DType dtype, const std::int32_t* ids, std::int64_t count,
                      VocabRange range, const void* grad, std::int64_t row, void* table_grad, const SumTree& tree) {
  if (tree.on) return tree_scatter_add_rows(stream, workspace, dtype, ids, count, range, grad, row, table_grad, tree);
  const std::int64_t elements = range.local * row;
  if (elements <= 0) return;
  detail::with_floating_dtype(dtype, "scatter_add_rows", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* g = static_cast<const T*>(grad);
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      // bf16 atomics would round every partial sum of a repeated id to 8 bits of mantissa.
      auto* sums = static_cast<float*>(workspace.get(static_cast<std::size_t>(elements) * sizeof(float)));
      scatter_add(stream, ids, count, range, g, row, sums);
      cast(stream, sums, static_cast<T*>(table_grad), static_cast<std::size_t>(elements));
    } else {
      scatter_add(stream, ids, count, range, g, row, static_cast<T*>(table_grad));
    }
  });
}

void pick_forward(cudaStream_t stream, const std::int32_t* targets, VocabRange range, const kernels::PickLayout& where,
                  const void* logits, std::size_t element_size, void* out) {
  const std::int64_t count = detail::element_count(where.layout);
  if (count <= 0) return;
  NAX_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<std::size_t>(count) * element_size, stream));
  const kernels::Layout<2> l = kernels::coalesce(where.layout);
  detail::with_element_size(element_size, "pick_forward", [&](auto tag) {
    using U = typename decltype(tag)::type;
    detail::for_each_strided(stream, l, PickAt<U>{targets, range, where.vocab_stride, static_cast<const U*>(logits), static_cast<U*>(out)});
  });
}

void pick_backward(cudaStream_t stream, DType dtype, const std::int32_t* targets, VocabRange range, const kernels::PickLayout& where,
                   const void* grad, void* logits_grad, std::int64_t logits_count) {
  detail::with_floating_dtype(dtype, "pick_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (logits_count > 0)
      NAX_CUDA_CHECK(cudaMemsetAsync(logits_grad, 0, static_cast<std::size_t>(logits_count) * sizeof(T), stream));
    const kernels::Layout<2> l = kernels::coalesce(where.layout);
    detail::for_each_strided(stream, l,
                             PickAddAt<T>{targets, range, where.vocab_stride, static_cast<const T*>(grad), static_cast<T*>(logits_grad)});
  });
}

}  // namespace nax::cuda
