// Row kernels of layer_norm and softmax. Row sums are kept in kLanes independent partial sums:
// without -ffast-math the compiler may not reorder one running sum, but it vectorises lanes.
#include "kernels/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/cpu/float_dispatch.h"
#include "kernels/cpu/vector_math.h"

namespace nax::cpu {

namespace {

template <typename T>
void layer_norm_rows(std::int64_t rows, std::int64_t n, const T* x, const T* scale, const T* bias, T eps, T* y, T* mean,
                     T* rstd) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    // Sums of x - x[0] rather than of x: one pass, without the cancellation of raw sums of squares
    // when the mean is large against the spread.
    const T shift = xr[0];
    const auto [s, ss] = lane_sums<T>(n, [xr, shift](std::int64_t i) {
      const T d = xr[i] - shift;
      return std::pair<T, T>{d, d * d};
    });
    const T shifted_mean = s / static_cast<T>(n);
    const T var = std::max(T{0}, ss / static_cast<T>(n) - shifted_mean * shifted_mean);
    const T mu = shift + shifted_mean, rs = T{1} / std::sqrt(var + eps);
    mean[r] = mu;
    rstd[r] = rs;
    for (std::int64_t i = 0; i < n; ++i) yr[i] = (xr[i] - mu) * rs * scale[i] + bias[i];
  }
}

// With xhat = (x - mean) * rstd and h = dy * scale: dx = rstd * (h - mean(h) - xhat * mean(h * xhat)).
// kSumParams: dscale and dbias summed over rows in row order, in the same pass.
// The outputs are fresh buffers (__restrict: too many pointers for the compiler's alias checks).
template <typename T, bool kSumParams>
void layer_norm_backward_rows(std::int64_t rows, std::int64_t n, const T* x, const T* scale, const T* mean, const T* rstd,
                              const T* dy, T* __restrict dx, T* __restrict dscale, T* __restrict dbias) {
  if constexpr (kSumParams) {
    std::fill(dscale, dscale + n, T{0});
    std::fill(dbias, dbias + n, T{0});
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    const T* gr = dy + r * n;
    T* dxr = dx + r * n;
    const T mu = mean[r], rs = rstd[r];
    const auto [h_sum, hx_sum] = lane_sums<T>(n, [=](std::int64_t i) {
      const T h = gr[i] * scale[i];
      return std::pair<T, T>{h, h * (xr[i] - mu) * rs};
    });
    const T h_mean = h_sum / static_cast<T>(n), hx_mean = hx_sum / static_cast<T>(n);
    for (std::int64_t i = 0; i < n; ++i) {
      const T xhat = (xr[i] - mu) * rs;
      dxr[i] = rs * (gr[i] * scale[i] - h_mean - xhat * hx_mean);
      if constexpr (kSumParams) {
        dscale[i] += gr[i] * xhat;
        dbias[i] += gr[i];
      }
    }
  }
}

template <typename T>
void softmax_rows(std::int64_t rows, std::int64_t n, const T* x, T* y, bool log) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    const T m = lane_max(xr, n);
    for (std::int64_t i = 0; i < n; ++i) yr[i] = exp_of(xr[i] - m);
    const T total = lane_sum<T>(n, [yr](std::int64_t i) { return yr[i]; });
    if (log) {
      const T lse = m + std::log(total);
      for (std::int64_t i = 0; i < n; ++i) yr[i] = xr[i] - lse;
    } else {
      const T inverse = T{1} / total;
      for (std::int64_t i = 0; i < n; ++i) yr[i] *= inverse;
    }
  }
}

template <typename T>
void softmax_backward_rows(std::int64_t rows, std::int64_t n, const T* y, const T* dy, T* dx, bool log) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * n;
    const T* gr = dy + r * n;
    T* dxr = dx + r * n;
    if (log) {
      const T g_sum = lane_sum<T>(n, [gr](std::int64_t i) { return gr[i]; });
      for (std::int64_t i = 0; i < n; ++i) dxr[i] = gr[i] - exp_of(yr[i]) * g_sum;
    } else {
      const T gy_sum = lane_sum<T>(n, [gr, yr](std::int64_t i) { return gr[i] * yr[i]; });
      for (std::int64_t i = 0; i < n; ++i) dxr[i] = yr[i] * (gr[i] - gy_sum);
    }
  }
}

}  // namespace

void layer_norm_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale, const void* bias,
                        double eps, void* y, void* mean, void* rstd) {
  with_floating_type(dtype, "layer_norm_forward", [&](auto zero) {
    using T = decltype(zero);
    layer_norm_rows<T>(rows, n, static_cast<const T*>(x), static_cast<const T*>(scale), static_cast<const T*>(bias),
                       static_cast<T>(eps), static_cast<T*>(y), static_cast<T*>(mean), static_cast<T*>(rstd));
  });
}

void layer_norm_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale, const void* mean,
                         const void* rstd, const void* dy, void* dx, void* dscale, void* dbias, const SumTree& rows_tree) {
  with_floating_type(dtype, "layer_norm_backward", [&](auto zero) {
    using T = decltype(zero);
    const auto* xt = static_cast<const T*>(x);
    const auto* mt = static_cast<const T*>(mean);
    const auto* rt = static_cast<const T*>(rstd);
    const auto* gt = static_cast<const T*>(dy);
    if (!rows_tree.on)
      return layer_norm_backward_rows<T, true>(rows, n, xt, static_cast<const T*>(scale), mt, rt, gt, static_cast<T*>(dx),
                                               static_cast<T*>(dscale), static_cast<T*>(dbias));
    layer_norm_backward_rows<T, false>(rows, n, xt, static_cast<const T*>(scale), mt, rt, gt, static_cast<T*>(dx), nullptr, nullptr);
    tree_layer_norm_param_grads(dtype, rows, n, x, mean, rstd, dy, dscale, dbias, rows_tree);
  });
}

void softmax_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, void* y, bool log) {
  with_floating_type(dtype, "softmax_forward", [&](auto zero) {
    using T = decltype(zero);
    softmax_rows<T>(rows, n, static_cast<const T*>(x), static_cast<T*>(y), log);
  });
}

void softmax_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* y, const void* dy, void* dx, bool log) {
  with_floating_type(dtype, "softmax_backward", [&](auto zero) {
    using T = decltype(zero);
    softmax_backward_rows<T>(rows, n, static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), log);
  });
}

}  // namespace nax::cpu
