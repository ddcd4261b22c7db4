// Row kernels of the index ops: prefix sums and top-k per contiguous row (f32, f64, i32).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/kernels.h"

namespace nax::cpu {

namespace {

template <typename T>
void scan_rows_typed(std::int64_t rows, std::int64_t n, const T* x, T* y, bool exclusive, bool reverse) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* in = x + r * n;
    T* out = y + r * n;
    T total = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t i = reverse ? n - 1 - j : j;
      if (exclusive) {
        out[i] = total;
        total += in[i];
      } else {
        out[i] = total += in[i];
      }
    }
  }
}

template <typename T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(v);
  else return false;
}

// Row order of top_k: NaN first (the first NaN first), then larger (smaller) values, ties by the
// lower index.
template <typename T>
struct Before {
  const T* row;
  bool largest;
  bool operator()(std::int32_t a, std::int32_t b) const {
    const bool nan_a = is_nan(row[a]), nan_b = is_nan(row[b]);
    if (nan_a || nan_b) return nan_a && nan_b ? a < b : nan_a;
    if (row[a] != row[b]) return largest ? row[a] > row[b] : row[a] < row[b];
    return a < b;
  }
};

template <typename T>
void top_k_rows_typed(std::int64_t rows, std::int64_t n, std::int64_t k, bool largest, const T* x, T* values,
                      std::int32_t* indices) {
  std::vector<std::int32_t> order(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * n;
    const Before<T> before{row, largest};
    if (k == 1) {
      std::int32_t best = 0;
      for (std::int32_t i = 1; i < n; ++i)
        if (before(i, best)) best = i;
      values[r] = row[best];
      indices[r] = best;
      continue;
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
    for (std::int64_t j = 0; j < k; ++j) {
      values[r * k + j] = row[order[static_cast<std::size_t>(j)]];
      indices[r * k + j] = order[static_cast<std::size_t>(j)];
    }
  }
}

}  // namespace

void scan_rows(DType dtype, std::int64_t rows, std::int64_t n, const void* x, void* y, bool exclusive, bool reverse) {
  NAX_DISPATCH_NUMERIC(dtype, "scan_rows", T,
                       scan_rows_typed(rows, n, static_cast<const T*>(x), static_cast<T*>(y), exclusive, reverse));
}

void top_k_rows(DType dtype, std::int64_t rows, std::int64_t n, std::int64_t k, bool largest, const void* x, void* values,
                std::int32_t* indices) {
  NAX_DISPATCH_NUMERIC(dtype, "top_k_rows", T,
                       top_k_rows_typed(rows, n, k, largest, static_cast<const T*>(x), static_cast<T*>(values), indices));
}

}  // namespace nax::cpu
