#pragma once
// Device code of the fused causal attention (attention.cu), flash-attention style: no
// [tq x tk] matrix in memory.
//
// Every warp computes 16-row tiles in the register layout of the mma.sync m16n8k16 accumulator
// ("C layout": lane = 4 g + t holds, for each 8-column block j, rows g and g + 8 at columns
// 8 j + 2 t and 8 j + 2 t + 1, as acc[j][0..1] and acc[j][2..3]). The tile products go through
// Mma<T>: tensor cores (ldmatrix + mma.sync, bf16 in, f32 accumulate) for bf16, plain FMAs in
// the same register layout for f32, so that everything around them (masking, online softmax,
// the backward's elementwise steps) is one code for both.
//
//   forward:  block = (batch, 16 W query rows); loop over key tiles up to the causal limit:
//             S = Q K^T, online softmax (running max and sum per row), O += P V; then O / sum
//             and lse.
//   backward: delta = rowsum(dO * O) first (one warp per row); then block = (batch, 16 W keys,
//             chunk of DC output columns); loop over the query tiles that see those keys:
//             S^T = K Q^T, P^T from lse, dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta)
//             scale, dK += dS^T Q; dS^T to shared memory, dQ(rows of the tile) = dS K added with
//             f32 atomics into a scratch accumulator; finally dq = that accumulator, cast.
//   deterministic mode (Params::deterministic): the backward skips its dq atomics and dq_block
//             computes dq per (batch, query tile), looping over key tiles in order. The forward,
//             delta, dk and dv already sum each row in a fixed order that does not depend on the
//             number of batches (every block works on one batch's tile alone), so they stay.
//
// The bodies take (block, thread) indices and a shared-memory pointer rather than reading CUDA
// built-ins, and the few warp-level primitives are wrapped, so that the file also compiles as
// host C++ under NAX_ATTENTION_EMULATION (a warp emulator supplies the primitives).
#include <cuda_bf16.h>
#include <vector_types.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/attention_launch.h"

