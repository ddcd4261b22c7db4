#pragma once
// CPU kernels of the vocabulary lookups: embedding rows and picked logits. The caller's block of
// the vocabulary is [start, start + local); ids outside it read as zero and scatter nothing (the
// vocab-parallel form: another device holds those rows). Ids are checked by the op layer. Each
// kernel computes what the Kernels method of its name says (nax/kernels/kernels.h).
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/strided.h"
#include "nax/core/dtype.h"
#include "nax/kernels/sum_tree.h"

namespace nax::cpu {

using kernels::VocabRange;

void gather_rows(const std::int32_t* ids, std::int64_t count, VocabRange range, const void* table, std::size_t row_bytes,
                 void* out);

void scatter_add_rows(DType dtype, const std::int32_t* ids, std::int64_t count, VocabRange range, const void* grad,
                      std::int64_t row, void* table_grad, const SumTree& tree);
// The same with `tree.on` (nax/kernels/kernels.h says the order; absent terms are +0).
void tree_scatter_add_rows(DType dtype, const std::int32_t* ids, std::int64_t count, VocabRange range, const void* grad,
                           std::int64_t row, void* table_grad, const SumTree& tree);

using kernels::PickLayout;

void pick_forward(const std::int32_t* targets, VocabRange range, const PickLayout& where, const void* logits,
                  std::size_t element_size, void* out);

void pick_backward(DType dtype, const std::int32_t* targets, VocabRange range, const PickLayout& where, const void* grad,
                   void* logits_grad, std::int64_t logits_count);

}  // namespace nax::cpu
