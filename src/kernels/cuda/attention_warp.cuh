#pragma once
// The warp-level tile code that every pass of the fused causal attention shares: the forward
// (attention_forward.cuh), the backward (attention_backward.cuh) and deterministic mode's dq
// (attention_deterministic_dq.cuh), all instantiated and launched by attention.cu.
//
// Every warp computes 16-row tiles in the register layout of the mma.sync m16n8k16 accumulator
// ("C layout": lane = 4 g + t holds, for each 8-column block j, rows g and g + 8 at columns
// 8 j + 2 t and 8 j + 2 t + 1, as acc[j][0..1] and acc[j][2..3]). The tile products go through
// Mma<T>: tensor cores (ldmatrix + mma.sync, bf16 in, f32 accumulate) for bf16, plain FMAs in
// the same register layout for f32, so that everything around them (masking, online softmax,
// the backward's elementwise steps) is one code for both.
#include <cuda_bf16.h>
#include <vector_types.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/attention_launch.h"

namespace nax::cuda::attention_detail {

using bf16_t = __nv_bfloat16;

#define NAX_ATT_FN __device__ __forceinline__

NAX_ATT_FN void block_sync() { __syncthreads(); }
NAX_ATT_FN float shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
NAX_ATT_FN float shfl_idx(float v, int source) { return __shfl_sync(0xffffffffu, v, source); }

// Four 8x8 b16 matrices: lane 8 i + r gives the address of row r of matrix i (16 bytes, 16-byte
// aligned); lane 4 g + t receives, in register i, elements (g, 2t) and (g, 2t + 1) of matrix i
// (.trans: elements (2t, g) and (2t + 1, g)), the lower column in the lower half.
NAX_ATT_FN void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
NAX_ATT_FN void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* smem) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d (16x8, C layout) += A (16x16) B (16x8). A registers: (g, 2t..), (g + 8, 2t..), (g, 2t + 8..),
// (g + 8, 2t + 8..); B registers: (k = 2t.., n = g), (k = 2t + 8.., n = g).
NAX_ATT_FN void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// p[0] += x, p[1] += y; p 8-byte aligned, global memory.
NAX_ATT_FN void atomic_add2(float* p, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(x, y));
#else
  atomicAdd(p, x);
  atomicAdd(p + 1, y);
#endif
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

NAX_ATT_FN int imin(int a, int b) { return a < b ? a : b; }
NAX_ATT_FN int imax(int a, int b) { return a > b ? a : b; }

NAX_ATT_FN float to_float(float x) { return x; }
NAX_ATT_FN float to_float(bf16_t x) { return __bfloat162float(x); }
template <typename T>
NAX_ATT_FN T from_float(float x);
template <>
NAX_ATT_FN float from_float<float>(float x) { return x; }
template <>
NAX_ATT_FN bf16_t from_float<bf16_t>(float x) { return __float2bfloat16_rn(x); }

// Two floats as bf16 in one register, `lo` in the lower half (the lower column of an mma operand).
NAX_ATT_FN std::uint32_t pack_bf16(float lo, float hi) {
  const std::uint32_t l = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
  const std::uint32_t h = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
  return l | (h << 16);
}

template <typename T>
struct Bits;
template <>
struct Bits<float> {
  using type = std::uint32_t;
};
template <>
struct Bits<bf16_t> {
  using type = std::uint16_t;
};

// Element offset of operand `op`'s matrix for batch `local` of this launch (global index b).
NAX_ATT_FN std::int64_t batch_offset(const Params& p, int op, int local, std::int64_t b) {
  const BatchMap& m = p.map;
  if (m.table) return m.offsets[op][local];
  return m.base[op] + (b % m.inner[op]) * m.inner_stride[op] + (b / m.inner[op]) * m.outer_stride[op];
}

// tile[r][c] (row stride ld) = src[r * stride + c] for r < rows and c < head_dim, 0 elsewhere in
// the ROWS x D tile; 16 bytes per thread and step. `vector`: src, stride and head_dim allow
// 16-byte loads.
template <typename T, int ROWS, int D, int THREADS>
NAX_ATT_FN void load_tile(T* tile, int ld, const T* src, std::int64_t stride, int rows, int head_dim, bool vector, int tid) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));
  constexpr int kChunksPerRow = D / kPer;
  using B = typename Bits<T>::type;
