#pragma once
// The backward pass of the fused causal attention, in three kernels on one stream:
//   delta_rows:     delta = rowsum(dO * O), one warp per row, and the f32 dq accumulator zeroed;
//   backward_block: block = (batch, 16 W keys, chunk of DC output columns); loop over the query
//                   tiles that see those keys: S^T = K Q^T, P^T from lse, dV += P^T dO,
//                   dP^T = V dO^T, dS^T = P^T (dP^T - delta) scale, dK += dS^T Q; dS^T to shared
//                   memory, dQ(rows of the tile) = dS K added with f32 atomics into the
//                   accumulator;
//   dq_rows:        dq = that accumulator, cast.
// Deterministic mode (Params::deterministic) keeps delta, dk and dv, skips the dq atomics and
// computes dq in attention_deterministic_dq.cuh instead of dq_rows. Instantiated and launched by
// attention.cu; the tile code is attention_warp.cuh.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/attention_warp.cuh"

namespace nax::cuda::attention_detail {

// The delta and dq kernels: one warp per row, kRowWarps rows per block.
constexpr int kRowWarps = 8;

// One warp per row of the launch (batches x tq rows): delta = rowsum(dout * o) - dlse in f32 (the
// gradient of lse adds p * dlse to each score's: d lse / d score = p), and the
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
  if (lane == 0) p.delta[b * p.tq + i] = p.dlse != nullptr ? sum - p.dlse[b * p.tq + i] : sum;
  float* accum = p.dq_accum + (b * p.tq + i) * p.dq_stride;
  for (std::int64_t d = lane; d < p.dq_stride; d += 32) accum[d] = 0.0f;
}

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

  const int shift = p.shift;
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
    const bool mask = k0 + BN - 1 > q0 + shift || k0 + BN > p.tk;  // some key of the tile lies past some query, or past tk
#pragma unroll
    for (int j = 0; j < BM / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * j + 2 * t + (e & 1);
        float pv = exp2f(pt[j][e] * p.scale_log2 - s_lse[col]);
        const int key = key0 + 8 * (e / 2);
        if (mask && (key > q0 + col + shift || key >= p.tk)) pv = 0.0f;
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

// Blocks of one launch group: the main kernel's, and the row kernels' (delta_rows, dq_rows).
template <typename Shape>
std::int64_t backward_blocks(const Params& p) {
  const std::int64_t chunks = (p.head_dim + Shape::kDC - 1) / Shape::kDC;
  return (static_cast<std::int64_t>(p.tk) + Shape::kBN - 1) / Shape::kBN * chunks * p.batches;
}
inline std::int64_t row_blocks(const Params& p) {
  return (static_cast<std::int64_t>(p.batches) * p.tq + kRowWarps - 1) / kRowWarps;
}

}  // namespace nax::cuda::attention_detail
