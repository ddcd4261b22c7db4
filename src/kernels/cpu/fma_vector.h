#pragma once
// The widest vector of f32 or f64 this build's target has, with the few operations the tree GEMM
// needs. Every lane computes exactly what the scalar std::fma and + would (a fused multiply-add
// rounds once), so results do not depend on which width a build or a loop's tail uses.
#include <cmath>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace nax::cpu {

template <typename T>
struct FmaVector;

#if defined(__AVX512F__)

template <>
struct FmaVector<float> {
  using V = __m512;
  static constexpr int width = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V splat(float x) { return _mm512_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
};

template <>
struct FmaVector<double> {
  using V = __m512d;
  static constexpr int width = 8;
  static V zero() { return _mm512_setzero_pd(); }
  static V load(const double* p) { return _mm512_loadu_pd(p); }
  static V splat(double x) { return _mm512_set1_pd(x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  static V add(V a, V b) { return _mm512_add_pd(a, b); }
  static void store(double* p, V v) { _mm512_storeu_pd(p, v); }
};

#elif defined(__AVX2__) && defined(__FMA__)

template <>
struct FmaVector<float> {
  using V = __m256;
  static constexpr int width = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V splat(float x) { return _mm256_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
};

template <>
struct FmaVector<double> {
  using V = __m256d;
  static constexpr int width = 4;
  static V zero() { return _mm256_setzero_pd(); }
  static V load(const double* p) { return _mm256_loadu_pd(p); }
  static V splat(double x) { return _mm256_set1_pd(x); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  static V add(V a, V b) { return _mm256_add_pd(a, b); }
  static void store(double* p, V v) { _mm256_storeu_pd(p, v); }
};

#else

// No vector FMA in this target: one lane, std::fma.
template <typename T>
struct FmaVector {
  using V = T;
  static constexpr int width = 1;
  static V zero() { return T(0); }
  static V load(const T* p) { return *p; }
  static V splat(T x) { return x; }
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }
  static V add(V a, V b) { return a + b; }
  static void store(T* p, V v) { *p = v; }
};

#endif

}  // namespace nax::cpu
