#pragma once
// Element types. bf16 is a storage type on the CPU: kernels compute it in f32 (load, compute, round).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace nax {

enum class DType { f32, f64, bf16, i32 };

std::size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
DType parse_dtype(std::string_view name);
bool is_floating(DType dtype);

// The bf16 bits of the f32 with bits `u`: rounded to nearest even, a NaN kept a (quiet) NaN.
// Branch-free, so that loops of it vectorise (the CPU kernels' conversions use it).
inline std::uint16_t bf16_bits_of(std::uint32_t u) {
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

// Brain float 16: the upper half of an IEEE f32, rounded to nearest even.
struct bf16 {
  std::uint16_t bits = 0;

  bf16() = default;
  explicit bf16(float value) {
    std::uint32_t u;
    std::memcpy(&u, &value, sizeof u);
    bits = bf16_bits_of(u);
  }
  explicit operator float() const {
    std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &u, sizeof value);
    return value;
  }
};

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::f32; }
template <>
constexpr DType dtype_of<double>() { return DType::f64; }
template <>
constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <>
constexpr DType dtype_of<std::int32_t>() { return DType::i32; }

}  // namespace nax