#pragma unroll 4
  for (int i = tid; i < ROWS * kChunksPerRow; i += THREADS) {
    const int r = i / kChunksPerRow, c = (i % kChunksPerRow) * kPer;
    uint4 chunk = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows && c < head_dim) {
      const T* from = src + static_cast<std::int64_t>(r) * stride + c;
      if (vector) {
        chunk = *reinterpret_cast<const uint4*>(from);
      } else {
        B bits[kPer];
#pragma unroll
        for (int e = 0; e < kPer; ++e) bits[e] = c + e < head_dim ? reinterpret_cast<const B*>(from)[e] : B(0);
        std::memcpy(&chunk, bits, sizeof chunk);
      }
    }
    *reinterpret_cast<uint4*>(tile + r * ld + c) = chunk;
  }
}

// Warp-level tile products into C-layout accumulators acc[NT][4] (16 x 8 NT), operands in
// shared memory (row-major with the given row strides, in elements) or, for rn, the A operand
// in C-layout registers:
//   nt: acc += A (16 x K) B^T, B given as 8 NT rows of K
//   rn: acc += P (16 x 8 KT, registers) B, B given as 8 KT rows of 8 NT
//   tn: acc += At^T B, At given as K rows of 16, B as K rows of 8 NT
template <typename T>
struct Mma;

template <>
struct Mma<bf16_t> {
  using T = bf16_t;

  template <int NT, int K>
  static NAX_ATT_FN void nt(float (&acc)[NT][4], const T* a, int lda, const T* b, int ldb, int lane) {
    static_assert(NT % 2 == 0 && K % 16 == 0, "bf16 tiles: pairs of 8-column blocks, K a multiple of 16");
    // A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
    const T* a_row = a + (lane % 8 + 8 * ((lane / 8) % 2)) * lda + 8 * (lane / 16);
    // B^T rows n: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15): the two
    // registers of block j, then of block j + 1.
    const T* b_row = b + (lane % 8 + 8 * (lane / 16)) * ldb + 8 * ((lane / 8) % 2);
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
      std::uint32_t af[4];
      ldmatrix_x4(af, a_row + k0);
#pragma unroll
      for (int j = 0; j < NT; j += 2) {
        std::uint32_t bf[4];
        ldmatrix_x4(bf, b_row + 8 * j * ldb + k0);
        mma_bf16(acc[j], af, bf[0], bf[1]);
        mma_bf16(acc[j + 1], af, bf[2], bf[3]);
      }
    }
  }

  template <int NT, int KT>
  static NAX_ATT_FN void rn(float (&acc)[NT][4], const float (&p)[KT][4], const T* b, int ldb, int lane) {
    static_assert(NT % 2 == 0 && KT % 2 == 0, "bf16 tiles: pairs of 8-column blocks");
    // B rows k, transposed: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
    const T* b_row = b + (lane % 8 + 8 * ((lane / 8) % 2)) * ldb + 8 * (lane / 16);
#pragma unroll
    for (int s = 0; s < KT / 2; ++s) {
      // The C layout of columns 16 s .. 16 s + 15 is the A layout of that k step.
      const std::uint32_t af[4] = {pack_bf16(p[2 * s][0], p[2 * s][1]), pack_bf16(p[2 * s][2], p[2 * s][3]),
                                   pack_bf16(p[2 * s + 1][0], p[2 * s + 1][1]), pack_bf16(p[2 * s + 1][2], p[2 * s + 1][3])};
#pragma unroll
      for (int j = 0; j < NT; j += 2) {
        std::uint32_t bf[4];
        ldmatrix_x4_trans(bf, b_row + 16 * s * ldb + 8 * j);
        mma_bf16(acc[j], af, bf[0], bf[1]);
        mma_bf16(acc[j + 1], af, bf[2], bf[3]);
      }
    }
  }

  template <int NT, int K>
  static NAX_ATT_FN void tn(float (&acc)[NT][4], const T* at, int lda, const T* b, int ldb, int lane) {
    static_assert(NT % 2 == 0 && K % 16 == 0, "bf16 tiles: pairs of 8-column blocks, K a multiple of 16");
    // At rows k, transposed: (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7), (k 8-15, m 8-15).
    const T* a_row = at + (lane % 8 + 8 * (lane / 16)) * lda + 8 * ((lane / 8) % 2);
    const T* b_row = b + (lane % 8 + 8 * ((lane / 8) % 2)) * ldb + 8 * (lane / 16);
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
      std::uint32_t af[4];
      ldmatrix_x4_trans(af, a_row + k0 * lda);
#pragma unroll
      for (int j = 0; j < NT; j += 2) {
        std::uint32_t bf[4];
        ldmatrix_x4_trans(bf, b_row + k0 * ldb + 8 * j);
        mma_bf16(acc[j], af, bf[0], bf[1]);
        mma_bf16(acc[j + 1], af, bf[2], bf[3]);
      }
    }
  }
};