namespace nax::cuda::attention_detail {

using bf16_t = __nv_bfloat16;

#ifndef NAX_ATTENTION_EMULATION
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
#endif  // NAX_ATTENTION_EMULATION

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

// ---------------------------------------------------------------------------------------------
// Forward. D: head_dim padded (64, 128, 256); BN: keys per tile; W warps of 16 query rows.
template <typename T, int D, int BN, int W>
struct ForwardShape {
  using Type = T;
  static constexpr int kD = D, kW = W;
  static constexpr int kThreads = 32 * W, kBM = 16 * W, kBN = BN, kLd = padded<T>(D);
  static constexpr std::size_t kSmem = static_cast<std::size_t>(kBM + 2 * BN) * kLd * sizeof(T);
  static_assert(D % 16 == 0 && BN % 16 == 0, "tiles are multiples of 16");
};

template <typename T, int D, int BN, int W>
NAX_ATT_FN void forward_block(const Params& p, char* smem, int block, int tid) {
  using Shape = ForwardShape<T, D, BN, W>;
  constexpr int BM = Shape::kBM, LD = Shape::kLd;
  T* sq = reinterpret_cast<T*>(smem);
  T* sk = sq + BM * LD;
  T* sv = sk + BN * LD;

  // Blocks run heaviest (last query tile: most keys) first.
  const int local = block % p.batches;
  const int q_tiles = (p.tq + BM - 1) / BM;
  const int qt = q_tiles - 1 - block / p.batches;
  const std::int64_t b = p.batch_begin + local;
  const T* q = static_cast<const T*>(p.q) + batch_offset(p, kQ, local, b);
  const T* k = static_cast<const T*>(p.k) + batch_offset(p, kK, local, b);
  const T* v = static_cast<const T*>(p.v) + batch_offset(p, kV, local, b);
  T* out = static_cast<T*>(p.out) + batch_offset(p, kO, local, b);

  const int shift = p.tk - p.tq;  // query i sits at position i + shift
  const int q0 = qt * BM, q_rows = imin(BM, p.tq - q0);
  const int key_end = imin(p.tk, q0 + q_rows + shift);  // keys any row of the tile sees
  const bool vector = p.vector != 0;
  load_tile<T, BM, D, Shape::kThreads>(sq, LD, q + static_cast<std::int64_t>(q0) * p.stride[kQ], p.stride[kQ], q_rows, p.head_dim,
                                       vector, tid);

  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row0 = q0 + warp * 16 + g;  // this lane's rows: row0 and row0 + 8
  const int pos[2] = {row0 + shift, row0 + 8 + shift};
  float m[2] = {-INFINITY, -INFINITY};  // running max of the scaled scores (base-2 units)
  float l[2] = {0.0f, 0.0f};            // running sum of exp2(score - m), this lane's columns
  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

  for (int k0 = 0; k0 < key_end; k0 += BN) {
    block_sync();  // every warp is done with the previous K and V tiles
    const int keys = imin(BN, p.tk - k0);
    load_tile<T, BN, D, Shape::kThreads>(sk, LD, k + static_cast<std::int64_t>(k0) * p.stride[kK], p.stride[kK], keys, p.head_dim,
                                         vector, tid);
    load_tile<T, BN, D, Shape::kThreads>(sv, LD, v + static_cast<std::int64_t>(k0) * p.stride[kV], p.stride[kV], keys, p.head_dim,
                                         vector, tid);
    block_sync();

    float s[BN / 8][4];
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    Mma<T>::template nt<BN / 8, D>(s, sq + warp * 16 * LD, LD, sk, LD, lane);

    // Keys past some row's position (the diagonal tiles) or past tk are masked.
    const bool mask = k0 + BN - 1 > q0 + shift;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[j][e] * p.scale_log2;
        if (mask) {
          const int key = k0 + 8 * j + 2 * t + (e & 1);
          if (key > pos[e / 2] || key >= p.tk) x = -INFINITY;
        }
        s[j][e] = x;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], x);
      }
    float alpha[2], base[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], shfl_xor(tile_max[h], 1));  // the four lanes of a row
      tile_max[h] = fmaxf(tile_max[h], shfl_xor(tile_max[h], 2));
      const float next = fmaxf(m[h], tile_max[h]);
      base[h] = next == -INFINITY ? 0.0f : next;  // no key seen yet: exp2(-inf - 0) = 0, no NaN
      alpha[h] = exp2f(m[h] - base[h]);
      m[h] = next;
    }
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pv = exp2f(s[j][e] - base[e / 2]);
        s[j][e] = pv;
        sum[e / 2] += pv;
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * alpha[h] + sum[h];
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[j][e] *= alpha[e / 2];
    Mma<T>::template rn<D / 8, BN / 8>(o, s, sv, LD, lane);
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += shfl_xor(l[h], 1);
    l[h] += shfl_xor(l[h], 2);
    const int row = row0 + 8 * h;
    if (row >= p.tq) continue;
    const float inverse = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    T* dst = out + static_cast<std::int64_t>(row) * p.stride[kO];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int col = 8 * j + 2 * t;
      if (col < p.head_dim) dst[col] = from_float<T>(o[j][2 * h] * inverse);
      if (col + 1 < p.head_dim) dst[col + 1] = from_float<T>(o[j][2 * h + 1] * inverse);
    }
    if (t == 0) p.lse[b * p.tq + row] = m[h] * kLn2 + logf(l[h]);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward. W warps of 16 keys (BN = 16 W keys per block) and BM = 16 W query rows per step; the
// block writes dk and dv for output columns [c DC, c DC + DC) of its keys (chunk c).
template <typename T, int D, int DC, int W>
struct BackwardShape {
  using Type = T;
  static constexpr int kD = D, kW = W;
  static constexpr int kThreads = 32 * W, kBM = 16 * W, kBN = 16 * W, kDC = DC;
  static constexpr int kLd = padded<T>(D), kLdS = padded<T>(kBM);
  static constexpr std::size_t kSmem = static_cast<std::size_t>(2 * kBN + 2 * kBM) * kLd * sizeof(T) +
                                       static_cast<std::size_t>(kBN) * kLdS * sizeof(T) + 2 * kBM * sizeof(float);
  static_assert(D % DC == 0 && DC % 16 == 0, "chunks of 16-column multiples");
};

