#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vector_math.h"

namespace nax::cpu {

namespace {
template <typename T>
void copy_rows(const T* src, T* dst, const Layout<2>& layout) {
  for_each_row<2>(layout, [&](const std::array<std::int64_t, 2>& off, std::int64_t n, const std::array<std::int64_t, 2>& s) {
    const T* ps = src + off[0];
    T* pd = dst + off[1];
    if (s[0] == 1 && s[1] == 1) {
      std::memcpy(pd, ps, static_cast<std::size_t>(n) * sizeof(T));
    } else {
      for (std::int64_t i = 0; i < n; ++i) pd[i * s[1]] = ps[i * s[0]];
    }
  });
}
}  // namespace

void copy(std::size_t element_size, const void* src, void* dst, const Layout<2>& layout) {
  switch (element_size) {
    case 2: return copy_rows(static_cast<const std::uint16_t*>(src), static_cast<std::uint16_t*>(dst), layout);
    case 4: return copy_rows(static_cast<const std::uint32_t*>(src), static_cast<std::uint32_t*>(dst), layout);
    case 8: return copy_rows(static_cast<const std::uint64_t*>(src), static_cast<std::uint64_t*>(dst), layout);
    default: fail("copy", "unsupported element size {}", element_size);
  }
}

void stream_copy(void* dst, const void* src, std::size_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const std::size_t head = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  const std::size_t body = bytes / 64 * 64;
  for (std::size_t i = 0; i < body; i += 64)
    for (std::size_t j = 0; j < 64; j += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + j), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + j)));
  _mm_sfence();
  std::memcpy(d + body, s + body, bytes - body);
#else
  std::memcpy(dst, src, bytes);
#endif
}

namespace {
template <typename From, typename To>
void convert_typed(const From* src, To* dst, std::int64_t n) {
  if constexpr (std::is_same_v<From, float> && std::is_same_v<To, bf16>)
    return round_to_bf16(src, reinterpret_cast<std::uint16_t*>(dst), 1, n);
  if constexpr (std::is_same_v<From, bf16> && std::is_same_v<To, float>)
    return widen_bf16(reinterpret_cast<const std::uint16_t*>(src), 1, dst, n);
  for (std::int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<From, bf16>) dst[i] = static_cast<To>(static_cast<float>(src[i]));
    else if constexpr (std::is_same_v<To, bf16>) dst[i] = bf16(static_cast<float>(src[i]));
    else dst[i] = static_cast<To>(src[i]);
  }
}

template <typename From>
void convert_from(const From* src, DType to, void* dst, std::int64_t n) {
  switch (to) {
    case DType::f32: return convert_typed(src, static_cast<float*>(dst), n);
    case DType::f64: return convert_typed(src, static_cast<double*>(dst), n);
    case DType::i32: return convert_typed(src, static_cast<std::int32_t*>(dst), n);
    case DType::bf16: return convert_typed(src, static_cast<bf16*>(dst), n);
  }
}
}  // namespace

void convert(DType from, const void* src, DType to, void* dst, std::int64_t n) {
  switch (from) {
    case DType::f32: return convert_from(static_cast<const float*>(src), to, dst, n);
    case DType::f64: return convert_from(static_cast<const double*>(src), to, dst, n);
    case DType::i32: return convert_from(static_cast<const std::int32_t*>(src), to, dst, n);
    case DType::bf16: return convert_from(static_cast<const bf16*>(src), to, dst, n);
  }
}

}  // namespace nax::cpu
