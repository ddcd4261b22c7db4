// GELU and where kernels: one fused loop each.
#include "kernels/cpu/pointwise.h"

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/float_dispatch.h"
#include "kernels/cpu/vector_math.h"

namespace nax::cpu {

namespace {

constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kCubic = 0.044715;

template <typename T>
void gelu_typed(std::int64_t n, const T* x, T* y) {
  const T c = static_cast<T>(kSqrt2OverPi), k = static_cast<T>(kCubic);
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    y[i] = T{0.5} * v * (T{1} + tanh_of(c * (v + k * v * v * v)));
  }
}

// d/dx of 0.5 x (1 + t), t = tanh(u), u = c (x + k x^3): 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2).
template <typename T>
void gelu_backward_typed(std::int64_t n, const T* x, const T* dy, T* dx) {
  const T c = static_cast<T>(kSqrt2OverPi), k = static_cast<T>(kCubic);
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T t = tanh_of(c * (v + k * v * v * v));
    const T slope = T{0.5} * (T{1} + t) + T{0.5} * v * (T{1} - t * t) * c * (T{1} + T{3} * k * v * v);
    dx[i] = dy[i] * slope;
  }
}

template <typename T>
void where_typed(const T* cond, const T* a, const T* b, T* out, const Layout<4>& layout) {
  for_each_row<4>(layout, [&](const std::array<std::int64_t, 4>& off, std::int64_t n, const std::array<std::int64_t, 4>& s) {
    const T* pc = cond + off[0];
    const T* pa = a + off[1];
    const T* pb = b + off[2];
    T* po = out + off[3];
    if (s[0] == 1 && s[1] == 1 && s[2] == 1 && s[3] == 1) {
      for (std::int64_t i = 0; i < n; ++i) po[i] = pc[i] != T{0} ? pa[i] : pb[i];
    } else {
      for (std::int64_t i = 0; i < n; ++i) po[i * s[3]] = pc[i * s[0]] != T{0} ? pa[i * s[1]] : pb[i * s[2]];
    }
  });
}

}  // namespace

void gelu_forward(DType dtype, std::int64_t n, const void* x, void* y) {
  with_floating_type(dtype, "gelu_forward", [&](auto zero) {
    using T = decltype(zero);
    gelu_typed<T>(n, static_cast<const T*>(x), static_cast<T*>(y));
  });
}

void gelu_backward(DType dtype, std::int64_t n, const void* x, const void* dy, void* dx) {
  with_floating_type(dtype, "gelu_backward", [&](auto zero) {
    using T = decltype(zero);
    gelu_backward_typed<T>(n, static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx));
  });
}

void where(DType dtype, const void* cond, const void* a, const void* b, void* out, const Layout<4>& layout) {
  NAX_DISPATCH_NUMERIC(dtype, "where", T,
                       where_typed<T>(static_cast<const T*>(cond), static_cast<const T*>(a), static_cast<const T*>(b),
                                      static_cast<T*>(out), layout));
}

}  // namespace nax::cpu
