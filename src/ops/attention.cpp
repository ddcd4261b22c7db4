// causal_attention: fused causal softmax attention by axis names, its backward next to it. Each of
// q, k, v is read as one strided [seq x head_dim] matrix per batch index (every axis other than
// seq and head_dim) straight from its memory, in whatever order the batch axes come; only an
// operand whose head_dim is not its last (unit-stride) axis is permuted first.
#include <algorithm>
#include <cmath>

#include "deterministic/deterministic.h"
#include "ops/tape.h"
#include "ops/internal.h"

namespace nax {

namespace {

constexpr std::string_view kOp = "causal_attention";

struct AttentionAxes {
  std::string seq, head_dim;
  std::vector<Axis> batch;  // q's other axes, in q's order
};

// --- checks ---

void check_same_axes(const Tensor& q, const Tensor& other, const char* name, const AttentionAxes& axes) {
  for (const auto& axis : q.shape().axes()) {
    const int i = other.shape().index_of(axis.name);
    if (i < 0) fail(kOp, "{} lacks axis '{}' of q: q {}, {} {}", name, axis.name, q.str(), name, other.str());
    if (axis.name != axes.seq && other.shape()[i].size != axis.size)
      fail(kOp, "axis '{}' has size {} in q but {} in {}: q {}, {} {}", axis.name, axis.size, other.shape()[i].size, name, q.str(), name,
           other.str());
  }
  for (const auto& axis : other.shape().axes())
    if (!q.shape().has(axis.name)) fail(kOp, "{} has axis '{}' that q lacks: q {}, {} {}", name, axis.name, q.str(), name, other.str());
}

void check_not_cut(const Tensor& x, const char* name, const std::string& axis) {
  const auto mesh_axes = x.vary().split_mesh_axes(axis);
  if (!mesh_axes.empty())
    fail(kOp, "axis '{}' of {} is cut over mesh axis '{}': {}; attention needs whole sequences and heads (all_gather it first, or cut a batch axis instead)",
         axis, name, mesh_axes.front(), x.str());
}

AttentionAxes check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const std::string& seq, const std::string& head_dim) {
  detail::check_same_dtype(kOp, q, k);
  detail::check_same_dtype(kOp, q, v);
  if (!is_floating(q.dtype())) fail(kOp, "needs a floating dtype (f32, f64, bf16): {}", detail::describe({&q, &k, &v}));
  if (seq == head_dim) fail(kOp, "seq and head_dim are the same axis '{}': {}", seq, detail::describe({&q, &k, &v}));
  for (const auto* name : {&seq, &head_dim}) q.shape().require(*name, kOp);
  AttentionAxes axes{seq, head_dim, {}};
  check_same_axes(q, k, "k", axes);
  check_same_axes(q, v, "v", axes);
  if (k.size(seq) != v.size(seq))
    fail(kOp, "k and v differ in length along '{}' ({} and {}): k {}, v {}", seq, k.size(seq), v.size(seq), k.str(), v.str());
  if (k.size(seq) < q.size(seq))
    fail(kOp, "k and v are shorter along '{}' ({}) than q ({}): every query needs its own position among the keys: q {}, k {}", seq,
         k.size(seq), q.size(seq), q.str(), k.str());
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    check_not_cut(*t, name, seq);
    check_not_cut(*t, name, head_dim);
  }
  for (const auto& axis : q.shape().axes())
    if (axis.name != seq && axis.name != head_dim) axes.batch.push_back(axis);
  return axes;
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

// Query rows per block: smaller blocks skip more of the masked half of the scores, larger ones
// make faster GEMMs; an eighth of the keys, within [32, 128], did best on the bench at 256-1024.
std::int64_t block_rows_for(std::int64_t keys) { return std::clamp<std::int64_t>(keys / 8, 32, 128); }

kernels::AttentionSizes sizes_of(const Tensor& q, const Tensor& k, const AttentionAxes& axes) {
  kernels::AttentionSizes s;
  s.dtype = q.dtype();
  s.batches = Shape(axes.batch).numel();
  s.tq = q.size(axes.seq);
  s.tk = k.size(axes.seq);
  s.head_dim = q.size(axes.head_dim);
  s.scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  s.block_rows = std::max<std::int64_t>(1, std::min(s.tq, block_rows_for(s.tk)));
  // head_dim, keys and query rows are never cut over a mesh: no forced halvings, full-length leaves
  if (deterministic::on()) s.tree = SumTree{.on = true, .forced = 0};
  return s;
}

bool nothing_to_compute(const kernels::AttentionSizes& s) { return s.batches == 0 || s.head_dim == 0; }

Tensor scratch(const Tensor& like, std::int64_t elements) {
  return Tensor::empty(Shape{{"scratch", elements}}, like.dtype(), like.device_ptr());
}

// --- forward and backward ---

struct Forward {
  Tensor out;  // q's shape and order, q's dtype
  Tensor lse;  // [batch indices x tq], in the compute dtype (f32 for bf16)
};

Forward attention_forward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const AttentionAxes& axes, const VaryType& vary) {
  const Tensor q = working_copy(q_in, axes), k = working_copy(k_in, axes), v = working_copy(v_in, axes);
  const kernels::AttentionSizes s = sizes_of(q, k, axes);
  Tensor out = detail::make_result(q.shape(), q.dtype(), vary, q.device_ptr());
  const DType lse_dtype = q.dtype() == DType::bf16 ? DType::f32 : q.dtype();
  Tensor lse = Tensor::empty(Shape{{"rows", s.batches * s.tq}}, lse_dtype, q.device_ptr());
  if (!nothing_to_compute(s)) {
    const MatrixList qm = matrices_of(q, axes), km = matrices_of(k, axes), vm = matrices_of(v, axes);
    Tensor work = scratch(q, detail::kernels_of(q).attention_forward_scratch(s));
    detail::kernels_of(q).causal_attention_forward(s, qm.in(q), km.in(k), vm.in(v), qm.out(out), lse.raw_mutable(), work.raw_mutable());
  }
  return {detail::narrow_to(detail::permute_to(out, q_in.shape().names()), q_in.dtype()), lse};
}

