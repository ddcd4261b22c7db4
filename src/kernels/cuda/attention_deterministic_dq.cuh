#pragma once
// Deterministic mode's dq for the fused causal attention, computed per query tile in place of the
// backward's atomics (attention_backward.cuh): the forward, delta, dk and dv already sum each row
// in a fixed order that does not depend on the number of batches (every block works on one
// batch's tile alone), so only dq needs its own kernel. It runs after delta_rows. Instantiated
// and launched by attention.cu; the tile code is attention_warp.cuh.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/attention_warp.cuh"

namespace nax::cuda::attention_detail {

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

  const int shift = p.shift;  // query i sits at position i + shift
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
    const bool mask = k0 + BN - 1 > q0 + shift || k0 + BN > p.tk;
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

// Blocks of one launch group.
template <typename Shape>
std::int64_t dq_blocks(const Params& p) {
  const std::int64_t chunks = (p.head_dim + Shape::kDC - 1) / Shape::kDC;
  return (static_cast<std::int64_t>(p.tq) + Shape::kBM - 1) / Shape::kBM * chunks * p.batches;
}

}  // namespace nax::cuda::attention_detail
