#pragma once
// N-d iteration over strided operands: dimensions are coalesced where every operand's layout
// allows, then `row` is called once per innermost row with each operand's offset and stride.
#include <array>
#include <cstdint>

#include "nax/core/error.h"

namespace nax::cpu {

inline constexpr int kMaxRank = 16;
using Dims = std::array<std::int64_t, kMaxRank>;

template <int K>
struct Layout {
  int rank = 0;
  Dims sizes{};
  std::array<Dims, K> strides{};
};

// Drops size-1 dimensions and merges neighbours that are contiguous for every operand.
template <int K>
Layout<K> coalesce(Layout<K> in) {
  Layout<K> out;
  for (int d = 0; d < in.rank; ++d) {
    if (in.sizes[d] == 1) continue;
    if (out.rank > 0) {
      bool mergeable = true;
      for (int k = 0; k < K; ++k)
        if (out.strides[k][out.rank - 1] != in.strides[k][d] * in.sizes[d]) mergeable = false;
      if (mergeable) {
        out.sizes[out.rank - 1] *= in.sizes[d];
        for (int k = 0; k < K; ++k) out.strides[k][out.rank - 1] = in.strides[k][d];
        continue;
      }
    }
    out.sizes[out.rank] = in.sizes[d];
    for (int k = 0; k < K; ++k) out.strides[k][out.rank] = in.strides[k][d];
    ++out.rank;
  }
  if (out.rank == 0) {  // a single element
    out.rank = 1;
    out.sizes[0] = 1;
    for (int k = 0; k < K; ++k) out.strides[k][0] = 1;
  }
  return out;
}

// row(offsets, n, inner_strides) for every innermost row, offsets in elements.
template <int K, typename Row>
void for_each_row(const Layout<K>& layout_in, Row&& row) {
  Layout<K> l = coalesce(layout_in);
  for (int d = 0; d < l.rank; ++d)
    if (l.sizes[d] == 0) return;
  const int inner = l.rank - 1;
  std::array<std::int64_t, K> inner_strides;
  for (int k = 0; k < K; ++k) inner_strides[k] = l.strides[k][inner];
  Dims index{};
  std::array<std::int64_t, K> offsets{};
  while (true) {
    row(offsets, l.sizes[inner], inner_strides);
    int d = inner - 1;
    for (; d >= 0; --d) {
      ++index[d];
      for (int k = 0; k < K; ++k) offsets[k] += l.strides[k][d];
      if (index[d] < l.sizes[d]) break;
      for (int k = 0; k < K; ++k) offsets[k] -= l.strides[k][d] * l.sizes[d];
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace nax::cpu
