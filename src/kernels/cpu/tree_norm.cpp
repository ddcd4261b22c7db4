// layer_norm_backward's dscale and dbias in deterministic mode (rows_tree on): per column, the
// SumTree over rows of the terms the default kernel adds, dy * xhat and dy with xhat = (x - mean)
// * rstd, each rounded before it is added (this file is compiled without floating-point
// contraction, so that no term fuses into its sum as a multiply-add).
#include <algorithm>
#include <vector>

#include "kernels/cpu/float_dispatch.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/sum_schedule.h"

namespace nax::cpu {

namespace {

// In chunks of columns: the leaves run along the rows of a chunk, dscale's sums then dbias's.
template <typename T>
void layer_norm_param_grads_in_tree(std::int64_t rows, std::int64_t n, const T* x, const T* mean, const T* rstd, const T* dy,
                                    T* dscale, T* dbias, const SumTree& tree) {
  const SumSchedule schedule = sum_schedule(rows, tree);
  const std::int64_t chunk = std::min<std::int64_t>(n, 256);
  std::vector<T> stack(static_cast<std::size_t>(std::max(1, schedule.depth) * 2 * chunk));
  for (std::int64_t c0 = 0; c0 < n; c0 += chunk) {
    const std::int64_t w = std::min(chunk, n - c0);
    sum_columns(schedule, 2 * w, stack.data(), [&](std::int64_t begin, std::int64_t length, T* acc) {
      for (std::int64_t r = begin; r < begin + length; ++r) {
        const T* xr = x + r * n + c0;
        const T* gr = dy + r * n + c0;
        const T mu = mean[r], rs = rstd[r];
        for (std::int64_t j = 0; j < w; ++j) {
          const T xhat = (xr[j] - mu) * rs;
          const T term = gr[j] * xhat;
          acc[j] = r == begin ? term : acc[j] + term;
          acc[w + j] = r == begin ? gr[j] : acc[w + j] + gr[j];
        }
      }
    });
    std::copy(stack.begin(), stack.begin() + w, dscale + c0);
    std::copy(stack.begin() + w, stack.begin() + 2 * w, dbias + c0);
  }
}

}  // namespace

void tree_layer_norm_param_grads(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* mean,
                                 const void* rstd, const void* dy, void* dscale, void* dbias, const SumTree& rows_tree) {
  with_floating_type(dtype, "layer_norm_backward", [&](auto zero) {
    using T = decltype(zero);
    layer_norm_param_grads_in_tree<T>(rows, n, static_cast<const T*>(x), static_cast<const T*>(mean), static_cast<const T*>(rstd),
                                      static_cast<const T*>(dy), static_cast<T*>(dscale), static_cast<T*>(dbias), rows_tree);
  });
}

}  // namespace nax::cpu