// Gradients for q, k and v in their working layouts (autodiff permutes and casts them back).
std::vector<Tensor> attention_backward(const Tensor& g_in, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& out_in,
                                       const Tensor& lse, const AttentionAxes& axes, const VaryType& vary) {
  const Tensor q = working_copy(q_in, axes), k = working_copy(k_in, axes), v = working_copy(v_in, axes);
  const Tensor out = working_copy(out_in, axes), g = working_copy(g_in, axes);
  const kernels::AttentionSizes s = sizes_of(q, k, axes);
  Tensor dq = detail::make_result(q.shape(), q.dtype(), vary, q.device_ptr());
  Tensor dk = detail::make_result(k.shape(), k.dtype(), vary, k.device_ptr());
  Tensor dv = detail::make_result(v.shape(), v.dtype(), vary, v.device_ptr());
  if (!nothing_to_compute(s)) {
    const MatrixList qm = matrices_of(q, axes), km = matrices_of(k, axes), vm = matrices_of(v, axes);
    const MatrixList om = matrices_of(out, axes), gm = matrices_of(g, axes);
    Tensor work = scratch(q, detail::kernels_of(q).attention_backward_scratch(s));
    detail::kernels_of(q).causal_attention_backward(s, qm.in(q), km.in(k), vm.in(v), om.in(out), gm.in(g), lse.raw(), qm.out(dq), km.out(dk),
                                   vm.out(dv), work.raw_mutable());
  }
  return {q_in.requires_grad() ? dq : Tensor(), k_in.requires_grad() ? dk : Tensor(), v_in.requires_grad() ? dv : Tensor()};
}

}  // namespace

// The backward recomputes the probabilities from q, k and the saved log-sum-exp of each row.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, const std::string& seq, const std::string& head_dim) {
  const auto op_span = detail::enter_op(kOp, {&q, &k, &v});
  const AttentionAxes axes = check_attention(q, k, v, seq, head_dim);
  const VaryType vary = detail::merge_vary(kOp, {&q, &k, &v});
  Forward f = attention_forward(q, k, v, axes, vary);
  if (!autodiff::any_requires_grad({&q, &k, &v})) return f.out;
  return autodiff::record(std::string(kOp), f.out, {q, k, v},
                          [q, k, v, out = stop_gradient(f.out), lse = f.lse, axes, vary](const Tensor& g) {
                            return attention_backward(g, q, k, v, out, lse, axes, vary);
                          });
}

}  // namespace nax
