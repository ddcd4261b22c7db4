// Fused softmax attention by axis names, its backward next to it: causal_attention over a whole
// sequence, and attention_block over a block of queries and a block of keys (each query row's
// log-sum-exp returned too) with combine_attention, the step of an online softmax. Each of q, k, v
// is read as one strided [seq x head_dim] matrix per batch index (every axis other than seq and
// head_dim) straight from its memory, in whatever order the batch axes come; only an operand
// whose head_dim is not its last (unit-stride) axis is permuted first.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "deterministic/deterministic.h"
#include "nax/ops/index_ops.h"
#include "nax/ops/transformer_ops.h"
#include "ops/tape.h"
#include "ops/internal.h"

namespace nax {

namespace {

constexpr std::string_view kCausal = "causal_attention", kBlock = "attention_block", kCombine = "combine_attention";

struct AttentionAxes {
  std::string seq, head_dim;
  std::vector<Axis> batch;  // q's other axes, in q's order
};

// --- checks ---

void check_same_axes(std::string_view op, const Tensor& q, const Tensor& other, const char* name, const AttentionAxes& axes) {
  for (const auto& axis : q.shape().axes()) {
    const int i = other.shape().index_of(axis.name);
    if (i < 0) fail(op, "{} lacks axis '{}' of q: q {}, {} {}", name, axis.name, q.str(), name, other.str());
    if (axis.name != axes.seq && other.shape()[i].size != axis.size)
      fail(op, "axis '{}' has size {} in q but {} in {}: q {}, {} {}", axis.name, axis.size, other.shape()[i].size, name, q.str(), name,
           other.str());
  }
  for (const auto& axis : other.shape().axes())
    if (!q.shape().has(axis.name)) fail(op, "{} has axis '{}' that q lacks: q {}, {} {}", name, axis.name, q.str(), name, other.str());
}

void check_not_cut(std::string_view op, const Tensor& x, const char* name, const std::string& axis, std::string_view instead) {
  const auto mesh_axes = x.vary().split_mesh_axes(axis);
  if (!mesh_axes.empty())
    fail(op, "axis '{}' of {} is cut over mesh axis '{}': {}; {}", axis, name, mesh_axes.front(), x.str(), instead);
}

AttentionAxes check_attention(std::string_view op, const Tensor& q, const Tensor& k, const Tensor& v, const std::string& seq,
                              const std::string& head_dim) {
  detail::check_same_dtype(op, q, k);
  detail::check_same_dtype(op, q, v);
  if (!is_floating(q.dtype())) fail(op, "needs a floating dtype (f32, f64, bf16): {}", detail::describe({&q, &k, &v}));
  if (seq == head_dim) fail(op, "seq and head_dim are the same axis '{}': {}", seq, detail::describe({&q, &k, &v}));
  for (const auto* name : {&seq, &head_dim}) q.shape().require(*name, op);
  AttentionAxes axes{seq, head_dim, {}};
  check_same_axes(op, q, k, "k", axes);
  check_same_axes(op, q, v, "v", axes);
  if (k.size(seq) != v.size(seq))
    fail(op, "k and v differ in length along '{}' ({} and {}): k {}, v {}", seq, k.size(seq), v.size(seq), k.str(), v.str());
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}})
    check_not_cut(op, *t, name, head_dim, "attention needs whole heads (all_gather it first, or cut a batch axis instead)");
  for (const auto& axis : q.shape().axes())
    if (axis.name != seq && axis.name != head_dim) axes.batch.push_back(axis);
  return axes;
}

// causal_attention attends a whole sequence: its queries are the last positions of the keys'.
void check_whole_sequence(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionAxes& axes) {
  if (k.size(axes.seq) < q.size(axes.seq))
    fail(kCausal, "k and v are shorter along '{}' ({}) than q ({}): every query needs its own position among the keys: q {}, k {}",
         axes.seq, k.size(axes.seq), q.size(axes.seq), q.str(), k.str());
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}})
    check_not_cut(kCausal, *t, name, axes.seq,
                  "causal_attention needs whole sequences (all_gather it first, or attend block by block with attention_block and "
                  "combine_attention, as ring attention does)");
}

