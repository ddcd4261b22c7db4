#include <algorithm>
#include <limits>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/kernels.h"

namespace nax::cpu {

namespace {

template <typename T>
T identity(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return T{0};
    case ReduceOp::max: return std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
    case ReduceOp::min: return std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::max();
  }
  return T{0};
}

template <typename T, ReduceOp op>
inline T combine(T acc, T v) {
  if constexpr (op == ReduceOp::sum) return acc + v;
  if constexpr (op == ReduceOp::max) return v > acc || v != v ? v : acc;  // NaN propagates
  if constexpr (op == ReduceOp::min) return v < acc || v != v ? v : acc;
}

template <typename T, ReduceOp op>
void reduce_rows(const T* in, T* out, std::int64_t out_count, const Layout<2>& layout) {
  std::fill(out, out + out_count, identity<T>(op));
  for_each_row<2>(layout, [&](const std::array<std::int64_t, 2>& off, std::int64_t n, const std::array<std::int64_t, 2>& s) {
    const T* pi = in + off[0];
    T* po = out + off[1];
    if (s[1] == 0) {  // the row is reduced into one output element
      T acc = *po;
      if (s[0] == 1) {
        for (std::int64_t i = 0; i < n; ++i) acc = combine<T, op>(acc, pi[i]);
      } else {
        for (std::int64_t i = 0; i < n; ++i) acc = combine<T, op>(acc, pi[i * s[0]]);
      }
      *po = acc;
    } else if (s[0] == 1 && s[1] == 1) {
      for (std::int64_t i = 0; i < n; ++i) po[i] = combine<T, op>(po[i], pi[i]);
    } else {
      for (std::int64_t i = 0; i < n; ++i) po[i * s[1]] = combine<T, op>(po[i * s[1]], pi[i * s[0]]);
    }
  });
}

template <typename T, ReduceOp op>
void combine_typed(T* dst, const T* a, const T* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = combine<T, op>(a[i], b[i]);
}

}  // namespace

void reduce(ReduceOp op, DType dtype, const void* in, void* out, std::int64_t out_count, const Layout<2>& layout,
            const SumTree& tree) {
  if (op == ReduceOp::sum && tree.on) return tree_sum(dtype, in, out, out_count, layout, tree);
  NAX_DISPATCH_NUMERIC(dtype, "reduce", T, {
    const T* pi = static_cast<const T*>(in);
    T* po = static_cast<T*>(out);
    switch (op) {
      case ReduceOp::sum: reduce_rows<T, ReduceOp::sum>(pi, po, out_count, layout); break;
      case ReduceOp::max: reduce_rows<T, ReduceOp::max>(pi, po, out_count, layout); break;
      case ReduceOp::min: reduce_rows<T, ReduceOp::min>(pi, po, out_count, layout); break;
    }
  });
}

void combine_into(ReduceOp op, DType dtype, void* dst, const void* a, const void* b, std::size_t n) {
  if (dtype == DType::bf16) {
    auto* d = static_cast<bf16*>(dst);
    const auto* x = static_cast<const bf16*>(a);
    const auto* y = static_cast<const bf16*>(b);
    for (std::size_t i = 0; i < n; ++i) {
      const float u = static_cast<float>(x[i]), v = static_cast<float>(y[i]);
      const float r = op == ReduceOp::sum   ? u + v
                      : op == ReduceOp::max ? combine<float, ReduceOp::max>(u, v)
                                            : combine<float, ReduceOp::min>(u, v);
      d[i] = bf16(r);
    }
    return;
  }
  NAX_DISPATCH_NUMERIC(dtype, "combine_into", T, {
    T* d = static_cast<T*>(dst);
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    switch (op) {
      case ReduceOp::sum:
        combine_typed<T, ReduceOp::sum>(d, x, y, n);
        break;
      case ReduceOp::max:
        combine_typed<T, ReduceOp::max>(d, x, y, n);
        break;
      case ReduceOp::min:
        combine_typed<T, ReduceOp::min>(d, x, y, n);
        break;
    }
  });
}

void accumulate(ReduceOp op, DType dtype, void* dst, const void* src, std::size_t n) {
  combine_into(op, dtype, dst, dst, src, n);
}

}  // namespace nax::cpu