template <typename T, int D, int DC, int W>
NAX_ATT_FN void backward_block(const Params& p, char* smem, int block, int tid) {
  using Shape = BackwardShape<T, D, DC, W>;
  constexpr int BM = Shape::kBM, BN = Shape::kBN, LD = Shape::kLd, LDS = Shape::kLdS;
  T* sk = reinterpret_cast<T*>(smem);
  T* sv = sk + BN * LD;
  T* sq = sv + BN * LD;
  T* sdo = sq + BM * LD;
  T* sds = sdo + BM * LD;  // dS^T: [key][query]
  float* s_lse = reinterpret_cast<float*>(sds + BN * LDS);
  float* s_delta = s_lse + BM;

  // Blocks run heaviest (first key tile: seen by every query) first.
  const int chunks = (p.head_dim + DC - 1) / DC;
  const int local = block % p.batches;
  const int rest = block / p.batches;
  const int chunk = rest % chunks, kt = rest / chunks;
  const int col0 = chunk * DC;
  const std::int64_t b = p.batch_begin + local;
  const T* q = static_cast<const T*>(p.q) + batch_offset(p, kQ, local, b);
  const T* k = static_cast<const T*>(p.k) + batch_offset(p, kK, local, b);
  const T* v = static_cast<const T*>(p.v) + batch_offset(p, kV, local, b);
  const T* dout = static_cast<const T*>(p.dout) + batch_offset(p, kDout, local, b);
  T* dk = static_cast<T*>(p.dk) + batch_offset(p, kDk, local, b);
  T* dv = static_cast<T*>(p.dv) + batch_offset(p, kDv, local, b);
  const float* lse = p.lse + b * p.tq;
  const float* delta = p.delta + b * p.tq;
  float* dq_accum = p.dq_accum + b * p.tq * p.dq_stride;

  const int shift = p.tk - p.tq;
  const int k0 = kt * BN, keys = imin(BN, p.tk - k0);
  const bool vector = p.vector != 0;
  load_tile<T, BN, D, Shape::kThreads>(sk, LD, k + static_cast<std::int64_t>(k0) * p.stride[kK], p.stride[kK], keys, p.head_dim, vector,
                                       tid);
  load_tile<T, BN, D, Shape::kThreads>(sv, LD, v + static_cast<std::int64_t>(k0) * p.stride[kV], p.stride[kV], keys, p.head_dim, vector,
                                       tid);

  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int key0 = k0 + warp * 16 + g;  // this lane's keys (rows of dK, dV): key0 and key0 + 8
  float dk_acc[DC / 8][4], dv_acc[DC / 8][4];
#pragma unroll
  for (int j = 0; j < DC / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[j][e] = dv_acc[j][e] = 0.0f;

  const int q_tiles = (p.tq + BM - 1) / BM;
  const int first_query = imax(0, k0 - shift);  // the first query that sees key k0
  for (int qt = first_query / BM; qt < q_tiles; ++qt) {
    const int q0 = qt * BM, rows = imin(BM, p.tq - q0);
    block_sync();  // every warp is done with the previous Q, dO and dS tiles
    load_tile<T, BM, D, Shape::kThreads>(sq, LD, q + static_cast<std::int64_t>(q0) * p.stride[kQ], p.stride[kQ], rows, p.head_dim,
                                         vector, tid);
    load_tile<T, BM, D, Shape::kThreads>(sdo, LD, dout + static_cast<std::int64_t>(q0) * p.stride[kDout], p.stride[kDout], rows,
                                         p.head_dim, vector, tid);
    for (int i = tid; i < BM; i += Shape::kThreads) {
      // Rows past tq: lse +inf makes their probabilities 0.
      s_lse[i] = i < rows ? lse[q0 + i] * kLog2e : INFINITY;
      s_delta[i] = i < rows ? delta[q0 + i] : 0.0f;
    }
    block_sync();

    // P^T (this warp's 16 keys x BM queries), recomputed from lse.
    float pt[BM / 8][4];
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) pt[j][0] = pt[j][1] = pt[j][2] = pt[j][3] = 0.0f;
    Mma<T>::template nt<BM / 8, D>(pt, sk + warp * 16 * LD, LD, sq, LD, lane);
    const bool mask = k0 + BN - 1 > q0 + shift;  // some key of the tile lies past some query
#pragma unroll
    for (int j = 0; j < BM / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * j + 2 * t + (e & 1);
        float pv = exp2f(pt[j][e] * p.scale_log2 - s_lse[col]);
        if (mask && key0 + 8 * (e / 2) > q0 + col + shift) pv = 0.0f;
        pt[j][e] = pv;
      }
    // dV += P^T dO
    Mma<T>::template rn<DC / 8, BM / 8>(dv_acc, pt, sdo + col0, LD, lane);

    // dP^T = V dO^T, then dS^T = P^T (dP^T - delta) scale, in place.
    float ds[BM / 8][4];
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) ds[j][0] = ds[j][1] = ds[j][2] = ds[j][3] = 0.0f;
    Mma<T>::template nt<BM / 8, D>(ds, sv + warp * 16 * LD, LD, sdo, LD, lane);
#pragma unroll
    for (int j = 0; j < BM / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[j][e] = pt[j][e] * (ds[j][e] - s_delta[8 * j + 2 * t + (e & 1)]) * p.scale;
    // dK += dS^T Q
    Mma<T>::template rn<DC / 8, BM / 8>(dk_acc, ds, sq + col0, LD, lane);

    // dQ (the tile's rows) += dS K: dS^T through shared memory, each warp then taking 16 queries.
    // Deterministic mode computes dq in dq_block instead, without atomics.
    if (p.deterministic) continue;
#pragma unroll
    for (int j = 0; j < BM / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) store_pair(sds + (warp * 16 + g + 8 * h) * LDS + 8 * j + 2 * t, ds[j][2 * h], ds[j][2 * h + 1]);
    block_sync();
    float dq[DC / 8][4];
#pragma unroll
    for (int j = 0; j < DC / 8; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;
    Mma<T>::template tn<DC / 8, BN>(dq, sds + warp * 16, LDS, sk + col0, LD, lane);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = q0 + warp * 16 + g + 8 * h;
      if (row >= p.tq) continue;
      float* dst = dq_accum + static_cast<std::int64_t>(row) * p.dq_stride;
#pragma unroll
      for (int j = 0; j < DC / 8; ++j) {
        const int col = col0 + 8 * j + 2 * t;
        if (col < p.dq_stride) atomic_add2(dst + col, dq[j][2 * h], dq[j][2 * h + 1]);
      }
    }
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = key0 + 8 * h;
    if (key >= p.tk) continue;
    T* dk_row = dk + static_cast<std::int64_t>(key) * p.stride[kDk];
    T* dv_row = dv + static_cast<std::int64_t>(key) * p.stride[kDv];
#pragma unroll
    for (int j = 0; j < DC / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = col0 + 8 * j + 2 * t + e;
        if (col >= p.head_dim) continue;
        dk_row[col] = from_float<T>(dk_acc[j][2 * h + e]);
        dv_row[col] = from_float<T>(dv_acc[j][2 * h + e]);
      }
  }
}