// f32: the same products with FMAs (exact f32, no TF32), each lane computing its own C-layout
// elements.
template <>
struct Mma<float> {
  static NAX_ATT_FN float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
  static NAX_ATT_FN float2 load2(const float* p) { return *reinterpret_cast<const float2*>(p); }
  static NAX_ATT_FN float dot4(float4 x, float4 y) { return x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w; }

  template <int NT, int K>
  static NAX_ATT_FN void nt(float (&acc)[NT][4], const float* a, int lda, const float* b, int ldb, int lane) {
    static_assert(K % 4 == 0, "f32 tiles: K a multiple of 4");
    const int g = lane / 4, t = lane % 4;
    const float* a0 = a + g * lda;
    const float* a1 = a0 + 8 * lda;
    const float* b0 = b + 2 * t * ldb;
#pragma unroll 2
    for (int k = 0; k < K; k += 4) {
      const float4 x0 = load4(a0 + k), x1 = load4(a1 + k);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const float4 y0 = load4(b0 + 8 * j * ldb + k), y1 = load4(b0 + (8 * j + 1) * ldb + k);
        acc[j][0] += dot4(x0, y0);
        acc[j][1] += dot4(x0, y1);
        acc[j][2] += dot4(x1, y0);
        acc[j][3] += dot4(x1, y1);
      }
    }
  }

  template <int NT, int KT>
  static NAX_ATT_FN void rn(float (&acc)[NT][4], const float (&p)[KT][4], const float* b, int ldb, int lane) {
    const int t = lane % 4, quad = lane & ~3;
#pragma unroll
    for (int s = 0; s < KT; ++s)
#pragma unroll
      for (int source = 0; source < 4; ++source)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          // Column 8 s + 2 source + e of rows g and g + 8, held by lane 4 g + source.
          const float x0 = shfl_idx(p[s][e], quad | source), x1 = shfl_idx(p[s][2 + e], quad | source);
          const float* row = b + (8 * s + 2 * source + e) * ldb + 2 * t;
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const float2 y = load2(row + 8 * j);
            acc[j][0] += x0 * y.x;
            acc[j][1] += x0 * y.y;
            acc[j][2] += x1 * y.x;
            acc[j][3] += x1 * y.y;
          }
        }
  }

  template <int NT, int K>
  static NAX_ATT_FN void tn(float (&acc)[NT][4], const float* at, int lda, const float* b, int ldb, int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll 4
    for (int k = 0; k < K; ++k) {
      const float x0 = at[k * lda + g], x1 = at[k * lda + g + 8];
      const float* row = b + k * ldb + 2 * t;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const float2 y = load2(row + 8 * j);
        acc[j][0] += x0 * y.x;
        acc[j][1] += x0 * y.y;
        acc[j][2] += x1 * y.x;
        acc[j][3] += x1 * y.y;
      }
    }
  }
};

// Stores a C-layout pair (columns col, col + 1 of a row) to shared memory.
NAX_ATT_FN void store_pair(float* p, float x, float y) { *reinterpret_cast<float2*>(p) = make_float2(x, y); }
NAX_ATT_FN void store_pair(bf16_t* p, float x, float y) { *reinterpret_cast<std::uint32_t*>(p) = pack_bf16(x, y); }

// Padding of shared-memory rows: 16 bytes, which keeps rows 16-byte aligned and spreads the
// eight rows an ldmatrix phase (or a quarter-warp 16-byte load) reads over distinct banks.
template <typename T>
constexpr int padded(int width) {
  return width + 16 / static_cast<int>(sizeof(T));
}

}  // namespace nax::cuda::attention_detail
