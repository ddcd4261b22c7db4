#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/strided.h"
#include "kernels/cpu/vector_math.h"

namespace nax::cpu {

namespace {

template <typename T, BinaryOp op>
inline T apply(T a, T b) {
  if constexpr (op == BinaryOp::add) return a + b;
  if constexpr (op == BinaryOp::sub) return a - b;
  if constexpr (op == BinaryOp::mul) return a * b;
  if constexpr (op == BinaryOp::div) {
    if constexpr (std::is_integral_v<T>) return b == 0 ? T{0} : static_cast<T>(a / b);
    else return a / b;
  }
  if constexpr (op == BinaryOp::max) return a > b ? a : b;
  if constexpr (op == BinaryOp::min) return a < b ? a : b;
  if constexpr (op == BinaryOp::pow) return static_cast<T>(std::pow(a, b));
  if constexpr (op == BinaryOp::eq) return static_cast<T>(a == b);
  if constexpr (op == BinaryOp::ne) return static_cast<T>(a != b);
  if constexpr (op == BinaryOp::lt) return static_cast<T>(a < b);
  if constexpr (op == BinaryOp::le) return static_cast<T>(a <= b);
  if constexpr (op == BinaryOp::gt) return static_cast<T>(a > b);
  if constexpr (op == BinaryOp::ge) return static_cast<T>(a >= b);
}

// The inner row, specialised for the stride patterns the compiler can vectorise.
template <typename T, BinaryOp op>
void binary_rows(const T* a, const T* b, T* out, const Layout<3>& layout) {
  for_each_row<3>(layout, [&](const std::array<std::int64_t, 3>& off, std::int64_t n, const std::array<std::int64_t, 3>& s) {
    const T* pa = a + off[0];
    const T* pb = b + off[1];
    T* po = out + off[2];
    if (s[0] == 1 && s[1] == 1) {
      for (std::int64_t i = 0; i < n; ++i) po[i] = apply<T, op>(pa[i], pb[i]);
    } else if (s[0] == 1 && s[1] == 0) {
      const T vb = *pb;
      for (std::int64_t i = 0; i < n; ++i) po[i] = apply<T, op>(pa[i], vb);
    } else if (s[0] == 0 && s[1] == 1) {
      const T va = *pa;
      for (std::int64_t i = 0; i < n; ++i) po[i] = apply<T, op>(va, pb[i]);
    } else {
      for (std::int64_t i = 0; i < n; ++i) po[i] = apply<T, op>(pa[i * s[0]], pb[i * s[1]]);
    }
  });
}

// bf16 operands and result, computed in f32 a block of a row at a time: the bits of widening both
// to f32, the f32 op, and rounding its result once, without the f32 copies of whole tensors.
template <BinaryOp op>
void binary_rows_bf16(const std::uint16_t* a, const std::uint16_t* b, std::uint16_t* out, const Layout<3>& layout) {
  for_each_row<3>(layout, [&](const std::array<std::int64_t, 3>& off, std::int64_t n, const std::array<std::int64_t, 3>& s) {
    constexpr std::int64_t kBlock = 512;
    alignas(64) float fa[kBlock], fb[kBlock], fo[kBlock];
    for (std::int64_t begin = 0; begin < n; begin += kBlock) {
      const std::int64_t m = std::min(kBlock, n - begin);
      widen_bf16(a + off[0] + begin * s[0], s[0], fa, m);
      widen_bf16(b + off[1] + begin * s[1], s[1], fb, m);
      for (std::int64_t i = 0; i < m; ++i) fo[i] = apply<float, op>(fa[i], fb[i]);
      round_to_bf16(fo, out + off[2] + begin * s[2], s[2], m);
    }
  });
}

void binary_bf16(BinaryOp op, const std::uint16_t* a, const std::uint16_t* b, std::uint16_t* out, const Layout<3>& l) {
  switch (op) {
#define NAX_CASE(name) case BinaryOp::name: return binary_rows_bf16<BinaryOp::name>(a, b, out, l);
    NAX_CASE(add) NAX_CASE(sub) NAX_CASE(mul) NAX_CASE(div) NAX_CASE(max) NAX_CASE(min) NAX_CASE(pow)
    NAX_CASE(eq) NAX_CASE(ne) NAX_CASE(lt) NAX_CASE(le) NAX_CASE(gt) NAX_CASE(ge)
#undef NAX_CASE
  }
}

template <typename T>
void binary_typed(BinaryOp op, const T* a, const T* b, T* out, const Layout<3>& l) {
  switch (op) {
#define NAX_CASE(name) case BinaryOp::name: return binary_rows<T, BinaryOp::name>(a, b, out, l);
    NAX_CASE(add) NAX_CASE(sub) NAX_CASE(mul) NAX_CASE(div) NAX_CASE(max) NAX_CASE(min) NAX_CASE(pow)
    NAX_CASE(eq) NAX_CASE(ne) NAX_CASE(lt) NAX_CASE(le) NAX_CASE(gt) NAX_CASE(ge)
#undef NAX_CASE
  }
}

template <typename T>
void unary_typed(UnaryOp op, const T* in, T* out, std::int64_t n) {
  switch (op) {
    case UnaryOp::neg: for (std::int64_t i = 0; i < n; ++i) out[i] = -in[i]; break;
    case UnaryOp::abs: for (std::int64_t i = 0; i < n; ++i) out[i] = in[i] < 0 ? -in[i] : in[i]; break;
    case UnaryOp::square: for (std::int64_t i = 0; i < n; ++i) out[i] = in[i] * in[i]; break;
    case UnaryOp::exp: for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(std::exp(in[i])); break;
    case UnaryOp::log: for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(std::log(in[i])); break;
    case UnaryOp::sqrt: for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(std::sqrt(in[i])); break;
    case UnaryOp::rsqrt: for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(1 / std::sqrt(in[i])); break;
    case UnaryOp::tanh: for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(std::tanh(in[i])); break;
  }
}

}  // namespace

void binary(BinaryOp op, DType dtype, const void* a, const void* b, void* out, const Layout<3>& layout) {
  if (dtype == DType::bf16)
    return binary_bf16(op, static_cast<const std::uint16_t*>(a), static_cast<const std::uint16_t*>(b), static_cast<std::uint16_t*>(out),
                       layout);
  NAX_DISPATCH_NUMERIC(dtype, "binary", T,
                       binary_typed<T>(op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), layout));
}

void unary(UnaryOp op, DType dtype, const void* in, void* out, std::int64_t n) {
  NAX_DISPATCH_NUMERIC(dtype, "unary", T, unary_typed<T>(op, static_cast<const T*>(in), static_cast<T*>(out), n));
}

void fill(DType dtype, void* out, std::int64_t n, double value) {
  if (dtype == DType::bf16) {
    bf16 v(static_cast<float>(value));
    auto* p = static_cast<bf16*>(out);
    for (std::int64_t i = 0; i < n; ++i) p[i] = v;
    return;
  }
  NAX_DISPATCH_NUMERIC(dtype, "fill", T, {
    T v = static_cast<T>(value);
    T* p = static_cast<T*>(out);
    for (std::int64_t i = 0; i < n; ++i) p[i] = v;
  });
}

}  // namespace nax::cpu