// ---------------------------------------------------------------------------------------------
// Deterministic mode's dq: block = (batch, 16 W query rows, chunk of DC columns of dq); the loop
// over the key tiles those rows see, in key order, recomputes S = Q K^T, P from lse, dP = dO V^T,
// dS = P (dP - delta) scale, and keeps dQ += dS K in registers. No atomics: each row's sums run in
// one fixed order, whatever the number of batches or the grid.
template <typename T, int D, int BN, int DC, int W>
struct DqShape {
  using Type = T;
  static constexpr int kD = D, kW = W;
  static constexpr int kThreads = 32 * W, kBM = 16 * W, kBN = BN, kDC = DC, kLd = padded<T>(D);
  static constexpr std::size_t kSmem = static_cast<std::size_t>(2 * kBM + 2 * BN) * kLd * sizeof(T) + 2 * kBM * sizeof(float);
  static_assert(D % DC == 0 && DC % 16 == 0 && BN % 16 == 0, "chunks and key tiles of 16-column multiples");
};

template <typename T, int D, int BN, int DC, int W>
NAX_ATT_FN void dq_block(const Params& p, char* smem, int block, int tid) {
  using Shape = DqShape<T, D, BN, DC, W>;
  constexpr int BM = Shape::kBM, LD = Shape::kLd;
  T* sq = reinterpret_cast<T*>(smem);
  T* sdo = sq + BM * LD;
  T* sk = sdo + BM * LD;
  T* sv = sk + BN * LD;
  float* s_lse = reinterpret_cast<float*>(sv + BN * LD);
  float* s_delta = s_lse + BM;

  // Blocks run heaviest (last query tile: most keys) first.
  const int chunks = (p.head_dim + DC - 1) / DC;
  const int local = block % p.batches;
  const int rest = block / p.batches;
  const int chunk = rest % chunks;
  const int qt = (p.tq + BM - 1) / BM - 1 - rest / chunks;
  const int col0 = chunk * DC;
  const std::int64_t b = p.batch_begin + local;
  const T* q = static_cast<const T*>(p.q) + batch_offset(p, kQ, local, b);
  const T* k = static_cast<const T*>(p.k) + batch_offset(p, kK, local, b);
  const T* v = static_cast<const T*>(p.v) + batch_offset(p, kV, local, b);
  const T* dout = static_cast<const T*>(p.dout) + batch_offset(p, kDout, local, b);
  T* dq = static_cast<T*>(p.dq) + batch_offset(p, kDq, local, b);
  const float* lse = p.lse + b * p.tq;
  const float* delta = p.delta + b * p.tq;

  const int shift = p.tk - p.tq;  // query i sits at position i + shift
  const int q0 = qt * BM, q_rows = imin(BM, p.tq - q0);
  const int key_end = imin(p.tk, q0 + q_rows + shift);  // keys any row of the tile sees
  const bool vector = p.vector != 0;
  load_tile<T, BM, D, Shape::kThreads>(sq, LD, q + static_cast<std::int64_t>(q0) * p.stride[kQ], p.stride[kQ], q_rows, p.head_dim,
                                       vector, tid);
  load_tile<T, BM, D, Shape::kThreads>(sdo, LD, dout + static_cast<std::int64_t>(q0) * p.stride[kDout], p.stride[kDout], q_rows,
                                       p.head_dim, vector, tid);
  for (int i = tid; i < BM; i += Shape::kThreads) {
    // Rows past tq: lse +inf makes their probabilities 0.
    s_lse[i] = i < q_rows ? lse[q0 + i] * kLog2e : INFINITY;
    s_delta[i] = i < q_rows ? delta[q0 + i] : 0.0f;
  }

  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row0 = q0 + warp * 16 + g;  // this lane's rows: row0 and row0 + 8
  const int pos[2] = {row0 + shift, row0 + 8 + shift};
  float dq_acc[DC / 8][4];
#pragma unroll
  for (int j = 0; j < DC / 8; ++j) dq_acc[j][0] = dq_acc[j][1] = dq_acc[j][2] = dq_acc[j][3] = 0.0f;

  for (int k0 = 0; k0 < key_end; k0 += BN) {
    block_sync();  // every warp is done with the previous K and V tiles (and the first time: Q, dO, lse, delta are in)
    const int keys = imin(BN, p.tk - k0);
    load_tile<T, BN, D, Shape::kThreads>(sk, LD, k + static_cast<std::int64_t>(k0) * p.stride[kK], p.stride[kK], keys, p.head_dim,
                                         vector, tid);
    load_tile<T, BN, D, Shape::kThreads>(sv, LD, v + static_cast<std::int64_t>(k0) * p.stride[kV], p.stride[kV], keys, p.head_dim,
                                         vector, tid);
    block_sync();

    float s[BN / 8][4], dp[BN / 8][4];
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.0f;
    Mma<T>::template nt<BN / 8, D>(s, sq + warp * 16 * LD, LD, sk, LD, lane);
    Mma<T>::template nt<BN / 8, D>(dp, sdo + warp * 16 * LD, LD, sv, LD, lane);

    // dS = P (dP - delta) scale, in place of S; keys past a row's position or past tk are masked.
    const bool mask = k0 + BN - 1 > q0 + shift;
    const float row_lse[2] = {s_lse[warp * 16 + g], s_lse[warp * 16 + g + 8]};
    const float row_delta[2] = {s_delta[warp * 16 + g], s_delta[warp * 16 + g + 8]};
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float pv = exp2f(s[j][e] * p.scale_log2 - row_lse[e / 2]);
        if (mask) {
          const int key = k0 + 8 * j + 2 * t + (e & 1);
          if (key > pos[e / 2] || key >= p.tk) pv = 0.0f;
        }
        s[j][e] = pv * (dp[j][e] - row_delta[e / 2]) * p.scale;
      }
    // dQ += dS K (columns col0 .. col0 + DC of K)
    Mma<T>::template rn<DC / 8, BN / 8>(dq_acc, s, sk + col0, LD, lane);
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    if (row >= p.tq) continue;
    T* dst = dq + static_cast<std::int64_t>(row) * p.stride[kDq];
#pragma unroll
    for (int j = 0; j < DC / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = col0 + 8 * j + 2 * t + e;
        if (col < p.head_dim) dst[col] = from_float<T>(dq_acc[j][2 * h + e]);
      }
  }
}

