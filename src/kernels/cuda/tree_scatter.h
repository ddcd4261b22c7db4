#pragma once
// Deterministic mode's scatter_add_rows on CUDA (kernels.h): table_grad (range.local x row) = +0,
// then each picked table row is the tree sum over i in [0, count) of (grad row i where ids[i]
// picks it, else +0), the CPU's bits for f32 and f64 (bf16 sums in f32, rounded once). No atomics:
// the ids are sorted (stably, with their positions), then one block per picked row walks its
// positions in order, every thread one column, skipping the subtrees that pick nothing.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/resources.h"
#include "nax/core/dtype.h"
#include "nax/kernels/sum_tree.h"
#include "nax/kernels/kernels.h"

namespace nax::cuda {

void tree_scatter_add_rows(cudaStream_t stream, Workspace& workspace, DType dtype, const std::int32_t* ids, std::int64_t count,
                           kernels::VocabRange range, const void* grad, std::int64_t row, void* table_grad, const SumTree& tree);

}  // namespace nax::cuda
