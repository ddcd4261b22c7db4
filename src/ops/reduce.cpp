// Reductions over named axes. Reducing over a Split axis gives a Partial result, a partial sum
// (sum) or a local mean (mean), or per-device extremes (max, min: Varying).
#include <optional>
#include <set>

#include <fmt/format.h>

#include "deterministic/deterministic.h"
#include "ops/tape.h"
#include "ops/internal.h"

namespace nax {

namespace {

// What reducing a Split axis leaves over its mesh axes: a partial sum (sum), a local mean (mean),
// or per-device extremes (max, min: Varying, for pmax / pmin).
std::optional<PartialKind> reduced_to(ReduceOp op, bool mean) {
  if (op != ReduceOp::sum) return std::nullopt;
  return mean ? PartialKind::mean : PartialKind::sum;
}

// sum and mean are linear: a partial value stays one; max and min are not.
OnPartial on_partial(ReduceOp op) { return op == ReduceOp::sum ? OnPartial::scale : OnPartial::refuse; }

Tensor reduce_forward(ReduceOp op, std::string_view name, const Tensor& x_in, const Names& axes) {
  const auto op_span = detail::enter_op(name, {{&x_in, on_partial(op)}});
  std::set<std::string> reduced;
  for (const auto& a : axes.list()) {
    x_in.shape().require(a, name);
    if (!reduced.insert(a).second) fail(name, "axis '{}' named twice in {} for {}", a, axes.str(), x_in.str());
  }
  if (detail::needs_widening(x_in)) return detail::narrow_to(reduce_forward(op, name, detail::widen(x_in), axes), DType::bf16);

  std::vector<Axis> kept;
  std::vector<std::string> walked;  // the reduced axes in the order the kernel walks them
  for (const auto& axis : x_in.shape().axes())
    (reduced.count(axis.name) ? walked.push_back(axis.name) : kept.push_back(axis));
  for (const auto& axis : x_in.shape().axes())
    if (reduced.count(axis.name) && axis.size == 0 && op != ReduceOp::sum)
      fail(name, "cannot reduce over the empty axis '{}' of {}", axis.name, x_in.str());
  Shape shape(kept);
  Tensor out = detail::make_result(shape, x_in.dtype(), detail::merge_vary(name, {&x_in}, axes.list(), reduced_to(op, name == "mean")),
                                  x_in.device_ptr());

  const kernels::Layout<2> layout = detail::layout_over(x_in.shape().axes(), x_in.shape(), shape);
  const SumTree tree = op == ReduceOp::sum ? deterministic::sum_tree(name, x_in, walked) : SumTree{};
  detail::kernels_of(out).reduce(op, x_in.dtype(), x_in.raw(), out.raw_mutable(), out.numel(), layout, tree);
  return out;
}

// sum: the gradient broadcast back. max/min: shared equally by the elements that attain it.
Tensor reduce(ReduceOp op, std::string_view name, const Tensor& x, const Names& axes) {
  Tensor out = reduce_forward(op, name, x, axes);
  if (!autodiff::any_requires_grad({&x})) return out;
  const bool reads_values = op != ReduceOp::sum;  // max and min read x and out again; sum only x's shape
  return autodiff::record(std::string(name), out, {x},
                          [op, x = autodiff::kept(x, reads_values), axes, out = autodiff::kept(stop_gradient(out), reads_values)](const Tensor& g) {
    Tensor spread = detail::broadcast_to(g, x.shape());
    if (op == ReduceOp::sum) return std::vector<Tensor>{spread};
    Tensor hit = eq(x, detail::broadcast_to(out, x.shape()));
    Tensor ties = detail::broadcast_to(sum(hit, axes), x.shape());
    return std::vector<Tensor>{spread * hit / ties};
  });
}

}  // namespace

Tensor sum(const Tensor& x, const Names& axes) { return reduce(ReduceOp::sum, "sum", x, axes); }
Tensor max(const Tensor& x, const Names& axes) { return reduce(ReduceOp::max, "max", x, axes); }
Tensor min(const Tensor& x, const Names& axes) { return reduce(ReduceOp::min, "min", x, axes); }

Tensor mean(const Tensor& x, const Names& axes) {
  if (x.defined() && !is_floating(x.dtype())) fail("mean", "needs a floating dtype, got {}", x.str());
  const auto op_span = detail::enter_op("mean", {{&x, OnPartial::scale}});  // the sum and the division: one op
  Tensor total = reduce(ReduceOp::sum, "mean", x, axes);
  std::int64_t count = 1;
  for (const auto& a : axes.list()) count *= x.shape().size(a);
  const Tensor mean = total / static_cast<double>(count);
  if (!deterministic::on()) return mean;
  // Deterministic mode: pmean takes the local sum, typed the partial sum it is (docs/determinism.md).
  VaryType partial = total.vary();
  bool local = false;
  for (const auto& m : total.vary().partial_mesh_axes())
    if (total.vary().local_mean(m)) partial.set_partial(m, PartialKind::sum), local = true;
  if (local) deterministic::keep_local_mean(mean, total.with_vary(partial), count);
  return mean;
}

}  // namespace nax

namespace nax::detail {

Tensor sum_to(const Tensor& g, const Shape& shape) {
  std::vector<std::string> extra;
  for (const auto& a : g.shape().axes())
    if (!shape.has(a.name)) extra.push_back(a.name);
  return extra.empty() ? g : sum(g, extra);
}

}  // namespace nax::detail