// The delta and dq kernels: one warp per row, kRowWarps rows per block.
constexpr int kRowWarps = 8;

// One warp per row of the launch (batches x tq rows): delta = rowsum(dout * o) in f32, and the
// row of dq_accum zeroed for the backward's atomics (which run after this, on the same stream).
template <typename T, int W>
NAX_ATT_FN void delta_rows(const Params& p, int block, int tid) {
  const std::int64_t row = static_cast<std::int64_t>(block) * W + tid / 32;
  const int lane = tid % 32;
  if (row >= static_cast<std::int64_t>(p.batches) * p.tq) return;  // the whole warp
  const int local = static_cast<int>(row / p.tq), i = static_cast<int>(row % p.tq);
  const std::int64_t b = p.batch_begin + local;
  const T* dout = static_cast<const T*>(p.dout) + batch_offset(p, kDout, local, b) + static_cast<std::int64_t>(i) * p.stride[kDout];
  const T* o = static_cast<const T*>(p.o) + batch_offset(p, kO, local, b) + static_cast<std::int64_t>(i) * p.stride[kO];
  float sum = 0.0f;
  for (int d = lane; d < p.head_dim; d += 32) sum += to_float(dout[d]) * to_float(o[d]);
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) sum += shfl_xor(sum, mask);
  if (lane == 0) p.delta[b * p.tq + i] = sum;
  float* accum = p.dq_accum + (b * p.tq + i) * p.dq_stride;
  for (std::int64_t d = lane; d < p.dq_stride; d += 32) accum[d] = 0.0f;
}

