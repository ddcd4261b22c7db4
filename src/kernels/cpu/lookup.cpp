// Embedding and pick kernels: row copies and element gathers by id, and their scatters.
#include "kernels/cpu/lookup.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/float_dispatch.h"

namespace nax::cpu {

namespace {

template <typename T>
void scatter_add_typed(const std::int32_t* ids, std::int64_t count, VocabRange range, const T* grad, std::int64_t row,
                       T* table_grad) {
  std::fill(table_grad, table_grad + range.local * row, T{0});
  for (std::int64_t i = 0; i < count; ++i) {
    if (!range.holds(ids[i])) continue;
    T* dst = table_grad + (ids[i] - range.start) * row;
    const T* src = grad + i * row;
    for (std::int64_t j = 0; j < row; ++j) dst[j] += src[j];
  }
}

// visit(target offset, logits offset of the picked element) for every target in the range.
template <typename Visit>
void for_each_pick(const std::int32_t* targets, VocabRange range, const PickLayout& where, Visit&& visit) {
  for_each_row<2>(where.layout, [&](const std::array<std::int64_t, 2>& off, std::int64_t n, const std::array<std::int64_t, 2>& s) {
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t t = off[0] + i * s[0];
      if (range.holds(targets[t])) visit(t, off[1] + i * s[1] + (targets[t] - range.start) * where.vocab_stride);
    }
  });
}

}  // namespace

void gather_rows(const std::int32_t* ids, std::int64_t count, VocabRange range, const void* table, std::size_t row_bytes,
                 void* out) {
  const auto* src = static_cast<const char*>(table);
  auto* dst = static_cast<char*>(out);
  for (std::int64_t i = 0; i < count; ++i, dst += row_bytes) {
    if (range.holds(ids[i])) std::memcpy(dst, src + static_cast<std::size_t>(ids[i] - range.start) * row_bytes, row_bytes);
    else std::memset(dst, 0, row_bytes);  // all-zero bits are 0 in every dtype
  }
}

void scatter_add_rows(DType dtype, const std::int32_t* ids, std::int64_t count, VocabRange range, const void* grad,
                      std::int64_t row, void* table_grad, const SumTree& tree) {
  if (tree.on) return tree_scatter_add_rows(dtype, ids, count, range, grad, row, table_grad, tree);
  with_floating_type(dtype, "scatter_add_rows", [&](auto zero) {
    using T = decltype(zero);
    scatter_add_typed<T>(ids, count, range, static_cast<const T*>(grad), row, static_cast<T*>(table_grad));
  });
}

void pick_forward(const std::int32_t* targets, VocabRange range, const PickLayout& where, const void* logits,
                  std::size_t element_size, void* out) {
  const auto* src = static_cast<const char*>(logits);
  auto* dst = static_cast<char*>(out);
  std::int64_t count = 1;
  for (int d = 0; d < where.layout.rank; ++d) count *= where.layout.sizes[static_cast<std::size_t>(d)];
  std::memset(dst, 0, static_cast<std::size_t>(count) * element_size);
  for_each_pick(targets, range, where, [&](std::int64_t t, std::int64_t at) {
    std::memcpy(dst + static_cast<std::size_t>(t) * element_size, src + static_cast<std::size_t>(at) * element_size, element_size);
  });
}

void pick_backward(DType dtype, const std::int32_t* targets, VocabRange range, const PickLayout& where, const void* grad,
                   void* logits_grad, std::int64_t logits_count) {
  with_floating_type(dtype, "pick_backward", [&](auto zero) {
    using T = decltype(zero);
    const T* g = static_cast<const T*>(grad);
    T* dl = static_cast<T*>(logits_grad);
    std::fill(dl, dl + logits_count, T{0});
    for_each_pick(targets, range, where, [&](std::int64_t t, std::int64_t at) { dl[at] += g[t]; });
  });
}

}  // namespace nax::cpu
