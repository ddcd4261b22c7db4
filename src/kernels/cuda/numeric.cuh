#pragma once
// Element types in device code: each storage type computes in its "compute type" (bf16 in f32,
// the others in themselves), with conversions that round once, to nearest even, into bf16; the
// reductions' combine and identity; and the host-side dispatch from a DType to a C++ type.
#include <cuda_bf16.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "nax/core/reduce_op.h"
#include "nax/core/dtype.h"
#include "nax/core/error.h"

namespace nax::cuda::detail {

template <typename T>
struct ComputeType {
  using type = T;
};
template <>
struct ComputeType<__nv_bfloat16> {
  using type = float;
};
template <typename T>
using compute_t = typename ComputeType<T>::type;

// Any of f32, f64, bf16, i32 to any other, as a C++ cast would (through f32 to and from bf16).
template <typename To, typename From>
__device__ __forceinline__ To convert_to(From x) {
  if constexpr (std::is_same_v<From, To>) {
    return x;
  } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return static_cast<To>(__bfloat162float(x));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(x));
  } else {
    return static_cast<To>(x);
  }
}

template <typename T>
__device__ __forceinline__ compute_t<T> widen(T x) {
  return convert_to<compute_t<T>>(x);
}

template <typename T>
__device__ __forceinline__ T narrow(compute_t<T> x) {
  return convert_to<T>(x);
}

template <typename C>
__device__ __forceinline__ bool is_nan(C x) {
  if constexpr (std::is_floating_point_v<C>) return x != x;
  else return false;
}

// The CPU's combine (kernels/cpu/reduce.cpp): a NaN on either side propagates through max and min.
template <ReduceOp op, typename C>
__device__ __forceinline__ C combine(C acc, C v) {
  if constexpr (op == ReduceOp::sum) return acc + v;
  if constexpr (op == ReduceOp::max) return v > acc || is_nan(v) ? v : acc;
  if constexpr (op == ReduceOp::min) return v < acc || is_nan(v) ? v : acc;
}

template <ReduceOp op, typename C>
__device__ __forceinline__ C identity() {
  if constexpr (op == ReduceOp::sum) return C{0};
  if constexpr (op == ReduceOp::max)
    return std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::lowest();
  if constexpr (op == ReduceOp::min)
    return std::numeric_limits<C>::has_infinity ? std::numeric_limits<C>::infinity() : std::numeric_limits<C>::max();
}

// --- host side ---

template <typename T>
struct TypeTag {
  using type = T;
};

// body(TypeTag<T>{}) with T the storage type of `dtype`: f32, f64, bf16 or i32.
template <typename Body>
void with_dtype(DType dtype, const char* kernel, Body&& body) {
  switch (dtype) {
    case DType::f32: return body(TypeTag<float>{});
    case DType::f64: return body(TypeTag<double>{});
    case DType::bf16: return body(TypeTag<__nv_bfloat16>{});
    case DType::i32: return body(TypeTag<std::int32_t>{});
  }
  fail(kernel, "unsupported dtype {}", dtype_name(dtype));
}

// The same for the kernels that compute only in floating point: f32, f64, bf16.
template <typename Body>
void with_floating_dtype(DType dtype, const char* kernel, Body&& body) {
  switch (dtype) {
    case DType::f32: return body(TypeTag<float>{});
    case DType::f64: return body(TypeTag<double>{});
    case DType::bf16: return body(TypeTag<__nv_bfloat16>{});
    default: fail(kernel, "computes in f32, f64 or bf16, got {}", dtype_name(dtype));
  }
}

// body(TypeTag<U>{}) with U an unsigned integer of `element_size` bytes (2, 4 or 8): for kernels
// that only move elements.
template <typename Body>
void with_element_size(std::size_t element_size, const char* kernel, Body&& body) {
  switch (element_size) {
    case 2: return body(TypeTag<std::uint16_t>{});
    case 4: return body(TypeTag<std::uint32_t>{});
    case 8: return body(TypeTag<std::uint64_t>{});
    default: fail(kernel, "unsupported element size {} (2, 4 or 8 bytes)", element_size);
  }
}

}  // namespace nax::cuda::detail