// One warp per row: dq = dq_accum, in T.
template <typename T, int W>
NAX_ATT_FN void dq_rows(const Params& p, int block, int tid) {
  const std::int64_t row = static_cast<std::int64_t>(block) * W + tid / 32;
  const int lane = tid % 32;
  if (row >= static_cast<std::int64_t>(p.batches) * p.tq) return;
  const int local = static_cast<int>(row / p.tq), i = static_cast<int>(row % p.tq);
  const std::int64_t b = p.batch_begin + local;
  T* dq = static_cast<T*>(p.dq) + batch_offset(p, kDq, local, b) + static_cast<std::int64_t>(i) * p.stride[kDq];
  const float* from = p.dq_accum + (b * p.tq + i) * p.dq_stride;
  for (int d = lane; d < p.head_dim; d += 32) dq[d] = from_float<T>(from[d]);
}

// ---------------------------------------------------------------------------------------------
// The tile shapes by dtype and head_dim (host side): f(shape) with a ForwardShape or
// BackwardShape value. bf16 (tensor cores): 4 warps, 64 query rows per forward block and 64 keys
// per tile (32 at head_dim 256, whose O accumulator alone is 128 registers a thread); backward
// 64 keys x 64 queries with dk, dv in chunks of up to 128 columns (each chunk recomputes S and
// dP: fewer chunks, less work, but dk, dv and dq accumulators of 128 columns take 255 registers
// with a few bytes of spill). f32 (FMAs): smaller tiles where its rows, twice as wide, would not
// fit shared memory, and 64-column chunks.
template <typename T>
struct Tiles;

