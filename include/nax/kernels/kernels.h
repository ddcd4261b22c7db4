#pragma once
// The kernel layer's interface (docs/architecture.md): the raw compute one kind of device offers, on
// pointers into that device's memory. The op layer checks shapes, dtypes and vary types, then calls
// its tensors' device's Kernels; CPU (kernels/cpu) and CUDA (kernels/cuda) implement it.
// Work may be enqueued and run later (CUDA: on the device's stream, in order); to_host waits.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "nax/core/reduce_op.h"
#include "nax/kernels/sum_tree.h"
#include "nax/kernels/device.h"
#include "nax/core/dtype.h"

namespace nax::kernels {

inline constexpr int kMaxRank = 16;
using Dims = std::array<std::int64_t, kMaxRank>;

// K operands iterated together over `rank` dimensions of `sizes`, operand k stepping strides[k].
template <int K>
struct Layout {
  int rank = 0;
  Dims sizes{};
  std::array<Dims, K> strides{};
};

// Drops size-1 dimensions and merges neighbours that are contiguous for every operand.
template <int K>
Layout<K> coalesce(Layout<K> in) {
  Layout<K> out;
  for (int d = 0; d < in.rank; ++d) {
    if (in.sizes[d] == 1) continue;
    if (out.rank > 0) {
      bool mergeable = true;
      for (int k = 0; k < K; ++k)
        if (out.strides[k][out.rank - 1] != in.strides[k][d] * in.sizes[d]) mergeable = false;
      if (mergeable) {
        out.sizes[out.rank - 1] *= in.sizes[d];
        for (int k = 0; k < K; ++k) out.strides[k][out.rank - 1] = in.strides[k][d];
        continue;
      }
    }
    out.sizes[out.rank] = in.sizes[d];
    for (int k = 0; k < K; ++k) out.strides[k][out.rank] = in.strides[k][d];
    ++out.rank;
  }
  if (out.rank == 0) {  // a single element
    out.rank = 1;
    out.sizes[0] = 1;
    for (int k = 0; k < K; ++k) out.strides[k][0] = 1;
  }
  return out;
}

enum class BinaryOp { add, sub, mul, div, max, min, pow, eq, ne, lt, le, gt, ge };
enum class UnaryOp { neg, abs, exp, log, sqrt, rsqrt, tanh, square };

// One [rows x head_dim] matrix per batch index b, starting at data + offsets[b] (in elements), its
// rows `row_stride` elements apart and head_dim contiguous. `offsets` is host memory.
template <typename Pointer>
struct Matrices {
  Pointer data = nullptr;
  const std::int64_t* offsets = nullptr;
  std::int64_t row_stride = 0;
};
using InMatrices = Matrices<const void*>;
using OutMatrices = Matrices<void*>;

// Sizes of one attention call. Query i (of tq) sits at key position i + query_offset and attends
// the keys up to that position (0..tk-1 clamped: query_offset >= tk - 1 sees every key, a query
// before key 0 sees none: its output is 0 and its log-sum-exp -inf); scores are scaled by `scale`.
// Query rows are processed `block_rows` at a time so that only a [block_rows x tk] block of scores
// exists at once (CPU; CUDA tiles keys too).
struct AttentionSizes {
  DType dtype = DType::f32;
  std::int64_t batches = 0, tq = 0, tk = 0, head_dim = 0;
  std::int64_t query_offset = 0;  // tk - tq: the last tq positions of a causal sequence
  double scale = 1.0;
  std::int64_t block_rows = 128;
  SumTree tree;  // deterministic mode: every inner sum (head_dim, keys, query rows) in tree order
};

// Rotary embedding in place: for every index of the other axes (`outer_count` offsets, host
// memory), every position s < seq_len and every pair i < rotary_dims / 2, the pair at head_dim
// indices (2i, 2i+1) turns by direction * (s + position_offset) * base^(-2i / rotary_dims).
struct RotarySizes {
  DType dtype = DType::f32;
  std::int64_t seq_len = 0, seq_stride = 0, head_dim_stride = 0;
  std::int64_t rotary_dims = 0, position_offset = 0;
  double base = 10000.0;
  double direction = 1.0;  // -1: the inverse rotation
};

// The caller's block of the vocabulary, [start, start + local); ids outside it read as zero and
// scatter nothing (the vocab-parallel form: another device holds those rows).
struct VocabRange {
  std::int64_t start = 0, local = 0;
  bool holds(std::int64_t id) const { return id >= start && id < start + local; }
};

// Where picked elements sit: the layout iterates the targets' axes; strides[0] are the targets'
// (and the picked values'), strides[1] the logits'; vocab_stride steps along the vocab.
struct PickLayout {
  Layout<2> layout;
  std::int64_t vocab_stride = 0;
};

// One AdamW step (nn::AdamW's formula) on f32 master weights, out of place:
//   m' = b1 m + (1 - b1) g;  v' = b2 v + (1 - b2) g^2;
//   p' = p - lr ((m' / c1) / (sqrt(v' / c2) + eps) + weight_decay p),  c_i = 1 - b_i^step.
struct AdamWStep {
  double lr = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0;
  double correction1 = 1, correction2 = 1;
};

// GEMM in row-major terms: C (m x n, row stride ldc) = op(A) op(B) + beta C, op(A) m x k, op(B)
// k x n; `trans_a`: A is stored k x m. A batch of `batch` GEMMs steps stride_a/b/c elements.
struct GemmShape {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  std::int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  double beta = 0.0;
  // Deterministic mode: each C element's sum over k in this tree's order (leaves by fused
  // multiply-add from zero), independent of m, n, the batch and the threads; then + beta C.
  SumTree tree;
};

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual Backend backend() const = 0;
  // Whether host code may read and write this device's memory directly (CPU devices).
  virtual bool host_accessible() const { return backend() == Backend::cpu; }
  // Makes this device the calling thread's current one (CUDA: cudaSetDevice), once per worker
  // thread, so that later calls need not switch devices (nor touch GPU 0's context).
  virtual void bind_thread() {}
  // Whether the kernels compute `dtype` themselves; the op layer widens other floating dtypes to
  // f32 first (the CPU computes bf16 in f32, but for its GEMM and binary ops: gemm_computes,
  // binary_computes).
  virtual bool computes(DType dtype) const = 0;
  // Whether gemm takes `dtype` itself even where computes() says no: bf16 on a CPU with bf16
  // dot-product instructions (bf16 operands, f32 sums, one rounding per element, as on a GPU).
  virtual bool gemm_computes(DType dtype) const { return computes(dtype); }
  // Whether binary takes `dtype` itself even where computes() says no: bf16 on the CPU, widened
  // to f32 in registers and rounded once (the bits of widening the operands first).
  virtual bool binary_computes(DType dtype) const { return computes(dtype); }

