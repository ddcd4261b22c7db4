#pragma once
// N-d iteration over strided operands (the Layout of nax/kernels/kernels.h): dimensions are coalesced
// where every operand's layout allows, then `row` is called once per innermost row with each
// operand's offset and stride.
#include <array>
#include <cstdint>

#include "nax/kernels/kernels.h"
#include "nax/core/error.h"

namespace nax::cpu {

using kernels::coalesce;
using kernels::Dims;
using kernels::kMaxRank;
using kernels::Layout;

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
