// Fused causal attention on the CPU, flash-attention style: query rows go through in blocks; for a
// block, the scores against the keys it can see are one GEMM into scratch, the masked softmax runs
// on that scratch in place, and the output is a second GEMM. Only each row's log-sum-exp is kept;
// the backward recomputes the probabilities of a block from it. And the rotary embedding.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vector_math.h"
#include "nax/core/error.h"

namespace nax::cpu {

namespace {

template <typename T>
T dot_of(const T* a, const T* b, std::int64_t n) {
  T total = 0;
  for (std::int64_t j = 0; j < n; ++j) total += a[j] * b[j];
  return total;
}

template <typename T>
const T* matrix(const InMatrices& m, std::int64_t batch) {
  return static_cast<const T*>(m.data) + m.offsets[batch];
}

template <typename T>
T* matrix(const OutMatrices& m, std::int64_t batch) {
  return static_cast<T*>(m.data) + m.offsets[batch];
}

// The rows [begin, end) of a block of queries, and the keys [0, keys) any of them can see.
struct Block {
  std::int64_t begin = 0, end = 0, keys = 0;
  std::int64_t rows() const { return end - begin; }
};

// Keys query row `row` sees: those up to its position row + query_offset (none before the first key).
std::int64_t visible_keys(const AttentionSizes& s, std::int64_t row) { return std::clamp<std::int64_t>(row + s.query_offset + 1, 0, s.tk); }

Block block_at(const AttentionSizes& s, std::int64_t begin) {
  const std::int64_t end = std::min(s.tq, begin + s.block_rows);
  return {begin, end, visible_keys(s, end - 1)};
}

// Deterministic mode (sizes.tree on, the full canonical tree from the op layer): every GEMM sums
// in that tree, so that no result depends on OpenBLAS's size-dependent paths or threads. The rest
// of the kernel works row by row (softmax, lse, delta), each row from its own data.
template <typename T>
void gemm_of(const AttentionSizes& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
             std::int64_t lda, const T* b, std::int64_t ldb, T* c, std::int64_t ldc, double beta = 0.0) {
  gemm(dtype_of<T>(), trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, beta, s.tree);
}

// Row of raw scores -> probabilities over the first `visible` entries, zeros after; returns the
// log-sum-exp of the scaled scores (-inf for a row that sees no key: its probabilities are zeros).
template <typename T>
T softmax_row(T* row, std::int64_t visible, std::int64_t width, T scale) {
  if (visible == 0) {
    std::fill(row, row + width, T(0));
    return -std::numeric_limits<T>::infinity();
  }
  const T shift = lane_max(row, visible) * scale;  // scale > 0: the max of the scaled scores
  for (std::int64_t j = 0; j < visible; ++j) row[j] = exp_of(row[j] * scale - shift);
  const T total = lane_sum<T>(visible, [row](std::int64_t i) { return row[i]; });
  const T inverse = T(1) / total;
  for (std::int64_t j = 0; j < visible; ++j) row[j] *= inverse;
  std::fill(row + visible, row + width, T(0));
  return shift + std::log(total);
}

// Raw scores -> the probabilities saved by the forward, through its log-sum-exp.
template <typename T>
void probabilities_row(T* row, std::int64_t visible, std::int64_t width, T scale, T lse) {
  for (std::int64_t j = 0; j < visible; ++j) row[j] = exp_of(row[j] * scale - lse);
  std::fill(row + visible, row + width, T(0));
}

template <typename T>
void zero_rows(const OutMatrices& m, std::int64_t batch, std::int64_t begin, std::int64_t end, std::int64_t cols) {
  for (std::int64_t r = begin; r < end; ++r) std::fill_n(matrix<T>(m, batch) + r * m.row_stride, cols, T(0));
}

template <typename T>
void forward_block(const AttentionSizes& s, std::int64_t b, const Block& blk, const InMatrices& q, const InMatrices& k,
                   const InMatrices& v, const OutMatrices& out, T* lse, T* scores) {
  const std::int64_t d = s.head_dim, n = blk.keys;
  if (n == 0) {  // no row of the block sees a key
    zero_rows<T>(out, b, blk.begin, blk.end, d);
    std::fill(lse + b * s.tq + blk.begin, lse + b * s.tq + blk.end, -std::numeric_limits<T>::infinity());
    return;
  }
  gemm_of<T>(s, false, true, blk.rows(), n, d, matrix<T>(q, b) + blk.begin * q.row_stride, q.row_stride, matrix<T>(k, b), k.row_stride,
             scores, n);
  for (std::int64_t i = blk.begin; i < blk.end; ++i)
    lse[b * s.tq + i] = softmax_row(scores + (i - blk.begin) * n, visible_keys(s, i), n, static_cast<T>(s.scale));
  gemm_of<T>(s, false, false, blk.rows(), d, n, scores, n, matrix<T>(v, b), v.row_stride, matrix<T>(out, b) + blk.begin * out.row_stride,
             out.row_stride);
}

template <typename T>
void forward(const AttentionSizes& s, const InMatrices& q, const InMatrices& k, const InMatrices& v, const OutMatrices& out, T* lse,
             T* scratch) {
  for (std::int64_t b = 0; b < s.batches; ++b)
    for (std::int64_t begin = 0; begin < s.tq; begin += s.block_rows) forward_block(s, b, block_at(s, begin), q, k, v, out, lse, scratch);
}

template <typename T>
struct Gradients {
  const InMatrices& out;
  const InMatrices& dout;
  const T* dlse;  // the gradient of lse, or null
  const OutMatrices& dq;
  const OutMatrices& dk;
  const OutMatrices& dv;
};

// The backward of one block of query rows, in the order of the forward's dependencies:
// p from the saved lse; dv += p^T do; dp = do v^T; ds = p (dp - rowsum(do * out) + dlse) * scale
// (d lse / d score = p); dq = ds k; dk += ds^T q. (The scale is folded into ds once, for both dq
// and dk.)
template <typename T>
void backward_block(const AttentionSizes& s, std::int64_t b, const Block& blk, const InMatrices& q, const InMatrices& k,
                    const InMatrices& v, const Gradients<T>& g, const T* lse, T* p, T* ds, T* delta) {
  const std::int64_t d = s.head_dim, n = blk.keys, rows = blk.rows();
  if (n == 0) return zero_rows<T>(g.dq, b, blk.begin, blk.end, d);
  const T scale = static_cast<T>(s.scale);
  const T* q_rows = matrix<T>(q, b) + blk.begin * q.row_stride;
  const T* do_rows = matrix<T>(g.dout, b) + blk.begin * g.dout.row_stride;
  const T* out_rows = matrix<T>(g.out, b) + blk.begin * g.out.row_stride;
  for (std::int64_t a = 0; a < rows; ++a) {
    delta[a] = dot_of(do_rows + a * g.dout.row_stride, out_rows + a * g.out.row_stride, d);
    if (g.dlse != nullptr) delta[a] -= g.dlse[b * s.tq + blk.begin + a];
  }

  gemm_of<T>(s, false, true, rows, n, d, q_rows, q.row_stride, matrix<T>(k, b), k.row_stride, p, n);
  for (std::int64_t a = 0; a < rows; ++a)
    probabilities_row(p + a * n, visible_keys(s, blk.begin + a), n, scale, lse[b * s.tq + blk.begin + a]);
  gemm_of<T>(s, true, false, n, d, rows, p, n, do_rows, g.dout.row_stride, matrix<T>(g.dv, b), g.dv.row_stride, 1.0);

  gemm_of<T>(s, false, true, rows, n, d, do_rows, g.dout.row_stride, matrix<T>(v, b), v.row_stride, ds, n);
  for (std::int64_t a = 0; a < rows; ++a) {
    T* ds_row = ds + a * n;
    const T* p_row = p + a * n;
    for (std::int64_t j = 0; j < n; ++j) ds_row[j] = p_row[j] * (ds_row[j] - delta[a]) * scale;
  }
  gemm_of<T>(s, false, false, rows, d, n, ds, n, matrix<T>(k, b), k.row_stride, matrix<T>(g.dq, b) + blk.begin * g.dq.row_stride,
             g.dq.row_stride);
  gemm_of<T>(s, true, false, n, d, rows, ds, n, q_rows, q.row_stride, matrix<T>(g.dk, b), g.dk.row_stride, 1.0);
}

template <typename T>
void backward(const AttentionSizes& s, const InMatrices& q, const InMatrices& k, const InMatrices& v, const Gradients<T>& g,
              const T* lse, T* scratch) {
  for (std::int64_t b = 0; b < s.batches; ++b) {  // dk and dv accumulate over the blocks
    zero_rows<T>(g.dk, b, 0, s.tk, s.head_dim);
    zero_rows<T>(g.dv, b, 0, s.tk, s.head_dim);
  }
  T* p = scratch;
  T* ds = p + s.block_rows * s.tk;
  T* delta = ds + s.block_rows * s.tk;
  for (std::int64_t b = 0; b < s.batches; ++b)
    for (std::int64_t begin = 0; begin < s.tq; begin += s.block_rows)
      backward_block(s, b, block_at(s, begin), q, k, v, g, lse, p, ds, delta);
}

void check_sizes(const AttentionSizes& s) {
  if (s.block_rows < 1 || s.tk < 0 || s.tq < 0 || s.head_dim < 0 || s.batches < 0)
    fail("causal_attention kernel", "bad sizes: batches {} tq {} tk {} head_dim {} block_rows {}", s.batches, s.tq, s.tk, s.head_dim,
         s.block_rows);
}

template <typename T>
void rotary_typed(const RotarySizes& s, T* data, const std::int64_t* outer_offsets, std::int64_t outer_count) {
  const std::int64_t pairs = s.rotary_dims / 2;
  std::vector<T> cosines(static_cast<std::size_t>(s.seq_len * pairs)), sines(cosines.size());
  for (std::int64_t i = 0; i < pairs; ++i) {
    const double frequency = std::pow(s.base, -2.0 * static_cast<double>(i) / static_cast<double>(s.rotary_dims));
    for (std::int64_t t = 0; t < s.seq_len; ++t) {
      const double angle = s.direction * static_cast<double>(t + s.position_offset) * frequency;
      cosines[static_cast<std::size_t>(t * pairs + i)] = static_cast<T>(std::cos(angle));
      sines[static_cast<std::size_t>(t * pairs + i)] = static_cast<T>(std::sin(angle));
    }
  }
  for (std::int64_t o = 0; o < outer_count; ++o)
    for (std::int64_t t = 0; t < s.seq_len; ++t) {
      T* row = data + outer_offsets[o] + t * s.seq_stride;
      const T* c = cosines.data() + t * pairs;
      const T* sn = sines.data() + t * pairs;
      for (std::int64_t i = 0; i < pairs; ++i) {
        T& x0 = row[2 * i * s.head_dim_stride];
        T& x1 = row[(2 * i + 1) * s.head_dim_stride];
        const T a = x0, b = x1;
        x0 = a * c[i] - b * sn[i];
        x1 = b * c[i] + a * sn[i];
      }
    }
}

}  // namespace

std::int64_t attention_forward_scratch(const AttentionSizes& s) { return s.block_rows * s.tk; }
std::int64_t attention_backward_scratch(const AttentionSizes& s) { return 2 * s.block_rows * s.tk + s.block_rows; }

void causal_attention_forward(const AttentionSizes& s, const InMatrices& q, const InMatrices& k, const InMatrices& v,
                              const OutMatrices& out, void* lse, void* scratch) {
  check_sizes(s);
  switch (s.dtype) {
    case DType::f32: return forward(s, q, k, v, out, static_cast<float*>(lse), static_cast<float*>(scratch));
    case DType::f64: return forward(s, q, k, v, out, static_cast<double*>(lse), static_cast<double*>(scratch));
    default: fail("causal_attention kernel", "unsupported dtype {}", dtype_name(s.dtype));
  }
}

void causal_attention_backward(const AttentionSizes& s, const InMatrices& q, const InMatrices& k, const InMatrices& v,
                               const InMatrices& out, const InMatrices& dout, const void* lse, const void* dlse, const OutMatrices& dq,
                               const OutMatrices& dk, const OutMatrices& dv, void* scratch) {
  check_sizes(s);
  switch (s.dtype) {
    case DType::f32: {
      const Gradients<float> g{out, dout, static_cast<const float*>(dlse), dq, dk, dv};
      return backward(s, q, k, v, g, static_cast<const float*>(lse), static_cast<float*>(scratch));
    }
    case DType::f64: {
      const Gradients<double> g{out, dout, static_cast<const double*>(dlse), dq, dk, dv};
      return backward(s, q, k, v, g, static_cast<const double*>(lse), static_cast<double*>(scratch));
    }
    default: fail("causal_attention kernel", "unsupported dtype {}", dtype_name(s.dtype));
  }
}

void rotary_in_place(const RotarySizes& s, void* data, const std::int64_t* outer_offsets, std::int64_t outer_count) {
  switch (s.dtype) {
    case DType::f32: return rotary_typed(s, static_cast<float*>(data), outer_offsets, outer_count);
    case DType::f64: return rotary_typed(s, static_cast<double*>(data), outer_offsets, outer_count);
    default: fail("rotary kernel", "unsupported dtype {}", dtype_name(s.dtype));
  }
}

}  // namespace nax::cpu

namespace nax::kernels {

std::vector<std::int64_t> strided_offsets(const std::int64_t* sizes, const std::int64_t* strides, int rank) {
  std::int64_t count = 1;
  for (int d = 0; d < rank; ++d) count *= sizes[d];
  std::vector<std::int64_t> offsets;
  offsets.reserve(static_cast<std::size_t>(count));
  std::vector<std::int64_t> index(static_cast<std::size_t>(rank), 0);
  std::int64_t offset = 0;
  for (std::int64_t n = 0; n < count; ++n) {
    offsets.push_back(offset);
    for (int d = rank; d-- > 0;) {
      const auto du = static_cast<std::size_t>(d);
      offset += strides[d];
      if (++index[du] < sizes[d]) break;
      offset -= strides[d] * sizes[d];
      index[du] = 0;
    }
  }
  return offsets;
}

}  // namespace nax::kernels