  // --- memory ---
  virtual void copy_from_host(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;  // waits for the data
  virtual void copy_bytes(void* dst, const void* src, std::size_t bytes) = 0;          // within the device
  virtual void synchronize() = 0;  // returns when every enqueued kernel has finished

  // --- elementwise and layout ---
  // out (contiguous in the layout's order) = op(a, b), a and b read with the layout's strides.
  virtual void binary(BinaryOp op, DType dtype, const void* a, const void* b, void* out, const Layout<3>& layout) = 0;
  virtual void unary(UnaryOp op, DType dtype, const void* in, void* out, std::int64_t n) = 0;
  virtual void fill(DType dtype, void* out, std::int64_t n, double value) = 0;
  // dst = src element by element, src read with strides[0], dst written with strides[1].
  virtual void copy(std::size_t element_size, const void* src, void* dst, const Layout<2>& layout) = 0;
  virtual void convert(DType from, const void* src, DType to, void* dst, std::int64_t n) = 0;
  // out = cond != 0 ? a : b, read with strides[0..2], written with strides[3].
  virtual void where(DType dtype, const void* cond, const void* a, const void* b, void* out, const Layout<4>& layout) = 0;
  // out[j] = op over the input elements that map to j; strides[0] are the input's, strides[1] the
  // output's (0 along reduced dimensions). out is initialised here. A sum with `tree.on` adds each
  // output's inputs in the tree's order over their row-major index (max and min need no order).
  virtual void reduce(ReduceOp op, DType dtype, const void* in, void* out, std::int64_t out_count, const Layout<2>& layout,
                      const SumTree& tree) = 0;
  // dst[i] = op(dst[i], src[i]) (the communicators' reduction).
  virtual void accumulate(ReduceOp op, DType dtype, void* dst, const void* src, std::size_t n) = 0;

  // --- optimizer ---
  // p_out, m_out, v_out (not overlapping the inputs) from p, m, v and g, n f32 elements each, in one
  // pass: 7 n reads and writes where the op-by-op form moves about 36 n.
  virtual void adamw(std::int64_t n, const float* p, const float* m, const float* v, const float* g, float* p_out, float* m_out,
                     float* v_out, const AdamWStep& step) = 0;

  // --- contraction ---
  virtual void gemm(DType dtype, const GemmShape& shape, const void* a, const void* b, void* c) = 0;

  // --- transformer pieces (each forward beside its backward) ---
  virtual void gelu_forward(DType dtype, std::int64_t n, const void* x, void* y) = 0;
  virtual void gelu_backward(DType dtype, std::int64_t n, const void* x, const void* dy, void* dx) = 0;

  // Rows of length n, the normalised axis innermost. mean and rstd: one per row (for the backward),
  // f32 for bf16 rows (as lse), else of the dtype.
  virtual void layer_norm_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale,
                                  const void* bias, double eps, void* y, void* mean, void* rstd) = 0;
  // dx per row; dscale, dbias (overwritten) summed over rows, in `rows_tree`'s order when on.
  virtual void layer_norm_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale,
                                   const void* mean, const void* rstd, const void* dy, void* dx, void* dscale,
                                   void* dbias, const SumTree& rows_tree) = 0;
  // softmax (or log_softmax when `log`) per row; the backward from the forward's output y.
  virtual void softmax_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, void* y, bool log) = 0;
  virtual void softmax_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* y, const void* dy, void* dx,
                                bool log) = 0;

  // Row kernels of the index ops over `rows` contiguous rows of n elements. A backend without them
  // keeps these defaults, which return false: the op layer then composes the op from the kernels
  // above (CUDA does, for now).
  // Prefix sums of each row (exclusive: of the elements before; reverse: from the row's end).
  virtual bool scan_rows(DType /*dtype*/, std::int64_t /*rows*/, std::int64_t /*n*/, const void* /*x*/, void* /*y*/,
                         bool /*exclusive*/, bool /*reverse*/) {
    return false;
  }
  // The k largest (smallest) elements of each row in order, NaN first, ties by the lower index:
  // values (rows x k, the dtype) and their i32 indices.
  virtual bool top_k_rows(DType /*dtype*/, std::int64_t /*rows*/, std::int64_t /*n*/, std::int64_t /*k*/, bool /*largest*/,
                          const void* /*x*/, void* /*values*/, std::int32_t* /*indices*/) {
    return false;
  }

  // Elements of `sizes.dtype` the caller provides as scratch to the attention kernels.
  virtual std::int64_t attention_forward_scratch(const AttentionSizes& sizes) = 0;
  virtual std::int64_t attention_backward_scratch(const AttentionSizes& sizes) = 0;
  // out = softmax(q k^T * scale + causal mask at sizes.query_offset) v; lse [batches x tq] (f32
  // for bf16 inputs, else the dtype): each row's log-sum-exp, all the backward needs besides q, k,
  // v and out.
  virtual void causal_attention_forward(const AttentionSizes& sizes, const InMatrices& q, const InMatrices& k,
                                        const InMatrices& v, const OutMatrices& out, void* lse, void* scratch) = 0;
  // dq, dk, dv (overwritten) from dout and dlse (the gradient of lse, lse's layout and dtype; null
  // when lse has none), the probabilities recomputed from q, k and lse.
  virtual void causal_attention_backward(const AttentionSizes& sizes, const InMatrices& q, const InMatrices& k,
                                         const InMatrices& v, const InMatrices& out, const InMatrices& dout,
                                         const void* lse, const void* dlse, const OutMatrices& dq, const OutMatrices& dk,
                                         const OutMatrices& dv, void* scratch) = 0;
  virtual void rotary_in_place(const RotarySizes& sizes, void* data, const std::int64_t* outer_offsets,
                               std::int64_t outer_count) = 0;

  // out row i (row_bytes bytes) = table row ids[i] - start, or zeros. ids: i32 on the device.
  virtual void gather_rows(const std::int32_t* ids, std::int64_t count, VocabRange range, const void* table,
                           std::size_t row_bytes, void* out) = 0;
  // table_grad (local x row elements) = 0, then table_grad row ids[i] - start += grad row i. With
  // `tree.on`, each table row is the tree sum over i in [0, count) of (grad row i where ids[i]
  // picks it, else nothing): a subtree picking nothing is +0 and still added, as a psum adds the
  // zero rows of a device whose block picked nothing.
  virtual void scatter_add_rows(DType dtype, const std::int32_t* ids, std::int64_t count, VocabRange range,
                                const void* grad, std::int64_t row, void* table_grad, const SumTree& tree) = 0;
  // out[j] = logits[at target j], or zero outside the range; any element type.
  virtual void pick_forward(const std::int32_t* targets, VocabRange range, const PickLayout& where, const void* logits,
                            std::size_t element_size, void* out) = 0;
  // logits_grad = 0, then logits_grad[at target j] += grad[j] for targets in the range.
  virtual void pick_backward(DType dtype, const std::int32_t* targets, VocabRange range, const PickLayout& where,
                             const void* grad, void* logits_grad, std::int64_t logits_count) = 0;
};

// The CPU kernels (kernels/cpu): host memory, every call finished when it returns.
const std::shared_ptr<Kernels>& cpu_kernels_ptr();

// The element offset of every index of `rank` dimensions (row-major over them) with the given
// sizes and strides: how the op layer lists the matrices of a batch (host memory).
std::vector<std::int64_t> strided_offsets(const std::int64_t* sizes, const std::int64_t* strides, int rank);

}  // namespace nax::kernels