// attention_block's result is q's rows: cut as q's sequence is. Keys cut along the sequence are one
// block of keys per device, whatever block that is (the mask's offset says where it sits), so for
// the result they count as per-device values (Varying), not as a cut of the result's rows.
VaryType block_vary(const Tensor& q, const Tensor& k, const Tensor& v, const std::string& seq) {
  auto keys_as_blocks = [&seq](const Tensor& t) {
    VaryType vary = t.vary();
    for (const auto& m : vary.split_mesh_axes(seq)) vary.set_varying(m);
    return t.with_vary(vary);
  };
  const Tensor k_block = keys_as_blocks(k), v_block = keys_as_blocks(v);
  return detail::merge_vary(kBlock, {&q, &k_block, &v_block});
}

// --- layouts ---

// x in the dtype its device computes (see detail::widen), with head_dim moved last when it is not already, cut from the tape.
Tensor working_copy(const Tensor& x, const AttentionAxes& axes) {
  Tensor t = detail::widen(stop_gradient(x));
  auto names = t.shape().names();
  if (names.back() == axes.head_dim) return t;
  std::erase(names, axes.head_dim);
  names.push_back(axes.head_dim);
  return detail::permute_to(t, names);
}

// x (head_dim last) as one strided matrix per batch index, batch indices in q's order.
struct MatrixList {
  std::vector<std::int64_t> offsets;
  std::int64_t row_stride = 0;
  kernels::InMatrices in(const Tensor& x) const { return {x.raw(), offsets.data(), row_stride}; }
  kernels::OutMatrices out(Tensor& x) const { return {x.raw_mutable(), offsets.data(), row_stride}; }
};

MatrixList matrices_of(const Tensor& x, const AttentionAxes& axes) {
  const kernels::Dims strides = detail::strides_in_order(x.shape(), axes.batch);
  const kernels::Dims sizes = detail::sizes_of(axes.batch);
  const auto all_strides = x.shape().strides();
  return {kernels::strided_offsets(sizes.data(), strides.data(), static_cast<int>(axes.batch.size())),
          all_strides[static_cast<std::size_t>(x.shape().index_of(axes.seq))]};
}

// The lse's shape: the batch axes in q's order, then seq (the kernels' [batches x tq] layout).
Shape lse_shape(const AttentionAxes& axes, std::int64_t tq) {
  std::vector<Axis> lse_axes = axes.batch;
  lse_axes.push_back({axes.seq, tq});
  return Shape(lse_axes);
}

// Query rows per block: smaller blocks skip more of the masked half of the scores, larger ones
// make faster GEMMs; an eighth of the keys, within [32, 128], did best on the bench at 256-1024.
std::int64_t block_rows_for(std::int64_t keys) { return std::clamp<std::int64_t>(keys / 8, 32, 128); }

kernels::AttentionSizes sizes_of(const Tensor& q, const Tensor& k, const AttentionAxes& axes, std::int64_t query_offset) {
  kernels::AttentionSizes s;
  s.dtype = q.dtype();
  s.batches = Shape(axes.batch).numel();
  s.tq = q.size(axes.seq);
  s.tk = k.size(axes.seq);
  s.head_dim = q.size(axes.head_dim);
  s.query_offset = query_offset;
  s.scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  s.block_rows = std::max<std::int64_t>(1, std::min(s.tq, block_rows_for(s.tk)));
  // head_dim, keys and query rows are never cut over a mesh: no forced halvings, full-length leaves
  if (deterministic::on()) s.tree = SumTree{.on = true, .forced = 0};
  return s;
}

// No scores: nothing for the kernels (a query that sees no key has output 0 and lse -inf).
bool nothing_to_compute(const kernels::AttentionSizes& s) { return s.batches == 0 || s.head_dim == 0 || s.tq == 0 || s.tk == 0; }

// `t` (a fresh result) with every element `value`: the results when there are no scores.
void fill(Tensor& t, double value) { detail::kernels_of(t).fill(t.dtype(), t.raw_mutable(), t.numel(), value); }

Tensor scratch(const Tensor& like, std::int64_t elements) {
  return Tensor::empty(Shape{{"scratch", elements}}, like.dtype(), like.device_ptr());
}

// --- forward and backward ---

struct Forward {
  Tensor out;  // q's shape and order, q's dtype
  Tensor lse;  // lse_shape, in the compute dtype (f32 for bf16)
};

