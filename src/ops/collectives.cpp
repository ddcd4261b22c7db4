// The named collectives: vary-type rules (docs/ops.md) and the data movement on top of the
// device's Communicator. Blocks along a non-leading tensor axis are packed into contiguous
// per-rank chunks before the call and unpacked after it. Over a group of one device (a mesh axis
// of size 1) only the vary type changes: no data moves and the communicator is not called.
#include "nax/ops/collectives.h"

#include <fmt/format.h>

#include <algorithm>

#include "deterministic/deterministic.h"
#include "ops/tape.h"
#include "ops/collective_forward.h"
#include "ops/internal.h"
#include "nax/trace/trace.h"

namespace nax {

namespace {

struct Context {
  Shard& shard;
  Communicator& comm;
  int n;
  Call call;  // passed with each of the communicator's calls
  trace::Span span;  // the collective's slice in the trace, until the collective returns
};

// The collective's slice: its operand (shape, dtype, vary type), mesh axes, group size and bytes.
trace::Span collective_span(std::string_view op, const Tensor* x, const Names& mesh_axes) {
  return trace::Span("collective", op, [&] {
    std::vector<std::string> axes;
    for (const auto& m : mesh_axes.list()) axes.push_back(trace::quote(m));
    return fmt::format("\"mesh_axes\": [{}], \"operand\": {}, \"vary\": {}, \"bytes\": {}", fmt::join(axes, ", "),
                       x != nullptr ? trace::quote(x->str()) : "null", x != nullptr ? trace::quote(x->vary().str()) : "null",
                       x != nullptr ? x->nbytes() : 0);
  });
}

// The running shard, after checking the operand and the mesh axes.
Shard& checked_shard(std::string_view op, const Tensor* x, const Names& mesh_axes) {
  Shard* shard = Shard::current();
  if (shard == nullptr) fail(op, "collectives run inside Runtime::run (over mesh axes {})", mesh_axes.str());
  if (x != nullptr) detail::check_operands(op, {x});
  shard->mesh().check_axes(mesh_axes.list(), op);
  return *shard;
}

// The call site of a collective: the user's call, or inside a collective's backward the forward
// call that it transposes (so that a backward mismatch names the user's line, labelled backward).
thread_local const CallSite* t_backward_site = nullptr;
// The group's number (Communicator::count_call) of the last forward call this thread made.
thread_local std::uint64_t t_last_call = 0;

}  // namespace

namespace detail {

CallSite site_of(const std::source_location& where) {
  return t_backward_site != nullptr ? *t_backward_site : CallSite{where.file_name(), where.line(), where.column(), nullptr};
}

CallSite transposing_site(CallSite forward) {
  forward.transposes = t_last_call;
  return forward;
}

BackwardOf::BackwardOf(const char* op, CallSite site) : site_(site), previous_(t_backward_site) {
  site_.backward_of = op;
  t_backward_site = &site_;
}

BackwardOf::~BackwardOf() { t_backward_site = previous_; }

}  // namespace detail

namespace {

using detail::BackwardOf;
using detail::site_of;
using detail::transposing_site;

// `out`, with its transpose backward(g) recorded when x needs a gradient, run as the backward of
// `op` (a literal) called at `site`.
template <typename Backward>
Tensor with_transpose(const char* op, const Tensor& x, const Tensor& out, const CallSite& site, Backward backward) {
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record(op, out, {x}, [op, site = transposing_site(site), backward](const Tensor& g) {
    BackwardOf scope(op, site);
    return std::vector<Tensor>{backward(g)};
  });
}

// The checked shard and the communicator of the group, told which named collective calls it and
// from where: the one place that builds what the group compares.
// `launch`: a started call's slice carries its ticket, which its completion's slice carries too.
Context enter(std::string_view op, const Tensor* x, const Names& mesh_axes, const CallSite& site, const detail::Launch* launch,
              std::string_view extra = {}) {
  trace::Span span = collective_span(op, x, mesh_axes);
  Shard& shard = checked_shard(op, x, mesh_axes);
  Communicator& comm = shard.comm(mesh_axes);
  const std::string call = x != nullptr ? fmt::format("{}({}, {}{})", op, x->str(), mesh_axes.str(), extra)
                                        : fmt::format("{}({}{})", op, mesh_axes.str(), extra);
  CallSite with_arguments = site;
  with_arguments.arguments = std::hash<std::string>{}(call);
  if (site.backward_of == nullptr) t_last_call = comm.count_call();
  if (span.active()) span.add_args(fmt::format("\"group_size\": {}", comm.size()));
  if (span.active() && launch != nullptr && launch->ticket() > 0) span.add_args(fmt::format("\"ticket\": {}", launch->ticket()));
  return {shard, comm, comm.size(), Call{site.label(call), with_arguments.hash()}, std::move(span)};
}

bool contains(const std::vector<std::string>& list, const std::string& name) {
  return std::find(list.begin(), list.end(), name) != list.end();
}

// The group's mesh axes ranked as they cut tensor axis `axis` of x (major first), then the others
// in the order given: blocks then join in the tensor's order whatever order the user names.
Names cut_order(std::string_view op, const Tensor& x, const Names& mesh_axes, const std::string& axis) {
  if (Shard* shard = Shard::current()) shard->mesh().check_axes(mesh_axes.list(), op);  // before reordering hides a repeat
  std::vector<std::string> ordered;
  for (const auto& m : x.vary().split_mesh_axes(axis))
    if (contains(mesh_axes.list(), m)) ordered.push_back(m);
  for (const auto& m : mesh_axes.list())
    if (!contains(ordered, m)) ordered.push_back(m);
  return Names(ordered);
}

Tensor summed_form(const Tensor& x) {
  const DType summed = deterministic::summed_dtype(x.dtype());
  return summed == x.dtype() ? x : cast(x, summed);
}

std::int64_t outer_size(const Shape& s, const std::string& axis) {
  std::int64_t outer = 1;
  for (int i = 0; i < s.index_of(axis); ++i) outer *= s[i].size;
  return outer;
}

// After the group's blocks of `axis` are joined, `axis` stays a block over its other (major)
// cuts only when the group's mesh axes were its most minor cuts, in order; else those vary.
void join_cuts(VaryType& vary, const Tensor& x, const std::string& axis, const std::vector<std::string>& group_axes) {
  auto cuts = x.vary().split_mesh_axes(axis);
  bool minor_suffix = cuts.size() >= group_axes.size() &&
                      std::equal(group_axes.begin(), group_axes.end(), cuts.end() - static_cast<std::ptrdiff_t>(group_axes.size()));
  if (minor_suffix) return;
  for (const auto& m : cuts)
    if (std::find(group_axes.begin(), group_axes.end(), m) == group_axes.end()) vary.set_varying(m);
}

// A local mean over m (mean over a tensor axis cut along m) summed over m would be n times too big.
void refuse_local_mean(std::string_view op, const Tensor& x, const std::string& m) {
  if (x.vary().local_mean(m))
    fail(op, "{} is a local mean over mesh axis '{}' (a mean over a tensor axis cut along it): summing the {} devices' means "
         "is {} times the mean; use pmean over '{}'", x.str(), m, axis_size(m), axis_size(m), m);
}

}  // namespace

// Each collective below is one block: its vary rule and data movement (the forward), then the
// public function, whose recorded backward is the collective's transpose (docs/collectives.md), run
// labelled as the backward of the forward call (BackwardOf).

// ---------------------------------------------------------------------------------------------
// psum, pmean, pmax, pmin: the value varies over every reduced mesh axis and is Invariant after;
// psum and pmean transpose to pvary; pmax and pmin are not differentiable.

namespace {

Tensor reduce_collective(std::string_view op, ReduceOp reduce, const Tensor& x_in, const Names& named_axes, const CallSite& site,
                         detail::Launch& launch) {
  // The value must vary over every reduced mesh axis, and is invariant after.
  const Names mesh_axes = reduce == ReduceOp::sum ? deterministic::in_mesh_order(named_axes) : named_axes;
  Context c = enter(op, &x_in, mesh_axes, site, &launch);
  VaryType vary = x_in.vary();
  for (const auto& m : mesh_axes.list()) {
    if (x_in.vary().kind(m) == Vary::Invariant)
      fail(op, "{} is already Invariant over mesh axis '{}': {} ", x_in.str(), m,
           reduce == ReduceOp::sum ? "summing identical copies is a multiplication (multiply by axis_size instead)"
                                   : "every device holds the same value, there is nothing to reduce");
    if (x_in.vary().kind(m) == Vary::Split)
      fail(op, "{} is Split along axis '{}' over mesh axis '{}': its blocks are different parts of one tensor, not "
           "partial values (use all_gather or psum_scatter)", x_in.str(), x_in.vary().split_axis(m), m);
    if (op == "psum") refuse_local_mean(op, x_in, m);
    vary.set_invariant(m);
  }
  // The max of terms is no term of the max, whichever mesh axes the max runs over.
  if (reduce != ReduceOp::sum)
    for (const auto& m : x_in.vary().partial_mesh_axes())
      fail(op, "{} is a partial {} over mesh axis '{}' (one term of it per device): the {} of the terms is not the {} of the "
           "whole; {} over '{}' first", x_in.str(), x_in.vary().local_mean(m) ? "mean" : "sum", m, op.substr(1), op.substr(1),
           x_in.vary().local_mean(m) ? "pmean" : "psum", m);
  if (c.n == 1) return x_in.with_vary(vary);  // a group of one: nothing to reduce, nothing sent
  if (reduce == ReduceOp::sum && deterministic::on()) return deterministic::psum(c.comm, c.call, x_in, mesh_axes, vary, launch);
  Tensor x = reduce == ReduceOp::sum ? summed_form(x_in) : x_in;
  const bool over_input = launch.over_input() && x.same_storage(x_in);
  Tensor out = over_input ? x.with_vary(vary) : detail::make_result(x.shape(), x.dtype(), vary, x.device_ptr());
  launch.keep({x});
  // (over the input: the caller's own buffer, which it has not handed to anyone; `x` was marked
  // read by the op's checks, so its pointer is taken as it is)
  void* recv = over_input ? const_cast<void*>(x.raw()) : out.raw_mutable();
  launch.all_reduce(c.comm, x.raw(), recv, static_cast<std::size_t>(x.numel()), x.dtype(), reduce, c.call);
  return launch.then([out, dtype = x_in.dtype()] { return detail::narrow_to(out, dtype); });
}


// detail::keeps_terms: x's two terms each reduced alone, then added (a sum of terms again), with no
// graph of their own: the caller records the transpose on x, whose terms need not be its operands.
Tensor reduced_by_terms(const Tensor& x, const std::function<Tensor(const Tensor&)>& reduce) {
  const auto terms = deterministic::terms_of(x);  // (a copy: the reductions add records)
  NoGrad terms_only;
  return reduce(terms[0]) + reduce(terms[1]);
}

Tensor summed(std::string_view op, const Tensor& x, const Names& mesh_axes, const CallSite& site) {
  detail::Launch launch = detail::Launch::blocking();
  const Tensor out = detail::keeps_terms(x, mesh_axes)
                         ? reduced_by_terms(x, [&](const Tensor& t) { return summed(op, t, mesh_axes, site); })
                         : reduce_collective(op, ReduceOp::sum, x, mesh_axes, site, launch);
  return with_transpose(op.data(), x, out, site, [mesh_axes](const Tensor& g) { return pvary(g, mesh_axes); });
}
}  // namespace

Tensor psum(const Tensor& x, const Names& mesh_axes, std::source_location where) { return summed("psum", x, mesh_axes, site_of(where)); }

namespace {

// pmean in deterministic mode. A local mean (a mean over tensor axes cut along the reduced mesh
// axes) is finished as the psum of its local sums divided by the global count: (s0 + s1) / 2c,
// one rounding as on one device, where (s0/c + s1/c) / 2 rounds three times unless c is a power
// of two. Other values: psum, then the division by the group's size (a power of two: exact).
Tensor deterministic_pmean(const Tensor& x, const Names& mesh_axes, const CallSite& site) {
  bool local_mean = false;
  for (const auto& m : mesh_axes.list()) local_mean = local_mean || x.vary().local_mean(m);
  if (!local_mean) return summed("pmean", x, mesh_axes, site) / static_cast<double>(axis_size(mesh_axes));
  const auto local = deterministic::local_mean_of(x);
  if (!local)
    fail("pmean", "deterministic mode: {} is a local mean that went through another op after mean; pmean the mean directly "
         "(it divides the psum of the local sums by the global count) or write psum(sum(x)) / count", x.str());
  const double count = static_cast<double>(local->count) * axis_size(mesh_axes);
  return summed("pmean", local->sum, mesh_axes, site) / count;
}

}  // namespace

Tensor pmean(const Tensor& x, const Names& mesh_axes, std::source_location where) {
  if (x.defined() && !is_floating(x.dtype())) fail("pmean", "needs a floating dtype, got {}", x.str());
  if (x.defined() && deterministic::on()) return deterministic_pmean(x, mesh_axes, site_of(where));
  return summed("pmean", x, mesh_axes, site_of(where)) / static_cast<double>(axis_size(mesh_axes));
}

namespace {
Tensor not_differentiable(std::string_view op, ReduceOp reduce, const Tensor& x, const Names& mesh_axes, const CallSite& site) {
  detail::Launch launch = detail::Launch::blocking();
  Tensor out = reduce_collective(op, reduce, x, mesh_axes, site, launch);
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record(std::string(op), out, {x}, [op = std::string(op), x_str = x.str(), mesh_axes](const Tensor&) -> std::vector<Tensor> {
    fail("grad", "{}({}, {}) is not differentiable: apply it to stop_gradient(x) (as the vocab-parallel loss does for its max)",
         op, x_str, mesh_axes.str());
  });
}
}  // namespace

Tensor pmax(const Tensor& x, const Names& mesh_axes, std::source_location where) {
  return not_differentiable("pmax", ReduceOp::max, x, mesh_axes, site_of(where));
}
Tensor pmin(const Tensor& x, const Names& mesh_axes, std::source_location where) {
  return not_differentiable("pmin", ReduceOp::min, x, mesh_axes, site_of(where));
}

// ---------------------------------------------------------------------------------------------
// pvary: Invariant to Varying, no data moves; transposes to psum.

namespace {

Tensor pvary_forward(const Tensor& x, const Names& mesh_axes) {
  checked_shard("pvary", &x, mesh_axes);  // no data moves: no communicator
  t_last_call = 0;  // no call of its own to number: its transpose must not carry whatever this thread called before
  VaryType vary = x.vary();
  for (const auto& m : mesh_axes.list()) {
    if (x.vary().kind(m) != Vary::Invariant)
      fail("pvary", "{} already varies over mesh axis '{}' ({}); pvary marks an Invariant value as Varying", x.str(), m,
           x.vary().kind(m) == Vary::Split     ? "Split along '" + x.vary().split_axis(m) + "'"
           : x.vary().kind(m) == Vary::Partial ? "a partial value: psum or pmean finishes it"
                                               : "Varying");
    vary.set_varying(m);
  }
  return x.with_vary(vary);
}

}  // namespace

Tensor pvary(const Tensor& x, const Names& mesh_axes, std::source_location where) {
  return with_transpose("pvary", x, pvary_forward(x, mesh_axes), site_of(where),
                        [mesh_axes](const Tensor& g) { return psum(g, mesh_axes); });
}

// ---------------------------------------------------------------------------------------------
// all_gather (Varying after; transposes to psum_scatter), all_gather_invariant (Invariant after;
// transposes to taking this device's block) and their stacking forms.

namespace {

// all_gather and all_gather_invariant.
// What a gather cannot gather correctly: a missing (or, stacking, an existing) tensor axis, and a
// value that is already the same on every device of the group.
void check_gatherable(std::string_view op, const Tensor& x, const Names& mesh_axes, const std::string& axis, bool stack) {
  checked_shard(op, &x, mesh_axes);
  if (!stack && !x.shape().has(axis))
    fail(op, "{} has no axis '{}' to gather along over mesh axes {}: name one of its axes (to stack the devices' values along "
         "a new axis, call {}_stacked)", x.str(), axis, mesh_axes.str(), op);
  if (stack && x.shape().has(axis))
    fail(op, "{} already has an axis '{}': stacking over mesh axes {} needs a new axis name (or gather along it with {})", x.str(),
         axis, mesh_axes.str(), op.substr(0, op.size() - std::string_view("_stacked").size()));
  for (const auto& m : mesh_axes.list())
    if (x.vary().kind(m) == Vary::Invariant)
      fail(op, "{} is Invariant over mesh axis '{}': every device holds the same value, so the gather would return {} copies "
           "of it (use it as it is; to tile it on purpose, pvary it over '{}' first)", x.str(), m, axis_size(mesh_axes), m);
  for (const auto& m : mesh_axes.list())
    if (!stack && x.vary().kind(m) == Vary::Split && x.vary().split_axis(m) != axis)
      fail(op, "{} is cut along '{}' over mesh axis '{}': gathering along '{}' would put the blocks of '{}' side by side along "
           "'{}'; gather along '{}' (or forget the cut with as_varying first, to do it on purpose)", x.str(), x.vary().split_axis(m),
           m, axis, x.vary().split_axis(m), axis, x.vary().split_axis(m));
  for (const auto& m : mesh_axes.list())
    if (x.vary().kind(m) == Vary::Partial)
      fail(op, "{} is a partial {} over mesh axis '{}' (a {} over a tensor axis cut along it): gathering would concatenate the "
           "devices' terms, not the whole; finish it with {} over '{}'{}", x.str(), x.vary().local_mean(m) ? "mean" : "sum", m,
           x.vary().local_mean(m) ? "mean" : "sum or dot", x.vary().local_mean(m) ? "pmean" : "psum", m,
           x.vary().local_mean(m) ? "" : " (or psum_scatter to keep one block each)");
}

Tensor gather_collective(std::string_view op, const Tensor& x, const Names& mesh_axes, const std::string& axis, bool invariant,
                         const CallSite& site, bool stack, detail::Launch& launch) {
  check_gatherable(op, x, mesh_axes, axis, stack);
  Context c = enter(op, &x, mesh_axes, site, &launch, fmt::format(", {}", axis));
  const auto& group_axes = mesh_axes.list();
  VaryType vary = x.vary();
  // Split(axis) over the gathered mesh axes is consumed; any other cut over them becomes Varying.
  for (const auto& m : group_axes) {
    if (invariant) vary.set_invariant(m);
    else vary.set_varying(m);
  }
  join_cuts(vary, x, axis, group_axes);

  std::vector<Axis> axes = x.shape().axes();
  if (stack) axes.insert(axes.begin(), Axis{axis, 1});
  const int i = stack ? 0 : x.shape().index_of(axis);
  axes[static_cast<std::size_t>(i)].size *= c.n;
  Shape shape(axes);
  if (c.n == 1) return x.with_shape(shape).with_vary(vary);
  Tensor out = detail::make_result(shape, x.dtype(), vary, x.device_ptr());
  const std::int64_t outer = stack ? 1 : outer_size(x.shape(), axis);
  launch.keep({x});
  if (outer == 1) {
    launch.all_gather(c.comm, x.raw(), out.raw_mutable(), static_cast<std::size_t>(x.numel()), x.dtype(), c.call);
    return launch.then([out] { return out; });
  }
  Tensor staging = Tensor::empty(Shape{{"rank", c.n}, {"block", x.numel()}}, x.dtype(), x.device_ptr());
  launch.all_gather(c.comm, x.raw(), staging.raw_mutable(), static_cast<std::size_t>(x.numel()), x.dtype(), c.call);
  return launch.then([staging, out, outer, n = c.n, chunk = x.numel() / outer]() mutable {
    detail::regroup(staging, out, outer, n, chunk, true);
    return out;
  });
}


// Drops the size-1 axis that a stacking gather added back (its gradient's own block).
Tensor unstack(const Tensor& g, const Tensor& x, const std::string& axis) { return x.shape().has(axis) ? g : sum(g, axis); }

Tensor gather(std::string_view op, const Tensor& x, const Names& mesh_axes, const std::string& axis, bool invariant, bool stack,
              const CallSite& site) {
  const Names group = cut_order(op, x, mesh_axes, axis);
  detail::Launch launch = detail::Launch::blocking();
  Tensor out = gather_collective(op, x, group, axis, invariant, site, stack, launch);
  // The transpose: the gradient's terms reduce-scattered. An Invariant result's gradient is whole
  // once summed, so its backward takes it before that sum (its consumers' per-device terms, FSDP's
  // case: a gathered parameter used on a cut batch) and reduce-scatters it, half an all-reduce's
  // bytes; summed already, it is this device's block of it.
  Tensor recorded = with_transpose(op.data(), x, out, site, [x = x.without_data(), group, axis, invariant](const Tensor& g) {
    if (!invariant || !detail::summed_over(g, group)) return unstack(psum_scatter(g, group, axis), x, axis);
    return detail::own_block(g, x, group, axis);
  });
  if (invariant && recorded.grad_node()) recorded.grad_node()->passes_partial_sums = true;
  return recorded;
}
}  // namespace

Tensor all_gather(const Tensor& x, const Names& mesh_axes, const std::string& axis, std::source_location where) {
  return gather("all_gather", x, mesh_axes, axis, false, false, site_of(where));
}
Tensor all_gather_invariant(const Tensor& x, const Names& mesh_axes, const std::string& axis, std::source_location where) {
  return gather("all_gather_invariant", x, mesh_axes, axis, true, false, site_of(where));
}
Tensor all_gather_stacked(const Tensor& x, const Names& mesh_axes, const std::string& new_axis, std::source_location where) {
  return gather("all_gather_stacked", x, mesh_axes, new_axis, false, true, site_of(where));
}
Tensor all_gather_invariant_stacked(const Tensor& x, const Names& mesh_axes, const std::string& new_axis,
                                    std::source_location where) {
  return gather("all_gather_invariant_stacked", x, mesh_axes, new_axis, true, true, site_of(where));
}
Tensor all_gather_cuts(const Tensor& x, std::source_location where) {
  Tensor whole = x;
  for (const auto& axis : x.shape().axes())
    if (const auto cuts = x.vary().split_mesh_axes(axis.name); !cuts.empty()) whole = all_gather_invariant(whole, cuts, axis.name, where);
  return whole;
}

// ---------------------------------------------------------------------------------------------
// psum_scatter: a partial sum becomes Split along the axis; transposes to all_gather.

namespace {

Tensor psum_scatter_forward(const Tensor& x_in, const Names& mesh_axes, const std::string& axis, const CallSite& site,
                            detail::Launch& launch) {
  Context c = enter("psum_scatter", &x_in, mesh_axes, site, &launch, fmt::format(", {}", axis));
  const int i = x_in.shape().require(axis, "psum_scatter");
  const std::int64_t size = x_in.shape()[i].size;
  if (size % c.n != 0)
    fail("psum_scatter", "axis '{}' of size {} in {} is not divisible by the {} devices of mesh axes {}", axis, size, x_in.str(),
         c.n, mesh_axes.str());
  VaryType vary = x_in.vary();
  for (const auto& m : mesh_axes.list()) {
    if (x_in.vary().kind(m) == Vary::Invariant)
      fail("psum_scatter", "{} is already Invariant over mesh axis '{}': summing identical copies is a multiplication "
           "(multiply by axis_size and slice instead)", x_in.str(), m);
    if (x_in.vary().kind(m) == Vary::Split)
      fail("psum_scatter", "{} is Split along axis '{}' over mesh axis '{}', not a partial value (use all_gather or all_to_all)",
           x_in.str(), x_in.vary().split_axis(m), m);
    refuse_local_mean("psum_scatter", x_in, m);
  }
  for (const auto& m : mesh_axes.list()) vary.set_split(m, axis);  // most minor cuts of `axis`
  if (c.n == 1) return x_in.with_vary(vary);

  Tensor x = summed_form(x_in);
  std::vector<Axis> axes = x.shape().axes();
  axes[static_cast<std::size_t>(i)].size = size / c.n;
  Tensor out = detail::make_result(Shape(axes), x.dtype(), vary, x.device_ptr());
  const std::int64_t outer = outer_size(x.shape(), axis);
  const std::size_t block = static_cast<std::size_t>(out.numel());
  if (deterministic::on()) return deterministic::psum_scatter(c.comm, c.call, x_in, mesh_axes, out, outer, launch);
  if (outer == 1) {
    launch.keep({x});
    launch.reduce_scatter(c.comm, x.raw(), out.raw_mutable(), block, x.dtype(), ReduceOp::sum, c.call);
  } else {
    Tensor staging = Tensor::empty(Shape{{"rank", c.n}, {"block", out.numel()}}, x.dtype(), x.device_ptr());
    detail::regroup(x, staging, outer, c.n, out.numel() / outer, false);
    launch.keep({staging});
    launch.reduce_scatter(c.comm, staging.raw(), out.raw_mutable(), block, x.dtype(), ReduceOp::sum, c.call);
  }
  return launch.then([out, dtype = x_in.dtype()] { return detail::narrow_to(out, dtype); });
}

}  // namespace

Tensor psum_scatter(const Tensor& x, const Names& mesh_axes, const std::string& axis, std::source_location where) {
  const CallSite site = site_of(where);
  detail::Launch launch = detail::Launch::blocking();
  const Tensor out = detail::keeps_terms(x, mesh_axes)
                         ? reduced_by_terms(x, [&](const Tensor& t) { return psum_scatter(t, mesh_axes, axis, where); })
                         : psum_scatter_forward(x, mesh_axes, axis, site, launch);
  return with_transpose("psum_scatter", x, out, site, [mesh_axes, axis](const Tensor& g) { return all_gather(g, mesh_axes, axis); });
}

// ---------------------------------------------------------------------------------------------
// ppermute: Varying after; transposes to ppermute with the pairs reversed.

std::vector<std::pair<int, int>> detail::inverse_pairs(const std::vector<std::pair<int, int>>& pairs) {
  std::vector<std::pair<int, int>> inverse;
  for (auto [src, dst] : pairs) inverse.push_back({dst, src});
  return inverse;
}

std::string detail::pairs_text(const std::vector<std::pair<int, int>>& pairs) {
  std::string text;
  for (auto [src, dst] : pairs) text += fmt::format("{}({}, {})", text.empty() ? "" : " ", src, dst);
  return text;
}

namespace {

Tensor ppermute_forward(const Tensor& x, const Names& mesh_axes, const std::vector<std::pair<int, int>>& pairs, const CallSite& site,
                        detail::Launch& launch) {
  Context c = enter("ppermute", &x, mesh_axes, site, &launch, fmt::format(", pairs [{}]", detail::pairs_text(pairs)));
  check_permute_pairs(pairs, c.n, "ppermute", "the group over " + mesh_axes.str(), [&] { return x.str(); });
  // A partial sum's terms may change places, but none may be lost (an unmatched rank gets zeros).
  for (const auto& m : mesh_axes.list())
    if (x.vary().kind(m) == Vary::Partial && static_cast<int>(pairs.size()) != c.n)
      fail("ppermute", "{} is a partial value over mesh axis '{}': pairs [{}] move {} of the {} devices' terms, so psum would "
           "miss the others; permute every rank's term (or as_varying first, to drop terms on purpose)", x.str(), m,
           detail::pairs_text(pairs), pairs.size(), c.n);
  // A partial value's terms change places: still one term each of a sum over the group.
  VaryType vary = x.vary();
  for (const auto& m : mesh_axes.list())
    if (x.vary().kind(m) != Vary::Partial) vary.set_varying(m);
  if (c.n == 1 && !pairs.empty()) return x.with_vary(vary);  // (0, 0): the block stays
  Tensor out = detail::make_result(x.shape(), x.dtype(), vary, x.device_ptr());
  launch.keep({x});
  launch.permute(c.comm, x.raw(), out.raw_mutable(), static_cast<std::size_t>(x.numel()), x.dtype(), pairs, c.call);
  return launch.then([out] { return out; });
}

}  // namespace

Tensor ppermute(const Tensor& x, const Names& mesh_axes, const std::vector<std::pair<int, int>>& pairs, std::source_location where) {
  const CallSite site = site_of(where);
  detail::Launch launch = detail::Launch::blocking();
  const auto inverse = detail::inverse_pairs(pairs);
  return with_transpose("ppermute", x, ppermute_forward(x, mesh_axes, pairs, site, launch), site,
                        [mesh_axes, inverse](const Tensor& g) { return ppermute(g, mesh_axes, inverse); });
}

// ---------------------------------------------------------------------------------------------
// all_to_all: a cut moves from concat_axis to split_axis; transposes to all_to_all with the axes swapped.

namespace {

Tensor all_to_all_forward(const Tensor& x, const Names& mesh_axes, const std::string& split_axis, const std::string& concat_axis,
                          const CallSite& site) {
  Context c = enter("all_to_all", &x, mesh_axes, site, nullptr, fmt::format(", {}, {}", split_axis, concat_axis));
  const int is = x.shape().require(split_axis, "all_to_all");
  x.shape().require(concat_axis, "all_to_all");
  const std::int64_t split_size = x.shape()[is].size;
  if (split_size % c.n != 0)
    fail("all_to_all", "split axis '{}' of size {} in {} is not divisible by the {} devices of mesh axes {}", split_axis, split_size,
         x.str(), c.n, mesh_axes.str());
  VaryType vary = x.vary();
  for (const auto& m : mesh_axes.list()) {
    if (x.vary().kind(m) == Vary::Partial)
      fail("all_to_all", "{} is a partial value over mesh axis '{}': exchanging blocks would put different devices' terms side by "
           "side; psum_scatter over '{}' sums them and keeps one block each", x.str(), m, m);
    if (split_axis != concat_axis && x.vary().kind(m) == Vary::Split && x.vary().split_axis(m) == concat_axis) {
      vary.set_invariant(m);
      vary.set_split(m, split_axis);
    } else {
      vary.set_varying(m);
    }
  }
  join_cuts(vary, x, concat_axis, mesh_axes.list());
  if (c.n == 1) return x.with_vary(vary);

  // Send block j of split_axis to rank j: pack x as [n, block...].
  std::vector<Axis> block_axes = x.shape().axes();
  block_axes[static_cast<std::size_t>(is)].size = split_size / c.n;
  const Shape block_shape(block_axes);
  const std::int64_t block = block_shape.numel();
  Tensor send = Tensor::empty(Shape{{"rank", c.n}, {"block", block}}, x.dtype(), x.device_ptr());
  const std::int64_t split_outer = outer_size(x.shape(), split_axis);
  detail::regroup(x, send, split_outer, c.n, block / split_outer, false);
  Tensor recv = Tensor::empty(send.shape(), x.dtype(), x.device_ptr());
  c.comm.all_to_all(send.raw(), recv.raw_mutable(), static_cast<std::size_t>(block), x.dtype(), c.call);

  // Concatenate what arrived along concat_axis, in rank order.
  std::vector<Axis> out_axes = block_axes;
  const int ic = block_shape.index_of(concat_axis);
  out_axes[static_cast<std::size_t>(ic)].size *= c.n;
  Tensor out = detail::make_result(Shape(out_axes), x.dtype(), vary, x.device_ptr());
  const std::int64_t concat_outer = outer_size(block_shape, concat_axis);
  detail::regroup(recv, out, concat_outer, c.n, block / concat_outer, true);
  return out;
}

}  // namespace

Tensor all_to_all(const Tensor& x, const Names& mesh_axes, const std::string& split_axis, const std::string& concat_axis,
                  std::source_location where) {
  const CallSite site = site_of(where);
  const Names group = cut_order("all_to_all", x, mesh_axes, concat_axis);
  auto backward = [group, split_axis, concat_axis](const Tensor& g) { return all_to_all(g, group, concat_axis, split_axis); };
  return with_transpose("all_to_all", x, all_to_all_forward(x, group, split_axis, concat_axis, site), site, backward);
}

namespace detail {
// For the start forms (async_collectives.cpp): the same checks, vary rules, call sites and packing.
Tensor launch_psum(const Tensor& x, const Names& mesh_axes, Launch& launch, std::source_location where) {
  return reduce_collective("psum", ReduceOp::sum, x, mesh_axes, site_of(where), launch);
}
bool keeps_terms(const Tensor& x, const Names& mesh_axes) {
  if (!deterministic::on() || deterministic::terms_of(x).empty()) return false;
  const auto& reduced = mesh_axes.list();
  for (const auto& m : x.vary().partial_mesh_axes())
    if (x.vary().partial_sum(m) && std::find(reduced.begin(), reduced.end(), m) == reduced.end()) return true;
  return false;
}

std::vector<Tensor> psum_alike(const std::vector<Tensor>& parts, const Names& named_axes, std::source_location where) {
  const Tensor& first = parts.at(0);
  Shard* shard = Shard::current();
  if (!deterministic::on() || shard == nullptr || parts.size() < 2 || first.dtype() != deterministic::summed_dtype(first.dtype()))
    return {};
  for (const Tensor& t : parts)
    if (t.dtype() != first.dtype() || t.shape() != first.shape()) return {};
  const Names mesh_axes = deterministic::in_mesh_order(named_axes);
  Communicator& comm = shard->comm(mesh_axes);
  const auto count = static_cast<std::int64_t>(parts.size()) * first.numel();
  if (!comm.reduces_parts() || !deterministic::adds_in_rank_tree(comm, CollectiveKind::all_reduce, count, first.dtype())) return {};
  Launch launch = Launch::blocking();
  Context c = enter("psum", &first, mesh_axes, site_of(where), &launch, fmt::format(", {} parts alike", parts.size()));
  VaryType vary;  // per device over what the parts vary over, Invariant over the summed axes
  for (const Tensor& t : parts)
    for (const auto& e : t.vary().entries()) vary.set_varying(e.mesh_axis);
  for (const auto& m : mesh_axes.list()) vary.set_invariant(m);
  const std::int64_t whole = first.numel(), n = static_cast<std::int64_t>(parts.size());
  Tensor sums = make_result(Shape{{"parts", n}, {"part", whole}}, first.dtype(), vary, first.device_ptr());
  std::vector<const void*> raw;
  for (const Tensor& t : parts) raw.push_back(t.raw());
  std::vector<Tensor> kept = parts;
  kept.push_back(sums);
  launch.keep(kept);
  launch.all_reduce_parts(c.comm, raw, sums.raw_mutable(), static_cast<std::size_t>(whole), first.dtype(), ReduceOp::sum, c.call);
  const Tensor summed = launch.then([sums] { return sums; });
  std::vector<Tensor> out;
  const std::size_t bytes = first.nbytes();
  for (std::size_t i = 0; i < parts.size(); ++i) out.push_back(summed.piece(i * bytes, first.shape()));
  return out;
}
Tensor launch_all_gather(const Tensor& x, const Names& mesh_axes, const std::string& axis, Launch& launch, std::source_location where) {
  return gather_collective("all_gather", x, cut_order("start_all_gather", x, mesh_axes, axis), axis, false, site_of(where), false, launch);
}
Tensor launch_psum_scatter(const Tensor& x, const Names& mesh_axes, const std::string& axis, Launch& launch, std::source_location where) {
  return psum_scatter_forward(x, mesh_axes, axis, site_of(where), launch);
}
Tensor launch_ppermute(const Tensor& x, const Names& mesh_axes, const std::vector<std::pair<int, int>>& pairs, Launch& launch,
                       std::source_location where) {
  return ppermute_forward(x, mesh_axes, pairs, site_of(where), launch);
}
Names gather_order(const Tensor& x, const Names& mesh_axes, const std::string& axis) {
  return cut_order("start_all_gather", x, mesh_axes, axis);
}
Tensor unstack_gradient(const Tensor& g, const Tensor& x, const std::string& axis) { return unstack(g, x, axis); }
Tensor launch_all_gather_invariant(const Tensor& x, const Names& mesh_axes, const std::string& axis, Launch& launch,
                                   std::source_location where) {
  return gather_collective("all_gather_invariant", x, cut_order("start_all_gather_invariant", x, mesh_axes, axis), axis, true,
                           site_of(where), false, launch);
}
bool summed_over(const Tensor& g, const Names& group) {
  for (const auto& m : group.list())
    if (g.vary().kind(m) != Vary::Invariant) return false;
  return true;
}
Tensor own_block(const Tensor& g, const Tensor& x, const Names& group, const std::string& axis) {
  const auto op_span = enter_op("own_block", {{&g, OnPartial::move}});  // one op, typed as it returns (the locator reads it)
  const std::int64_t block = x.shape().has(axis) ? x.shape().size(axis) : 1;
  const auto r = static_cast<std::int64_t>(axis_index(group).item());
  const Tensor mine = unstack(slice(g, axis, r * block, (r + 1) * block), x, axis);
  VaryType vary = mine.vary();  // this device's block, typed as x is over the group
  for (const auto& m : group.list()) {
    if (x.vary().kind(m) == Vary::Split) vary.set_split(m, x.vary().split_axis(m));
    else vary.set_varying(m);
  }
  return trace::made(mine.with_vary(vary));  // (the retyped block is the result observers read)
}
}  // namespace detail

Tensor axis_index(const Names& mesh_axes) {
  Shard& shard = checked_shard("axis_index", nullptr, mesh_axes);
  VaryType vary;
  for (const auto& m : mesh_axes.list()) vary.set_varying(m);
  Tensor out = detail::make_result(Shape{}, DType::i32, vary, shard.device_ptr());
  detail::kernels_of(out).fill(DType::i32, out.raw_mutable(), 1, shard.mesh().rank_in_group(shard.device(), mesh_axes.list()));
  return out;
}

int axis_size(const Names& mesh_axes) {
  Shard* shard = Shard::current();
  if (shard == nullptr) fail("axis_size", "runs inside Runtime::run (mesh axes {})", mesh_axes.str());
  shard->mesh().check_axes(mesh_axes.list(), "axis_size");
  return shard->mesh().group_size(mesh_axes.list());
}

}  // namespace nax