template <>
struct Tiles<bf16_t> {
  template <typename F>
  static void forward(int head_dim, F&& f) {
    if (head_dim <= 64) f(ForwardShape<bf16_t, 64, 64, 4>{});
    else if (head_dim <= 128) f(ForwardShape<bf16_t, 128, 64, 4>{});
    else f(ForwardShape<bf16_t, 256, 32, 4>{});
  }
  template <typename F>
  static void backward(int head_dim, F&& f) {
    if (head_dim <= 64) f(BackwardShape<bf16_t, 64, 64, 4>{});
    else if (head_dim <= 128) f(BackwardShape<bf16_t, 128, 128, 4>{});
    else f(BackwardShape<bf16_t, 256, 128, 4>{});
  }
  template <typename F>
  static void dq(int head_dim, F&& f) {
    if (head_dim <= 64) f(DqShape<bf16_t, 64, 64, 64, 4>{});
    else if (head_dim <= 128) f(DqShape<bf16_t, 128, 64, 128, 4>{});
    else f(DqShape<bf16_t, 256, 32, 128, 4>{});
  }
};

template <>
struct Tiles<float> {
  template <typename F>
  static void forward(int head_dim, F&& f) {
    if (head_dim <= 64) f(ForwardShape<float, 64, 64, 4>{});
    else if (head_dim <= 128) f(ForwardShape<float, 128, 32, 4>{});
    else f(ForwardShape<float, 256, 32, 4>{});
  }
  template <typename F>
  static void backward(int head_dim, F&& f) {
    if (head_dim <= 64) f(BackwardShape<float, 64, 64, 4>{});
    else if (head_dim <= 128) f(BackwardShape<float, 128, 64, 2>{});
    else f(BackwardShape<float, 256, 64, 2>{});
  }
  template <typename F>
  static void dq(int head_dim, F&& f) {
    if (head_dim <= 64) f(DqShape<float, 64, 64, 64, 4>{});
    else if (head_dim <= 128) f(DqShape<float, 128, 32, 64, 2>{});
    else f(DqShape<float, 256, 32, 64, 2>{});
  }
};

// Grid sizes of one launch group.
template <typename Shape>
std::int64_t forward_blocks(const Params& p) {
  return (static_cast<std::int64_t>(p.tq) + Shape::kBM - 1) / Shape::kBM * p.batches;
}
template <typename Shape>
std::int64_t backward_blocks(const Params& p) {
  const std::int64_t chunks = (p.head_dim + Shape::kDC - 1) / Shape::kDC;
  return (static_cast<std::int64_t>(p.tk) + Shape::kBN - 1) / Shape::kBN * chunks * p.batches;
}
template <typename Shape>
std::int64_t dq_blocks(const Params& p) {
  const std::int64_t chunks = (p.head_dim + Shape::kDC - 1) / Shape::kDC;
  return (static_cast<std::int64_t>(p.tq) + Shape::kBM - 1) / Shape::kBM * chunks * p.batches;
}
inline std::int64_t row_blocks(const Params& p) {
  return (static_cast<std::int64_t>(p.batches) * p.tq + kRowWarps - 1) / kRowWarps;
}

}  // namespace nax::cuda::attention_detail