Forward attention_forward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const AttentionAxes& axes, const VaryType& vary,
                          std::int64_t query_offset) {
  const Tensor q = working_copy(q_in, axes), k = working_copy(k_in, axes), v = working_copy(v_in, axes);
  const kernels::AttentionSizes s = sizes_of(q, k, axes, query_offset);
  Tensor out = detail::make_result(q.shape(), q.dtype(), vary, q.device_ptr());
  const DType lse_dtype = q.dtype() == DType::bf16 ? DType::f32 : q.dtype();
  Tensor lse = detail::make_result(lse_shape(axes, s.tq), lse_dtype, vary, q.device_ptr());
  if (nothing_to_compute(s)) {
    fill(out, 0.0);
    fill(lse, -std::numeric_limits<double>::infinity());
  } else {
    const MatrixList qm = matrices_of(q, axes), km = matrices_of(k, axes), vm = matrices_of(v, axes);
    Tensor work = scratch(q, detail::kernels_of(q).attention_forward_scratch(s));
    detail::kernels_of(q).causal_attention_forward(s, qm.in(q), km.in(k), vm.in(v), qm.out(out), lse.raw_mutable(), work.raw_mutable());
  }
  return {detail::narrow_to(detail::permute_to(out, q_in.shape().names()), q_in.dtype()), lse};
}

// What the backward reads besides the gradients.
struct Saved {
  Tensor q, k, v, out, lse;
  AttentionAxes axes;
  VaryType vary;
  std::int64_t query_offset = 0;
};

// Gradients for q, k and v in their working layouts (autodiff permutes and casts them back), from
// the gradient of out and that of lse (undefined when it has none).
std::vector<Tensor> attention_backward(const Tensor& g_in, const Tensor& g_lse, const Saved& f) {
  const Tensor q = working_copy(f.q, f.axes), k = working_copy(f.k, f.axes), v = working_copy(f.v, f.axes);
  const Tensor out = working_copy(f.out, f.axes), g = working_copy(g_in, f.axes);
  const kernels::AttentionSizes s = sizes_of(q, k, f.axes, f.query_offset);
  Tensor dq = detail::make_result(q.shape(), q.dtype(), f.vary, q.device_ptr());
  Tensor dk = detail::make_result(k.shape(), k.dtype(), f.vary, k.device_ptr());
  Tensor dv = detail::make_result(v.shape(), v.dtype(), f.vary, v.device_ptr());
  if (nothing_to_compute(s)) {
    for (Tensor* t : {&dq, &dk, &dv}) fill(*t, 0.0);
  } else {
    const MatrixList qm = matrices_of(q, f.axes), km = matrices_of(k, f.axes), vm = matrices_of(v, f.axes);
    const MatrixList om = matrices_of(out, f.axes), gm = matrices_of(g, f.axes);
    const Tensor dlse = g_lse.defined() ? detail::permute_to(stop_gradient(g_lse), f.lse.shape().names()) : Tensor();
    Tensor work = scratch(q, detail::kernels_of(q).attention_backward_scratch(s));
    detail::kernels_of(q).causal_attention_backward(s, qm.in(q), km.in(k), vm.in(v), om.in(out), gm.in(g), f.lse.raw(),
                                                    dlse.defined() ? dlse.raw() : nullptr, qm.out(dq), km.out(dk), vm.out(dv),
                                                    work.raw_mutable());
  }
  return {f.q.requires_grad() ? dq : Tensor(), f.k.requires_grad() ? dk : Tensor(), f.v.requires_grad() ? dv : Tensor()};
}

std::int64_t query_offset_of(const AttentionMask& mask, std::int64_t keys) {
  return mask.all_keys ? std::max<std::int64_t>(keys - 1, 0) : mask.query_offset;
}

// The two outputs of attention_block on the tape. The backward of q, k and v needs both gradients
// at once, so lse's node (made after out's, so run first) keeps its gradient for out's node and
// hands out a zero gradient: out's node then runs even when only lse was used.
AttentionBlock record_block(const Forward& f, const Saved& saved) {
  auto lse_gradient = std::make_shared<Tensor>();
  Tensor out = autodiff::record(std::string(kBlock), f.out, {saved.q, saved.k, saved.v}, [saved, lse_gradient](const Tensor& g) {
    const Tensor g_lse = *lse_gradient;
    *lse_gradient = Tensor();
    return attention_backward(g, g_lse, saved);
  });
  Tensor lse = autodiff::record(std::string(kBlock) + " lse", f.lse, {out}, [lse_gradient, like = stop_gradient(f.out)](const Tensor& g) {
    *lse_gradient = g;
    return std::vector<Tensor>{zeros_like(like)};
  });
  return {out, lse};
}

