#pragma once
// The forward pass of the fused causal attention, flash-attention style: no [tq x tk] matrix in
// memory. Block = (batch, 16 W query rows); loop over key tiles up to the causal limit:
// S = Q K^T, online softmax (running max and sum per row), O += P V; then O / sum and lse.
// Deterministic mode needs nothing different: every block sums its rows in one fixed order.
// Instantiated and launched by attention.cu; the tile code is attention_warp.cuh.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/attention_warp.cuh"

namespace nax::cuda::attention_detail {

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

  const int shift = p.shift;  // query i sits at position i + shift
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
    const bool mask = k0 + BN - 1 > q0 + shift || k0 + BN > p.tk;
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

// Blocks of one launch group.
template <typename Shape>
std::int64_t forward_blocks(const Params& p) {
  return (static_cast<std::int64_t>(p.tq) + Shape::kBM - 1) / Shape::kBM * p.batches;
}

}  // namespace nax::cuda::attention_detail
