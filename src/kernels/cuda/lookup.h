#pragma once
// CUDA vocabulary lookups (lookup.cu): embedding rows by id and picked logits, and their scatters,
// with the vocab-parallel range of nax/kernels/kernels.h (ids outside it read as zero, scatter nothing).
// ids and targets are i32 in device memory.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/resources.h"
#include "nax/kernels/kernels.h"
#include "nax/core/dtype.h"
#include "nax/kernels/sum_tree.h"

namespace nax::cuda {

void gather_rows(cudaStream_t stream, const std::int32_t* ids, std::int64_t count, kernels::VocabRange range, const void* table,
                 std::size_t row_bytes, void* out);
// table_grad (range.local x row) = 0, then row ids[i] - start += grad row i, by atomic adds: f32
// and f64 in place, bf16 in an f32 copy in `workspace` rounded once at the end. With `tree.on`:
// tree_scatter_add_rows (no atomics, the tree's order).
void scatter_add_rows(cudaStream_t stream, Workspace& workspace, DType dtype, const std::int32_t* ids, std::int64_t count,
                      kernels::VocabRange range, const void* grad, std::int64_t row, void* table_grad, const SumTree& tree);
void pick_forward(cudaStream_t stream, const std::int32_t* targets, kernels::VocabRange range, const kernels::PickLayout& where,
                  const void* logits, std::size_t element_size, void* out);
void pick_backward(cudaStream_t stream, DType dtype, const std::int32_t* targets, kernels::VocabRange range,
                   const kernels::PickLayout& where, const void* grad, void* logits_grad, std::int64_t logits_count);

}  // namespace nax::cuda
