// fill, copy, convert, where and scale: one thread per element, contiguous operands through the
// vectorised map (map.cuh), strided ones through per-element offsets (strided.cuh).
#include "kernels/cuda/layout.h"

#include <cstring>

#include "kernels/cuda/check.h"
#include "kernels/cuda/map.cuh"
#include "kernels/cuda/numeric.cuh"
#include "kernels/cuda/strided.cuh"

namespace nax::cuda {

namespace {

using detail::compute_t;
using detail::Offsets;

template <typename U>
struct Constant {
  U value;
  __device__ U operator()() const { return value; }
};

template <typename U>
struct CopyAt {
  const U* src;
  U* dst;
  template <typename Index>
  __device__ void operator()(Index, const Offsets<2>& o) const {
    dst[o.at[1]] = src[o.at[0]];
  }
};

template <typename To>
struct Convert {
  template <typename From>
  __device__ To operator()(From x) const {
    return detail::convert_to<To>(x);
  }
};

template <typename T>
__device__ __forceinline__ T select(T cond, T a, T b) {
  return detail::widen(cond) != compute_t<T>{0} ? a : b;
}

template <typename T>
struct Where {
  __device__ T operator()(T cond, T a, T b) const { return select(cond, a, b); }
};

template <typename T>
struct WhereAt {
  const T* cond;
  const T* a;
  const T* b;
  T* out;
  template <typename Index>
  __device__ void operator()(Index, const Offsets<4>& o) const {
    out[o.at[3]] = select(cond[o.at[0]], a[o.at[1]], b[o.at[2]]);
  }
};

template <typename T>
struct ScaleAt {
  T* data;
  compute_t<T> factor;
  template <typename Index>
  __device__ void operator()(Index, const Offsets<1>& o) const {
    T& x = data[o.at[0]];
    x = factor == compute_t<T>{0} ? detail::narrow<T>(0) : detail::narrow<T>(detail::widen(x) * factor);
  }
};

// The bytes of `value` stored as one element of dtype.
std::uint64_t element_bits(DType dtype, double value) {
  std::uint64_t bits = 0;
  switch (dtype) {
    case DType::f32: {
      const auto v = static_cast<float>(value);
      std::memcpy(&bits, &v, sizeof v);
      break;
    }
    case DType::f64: std::memcpy(&bits, &value, sizeof value); break;
    case DType::i32: {
      const auto v = static_cast<std::int32_t>(value);
      std::memcpy(&bits, &v, sizeof v);
      break;
    }
    case DType::bf16: bits = bf16(static_cast<float>(value)).bits; break;
  }
  return bits;
}

}  // namespace

void fill(cudaStream_t stream, DType dtype, void* out, std::int64_t n, double value) {
  if (n <= 0) return;
  const std::size_t size = dtype_size(dtype);
  const std::uint64_t bits = element_bits(dtype, value);
  if (bits == 0) {
    NAX_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<std::size_t>(n) * size, stream));
    return;
  }
  detail::with_element_size(size, "fill", [&](auto tag) {
    using U = typename decltype(tag)::type;
    detail::map(stream, static_cast<std::size_t>(n), Constant<U>{static_cast<U>(bits)}, static_cast<U*>(out));
  });
}

void copy(cudaStream_t stream, std::size_t element_size, const void* src, void* dst, const kernels::Layout<2>& layout) {
  detail::with_element_size(element_size, "copy", [](auto) {});  // the CPU's sizes, even where a memcpy would do
  const kernels::Layout<2> l = kernels::coalesce(layout);
  const std::int64_t count = detail::element_count(l);
  if (count == 0) return;
  if (detail::is_contiguous(l)) {
    NAX_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(count) * element_size, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  detail::with_element_size(element_size, "copy", [&](auto tag) {
    using U = typename decltype(tag)::type;
    detail::for_each_strided(stream, l, CopyAt<U>{static_cast<const U*>(src), static_cast<U*>(dst)});
  });
}

void convert(cudaStream_t stream, DType from, const void* src, DType to, void* dst, std::int64_t n) {
  if (n <= 0) return;
  if (from == to) {
    NAX_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * dtype_size(from), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  detail::with_dtype(from, "convert", [&](auto from_tag) {
    using From = typename decltype(from_tag)::type;
    detail::with_dtype(to, "convert", [&](auto to_tag) {
      using To = typename decltype(to_tag)::type;
      detail::map(stream, static_cast<std::size_t>(n), Convert<To>{}, static_cast<To*>(dst), static_cast<const From*>(src));
    });
  });
}

void where(cudaStream_t stream, DType dtype, const void* cond, const void* a, const void* b, void* out,
           const kernels::Layout<4>& layout) {
  const kernels::Layout<4> l = kernels::coalesce(layout);
  const std::int64_t count = detail::element_count(l);
  if (count == 0) return;
  detail::with_dtype(dtype, "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* c = static_cast<const T*>(cond);
    const auto* pa = static_cast<const T*>(a);
    const auto* pb = static_cast<const T*>(b);
    auto* po = static_cast<T*>(out);
    if (detail::is_contiguous(l)) detail::map(stream, static_cast<std::size_t>(count), Where<T>{}, po, c, pa, pb);
    else detail::for_each_strided(stream, l, WhereAt<T>{c, pa, pb, po});
  });
}

void scale(cudaStream_t stream, DType dtype, void* data, const kernels::Layout<1>& layout, double factor) {
  const kernels::Layout<1> l = kernels::coalesce(layout);
  if (detail::element_count(l) == 0) return;
  detail::with_floating_dtype(dtype, "scale", [&](auto tag) {
    using T = typename decltype(tag)::type;
    detail::for_each_strided(stream, l, ScaleAt<T>{static_cast<T*>(data), static_cast<compute_t<T>>(factor)});
  });
}

}  // namespace nax::cuda