// --- combine ---

void check_combinable(const AttentionBlock& a, const AttentionBlock& b) {
  for (const auto* t : {&a.out, &a.lse, &b.out, &b.lse})
    if (!t->defined()) fail(kCombine, "a block's out or lse is undefined");
  for (const auto& [x, y, what] : {std::tuple{&a.out, &b.out, "out"}, {&a.lse, &b.lse, "lse"}})
    if (!x->shape().same_axes(y->shape()))
      fail(kCombine, "the blocks' {} differ in axes: {} and {} (blocks of the same queries have the same)", what, x->str(), y->str());
  for (const auto* block : {&a, &b}) {
    int extra = 0;
    for (const auto& axis : block->out.shape().axes()) {
      const int i = block->lse.shape().index_of(axis.name);
      if (i < 0) ++extra;
      else if (block->lse.shape()[i].size != axis.size) extra = -1;
    }
    if (extra != 1 || block->lse.rank() + 1 != block->out.rank())
      fail(kCombine, "lse must have out's axes but head_dim, as attention_block returns them: out {}, lse {}", block->out.str(),
           block->lse.str());
  }
}

}  // namespace

// The backward recomputes the probabilities from q, k and the saved log-sum-exp of each row.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, const std::string& seq, const std::string& head_dim) {
  const auto op_span = detail::enter_op(kCausal, {&q, &k, &v});
  const AttentionAxes axes = check_attention(kCausal, q, k, v, seq, head_dim);
  check_whole_sequence(q, k, v, axes);
  const VaryType vary = detail::merge_vary(kCausal, {&q, &k, &v});
  const std::int64_t query_offset = k.size(seq) - q.size(seq);
  Forward f = attention_forward(q, k, v, axes, vary, query_offset);
  if (!autodiff::any_requires_grad({&q, &k, &v})) return f.out;
  return autodiff::record(std::string(kCausal), f.out, {q, k, v},
                          [saved = Saved{q, k, v, stop_gradient(f.out), f.lse, axes, vary, query_offset}](const Tensor& g) {
                            return attention_backward(g, Tensor(), saved);
                          });
}

AttentionBlock attention_block(const Tensor& q, const Tensor& k, const Tensor& v, const std::string& seq, const std::string& head_dim,
                               AttentionMask mask) {
  const auto op_span = detail::enter_op(kBlock, {&q, &k, &v});
  const AttentionAxes axes = check_attention(kBlock, q, k, v, seq, head_dim);
  if (q.size(head_dim) == 0) fail(kBlock, "head_dim '{}' has size 0: q {}", head_dim, q.str());
  const VaryType vary = block_vary(q, k, v, seq);
  const std::int64_t query_offset = query_offset_of(mask, k.size(seq));
  Forward f = attention_forward(q, k, v, axes, vary, query_offset);
  if (!autodiff::any_requires_grad({&q, &k, &v})) return {f.out, f.lse};
  return record_block(f, Saved{q, k, v, stop_gradient(f.out), f.lse, axes, vary, query_offset});
}

// out = (e^(lse_a - m) out_a + e^(lse_b - m) out_b) / (e^(lse_a - m) + e^(lse_b - m)) and
// lse = m + log(that sum), with m the larger lse (a shift only: no gradient through it). A query
// that neither block lets see a key keeps out 0 and lse -inf, with no NaN either way.
AttentionBlock combine_attention(const AttentionBlock& a, const AttentionBlock& b) {
  const auto op_span = detail::enter_op(kCombine, {&a.out, &a.lse, &b.out, &b.lse});
  check_combinable(a, b);
  const Tensor top = stop_gradient(maximum(a.lse, b.lse));
  const Tensor none = eq(top, full_like(top, -std::numeric_limits<double>::infinity()));
  const Tensor shift = where(none, zeros_like(top), top);
  const Tensor weight_a = exp(a.lse - shift), weight_b = exp(b.lse - shift);
  const Tensor total = where(none, ones_like(top), weight_a + weight_b);
  const Tensor lse = where(none, top, shift + log(total));
  const DType dtype = a.out.dtype();
  const Tensor out = a.out * cast(weight_a / total, dtype) + b.out * cast(weight_b / total, dtype);
  return {out, lse};
}

}  // namespace nax
