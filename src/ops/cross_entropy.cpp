// pick (the logit of each target, vocab-parallel like embedding) and the vocab-parallel
// cross-entropy composed of primitives as mesh-transformer-jax does it: pmax of the
// local max, psum of the local sums of exponentials and of the picked logits. Logits are never
// gathered; the max is a stop_gradient value, so the gradient is the usual softmax - one_hot.
#include <algorithm>

#include <fmt/format.h>

#include "ops/tape.h"
#include "nax/ops/collectives.h"
#include "nax/ops/transformer_ops.h"
#include "ops/row_ops.h"
#include "ops/vocab_parallel.h"

namespace nax {

namespace {

// targets must have exactly the logits' axes other than `vocab`, of equal sizes (in any order).
void check_targets(std::string_view op, const Tensor& logits, const Tensor& targets, const std::string& vocab) {
  detail::check_floating(op, logits);
  logits.shape().require(vocab, op);
  const Shape expected = detail::shape_without(logits.shape(), vocab);
  if (!targets.shape().same_axes(expected))
    fail(op, "targets {} must have exactly the axes of the logits {} other than '{}', i.e. {} in any order", targets.str(),
         logits.str(), vocab, expected.str());
}

kernels::PickLayout pick_layout(const Shape& logits, const Shape& targets, const std::string& vocab) {
  kernels::PickLayout where;
  where.layout = detail::layout_over(targets.axes(), targets, logits);
  where.vocab_stride = logits.strides()[static_cast<std::size_t>(logits.index_of(vocab))];
  return where;
}

Tensor pick_backward(const Tensor& g, const Tensor& logits, const Tensor& targets, const kernels::PickLayout& where,
                     const kernels::VocabRange& range) {
  const Tensor dy = detail::widen(g);
  Tensor grad = detail::make_result(logits.shape(), dy.dtype(), detail::scattered_gradient_vary(logits, g), logits.device_ptr());
  detail::kernels_of(grad).pick_backward(dy.dtype(), targets.data<std::int32_t>(), range, where, dy.raw(), grad.raw_mutable(), grad.numel());
  return grad;
}

void check_mesh_axes(const Tensor& logits, const std::string& vocab, const std::vector<std::string>& mesh_axes) {
  auto cuts = logits.vary().split_mesh_axes(vocab);
  auto given = mesh_axes;
  std::sort(cuts.begin(), cuts.end());
  std::sort(given.begin(), given.end());
  if (cuts != given)
    fail("cross_entropy", "mesh_axes ({}) must be the mesh axes that cut the vocab axis '{}' of the logits {}, which are ({}){}",
         fmt::join(mesh_axes, ", "), vocab, logits.str(), fmt::join(logits.vary().split_mesh_axes(vocab), ", "),
         cuts.empty() ? ": the vocab is whole on every device, pass no mesh axes" : "");
}

}  // namespace

Tensor pick(const Tensor& logits, const Tensor& targets, const std::string& vocab) {
  const auto op_span = detail::enter_op("pick", {{&logits, OnPartial::move}, &targets});
  check_targets("pick", logits, targets, vocab);
  const detail::VocabBlock block = detail::vocab_block("pick", logits, vocab);
  detail::check_ids("pick", "target", targets, block, logits, vocab);
  const VaryType vary = detail::merge_vary("pick", {&logits, &targets}, {vocab});
  const kernels::PickLayout where = pick_layout(logits.shape(), targets.shape(), vocab);
  Tensor out = detail::make_result(targets.shape(), logits.dtype(), vary, logits.device_ptr());
  detail::kernels_of(out).pick_forward(targets.data<std::int32_t>(), block.range, where, logits.raw(), dtype_size(logits.dtype()), out.raw_mutable());
  if (!autodiff::any_requires_grad({&logits})) return out;
  return autodiff::record("pick", out, {logits},
                          [logits = logits.without_data(), targets, where, range = block.range](const Tensor& g) {  // its shape only
                            return std::vector<Tensor>{pick_backward(g, logits, targets, where, range)};
                          });
}

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets, const std::string& vocab,
                     const std::vector<std::string>& mesh_axes) {
  const auto op_span = detail::enter_op("cross_entropy", {&logits_in, &targets});
  check_targets("cross_entropy", logits_in, targets, vocab);
  check_mesh_axes(logits_in, vocab, mesh_axes);
  if (targets.device().host_accessible())  // a target outside the vocabulary is named as cross_entropy's, not pick's
    detail::check_ids("cross_entropy", "target", targets, detail::vocab_block("cross_entropy", logits_in, vocab), logits_in, vocab);
  const Tensor logits = detail::widen(logits_in);  // bf16 computes in f32 (the cast is differentiable)
  Tensor m = max(stop_gradient(logits), vocab);
  Tensor picked = pick(logits, targets, vocab);
  if (!mesh_axes.empty()) m = pmax(m, mesh_axes);
  Tensor sum_exp = sum(exp(logits - m), vocab);
  if (!mesh_axes.empty()) {
    sum_exp = psum(sum_exp, mesh_axes);
    picked = psum(picked, mesh_axes);
  }
  const Tensor losses = log(sum_exp) + m - picked;
  return targets.rank() == 0 ? losses : mean(losses, targets.shape().names());
}

}  // namespace nax
