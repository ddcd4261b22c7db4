// binary, unary and accumulate: one thread per element; the op is a kernel argument (one branch,
// the same for every thread) rather than a template parameter, which keeps the number of
// instantiations down at no measurable cost for kernels bound by memory.
#include "kernels/cuda/binary.h"

#include <type_traits>

#include "kernels/cuda/map.cuh"
#include "kernels/cuda/numeric.cuh"
#include "kernels/cuda/strided.cuh"

namespace nax::cuda {

namespace {

using detail::compute_t;
using detail::narrow;
using detail::Offsets;
using detail::widen;
using kernels::BinaryOp;
using kernels::UnaryOp;

__device__ __forceinline__ float power(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double power(double a, double b) { return pow(a, b); }
// As the CPU's std::pow on ints, the result truncated; by squaring, so that exact powers stay
// exact (the device's pow may miss them by an ulp, and truncation would turn 27 into 26).
__device__ __forceinline__ std::int32_t power(std::int32_t a, std::int32_t b) {
  if (b < 0) return static_cast<std::int32_t>(pow(static_cast<double>(a), static_cast<double>(b)));  // |result| <= 1 but for a = 0
  double result = 1, base = a;
  for (std::int32_t e = b; e > 0; e >>= 1, base *= base)
    if (e & 1) result *= base;
  return static_cast<std::int32_t>(result);
}

template <typename C>
__device__ __forceinline__ C divide(C a, C b) {
  if constexpr (std::is_integral_v<C>) return b == 0 ? C{0} : static_cast<C>(a / b);
  else return a / b;
}

template <typename C>
__device__ __forceinline__ C truth(bool condition) {
  return condition ? C{1} : C{0};
}

template <typename T>
__device__ T apply(BinaryOp op, T a_stored, T b_stored) {
  using C = compute_t<T>;
  const C a = widen(a_stored), b = widen(b_stored);
  switch (op) {
    case BinaryOp::add: return narrow<T>(a + b);
    case BinaryOp::sub: return narrow<T>(a - b);
    case BinaryOp::mul: return narrow<T>(a * b);
    case BinaryOp::div: return narrow<T>(divide(a, b));
    case BinaryOp::max: return a > b ? a_stored : b_stored;
    case BinaryOp::min: return a < b ? a_stored : b_stored;
    case BinaryOp::pow: return narrow<T>(power(a, b));
    case BinaryOp::eq: return narrow<T>(truth<C>(a == b));
    case BinaryOp::ne: return narrow<T>(truth<C>(a != b));
    case BinaryOp::lt: return narrow<T>(truth<C>(a < b));
    case BinaryOp::le: return narrow<T>(truth<C>(a <= b));
    case BinaryOp::gt: return narrow<T>(truth<C>(a > b));
    case BinaryOp::ge: return narrow<T>(truth<C>(a >= b));
  }
  return a_stored;
}

template <typename T>
struct Binary {
  BinaryOp op;
  __device__ T operator()(T a, T b) const { return apply(op, a, b); }
};

template <typename T>
struct BinaryAt {
  BinaryOp op;
  const T* a;
  const T* b;
  T* out;
  template <typename Index>
  __device__ void operator()(Index, const Offsets<3>& o) const {
    out[o.at[2]] = apply(op, a[o.at[0]], b[o.at[1]]);
  }
};

// The functions without an exact form, in f32 or f64.
__device__ __forceinline__ float transcendental(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::exp: return expf(x);
    case UnaryOp::log: return logf(x);
    case UnaryOp::sqrt: return sqrtf(x);
    case UnaryOp::rsqrt: return rsqrtf(x);
    case UnaryOp::tanh: return tanhf(x);
    default: return x;
  }
}
__device__ __forceinline__ double transcendental(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::exp: return exp(x);
    case UnaryOp::log: return log(x);
    case UnaryOp::sqrt: return sqrt(x);
    case UnaryOp::rsqrt: return 1.0 / sqrt(x);  // as the CPU: rounded twice, so that i32 results truncate alike
    case UnaryOp::tanh: return tanh(x);
    default: return x;
  }
}

template <typename T>
struct Unary {
  UnaryOp op;
  __device__ T operator()(T stored) const {
    using C = compute_t<T>;
    using Real = std::conditional_t<std::is_integral_v<C>, double, C>;  // i32: in f64, then truncated, as on the CPU
    const C x = widen(stored);
    switch (op) {
      case UnaryOp::neg: return narrow<T>(-x);
      case UnaryOp::abs: return narrow<T>(x < C{0} ? -x : x);
      case UnaryOp::square: return narrow<T>(x * x);
      default: return narrow<T>(static_cast<C>(transcendental(op, static_cast<Real>(x))));
    }
  }
};

template <typename T>
struct Accumulate {
  ReduceOp op;
  __device__ T operator()(T dst, T src) const {
    using C = compute_t<T>;
    const C a = widen(dst), b = widen(src);
    switch (op) {
      case ReduceOp::sum: return narrow<T>(detail::combine<ReduceOp::sum>(a, b));
      case ReduceOp::max: return narrow<T>(detail::combine<ReduceOp::max>(a, b));
      case ReduceOp::min: return narrow<T>(detail::combine<ReduceOp::min>(a, b));
    }
    return dst;
  }
};

}  // namespace

void binary(cudaStream_t stream, BinaryOp op, DType dtype, const void* a, const void* b, void* out, const kernels::Layout<3>& layout) {
  const kernels::Layout<3> l = kernels::coalesce(layout);
  const std::int64_t count = detail::element_count(l);
  if (count == 0) return;
  detail::with_dtype(dtype, "binary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* pa = static_cast<const T*>(a);
    const auto* pb = static_cast<const T*>(b);
    auto* po = static_cast<T*>(out);
    if (detail::is_contiguous(l)) detail::map(stream, static_cast<std::size_t>(count), Binary<T>{op}, po, pa, pb);
    else detail::for_each_strided(stream, l, BinaryAt<T>{op, pa, pb, po});
  });
}

void unary(cudaStream_t stream, UnaryOp op, DType dtype, const void* in, void* out, std::int64_t n) {
  if (n <= 0) return;
  detail::with_dtype(dtype, "unary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    detail::map(stream, static_cast<std::size_t>(n), Unary<T>{op}, static_cast<T*>(out), static_cast<const T*>(in));
  });
}

void accumulate(cudaStream_t stream, ReduceOp op, DType dtype, void* dst, const void* src, std::size_t n) {
  if (n == 0) return;
  detail::with_dtype(dtype, "accumulate", [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto* d = static_cast<T*>(dst);
    detail::map(stream, n, Accumulate<T>{op}, d, static_cast<const T*>(d), static_cast<const T*>(src));
  });
}

}  // namespace nax::cuda
