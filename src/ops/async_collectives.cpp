// The start forms: the blocking forms' forward functions with a started Launch (collectives.cpp),
// and their gradients split in two graph nodes. Forward, a started collective is
//   start (input x -> token) ... wait (token -> result)
// so that backward, walking the graph the other way, reaches the wait first, starts the transpose
// there, and waits for it at the start node, with the backward of whatever was computed in
// between (on every device in the same order) overlapping it.
#include "nax/ops/async_collectives.h"

#include <fmt/format.h>

#include <exception>
#include <memory>
#include <optional>
#include <utility>

#include "nax/ops/collectives.h"
#include "nax/comm/communicator.h"
#include "nax/ops/ops.h"
#include "nax/shard/shard.h"
#include "ops/collective_forward.h"
#include "ops/tape.h"

namespace nax {

namespace detail {
void report_unwaited(const std::string& what) noexcept {
  if (std::uncaught_exceptions() > 0) return;  // unwinding: the error under way says what went wrong
  Shard* shard = Shard::current();
  if (shard == nullptr) return;
  try {
    shard->defer_error(fmt::format("{}: destroyed without wait() (every start needs its wait, once, on every device)", what));
  } catch (...) {
  }
}
}  // namespace detail

namespace {

// "start_psum(f32[i=4] varying{mp}, mp) at tests/t.cpp:12:7" (or "... in the backward of
// start_all_gather at ..."): the name a start's Pending and its collective's messages carry, with
// the call site as the blocking collectives print it.
std::string describe(const std::string& call, const std::source_location& where) { return detail::site_of(where).label(call); }

// A started forward: a Pending over the Launch (or the result at once, when nothing was sent).
Pending<Tensor> pending_of(std::string what, detail::Launch launch, Tensor ready) {
  if (!launch.in_flight()) return Pending<Tensor>(std::move(what), [ready] { return ready; });
  auto shared = std::make_shared<detail::Launch>(std::move(launch));
  return Pending<Tensor>(std::move(what), [shared] { return shared->complete(); });
}

// f(p.wait()), as a Pending.
Pending<Tensor> then(Pending<Tensor> p, std::function<Tensor(const Tensor&)> f) {
  std::string what = p.what();
  auto shared = std::make_shared<Pending<Tensor>>(std::move(p));
  return Pending<Tensor>(std::move(what), [shared, f = std::move(f)] { return f(shared->wait()); });
}

// The transpose of a started collective, started from the gradient of its result.
using StartTranspose = std::function<Pending<Tensor>(const Tensor& g)>;

// `forward` (started from x at `where`) with its gradient: the start and wait nodes described
// above. The transpose runs as the backward of that call (detail::BackwardOf).
// `passes_partial_sums`: the wait's backward takes its consumers' per-device terms unsummed (an
// Invariant result whose transpose reduce-scatters them, as all_gather_invariant's does).
Pending<Tensor> with_gradient(const std::string& op, const Tensor& x, Pending<Tensor> forward, const std::source_location& where,
                              StartTranspose transpose, bool passes_partial_sums = false) {
  if (!autodiff::any_requires_grad({&x})) return forward;
  const CallSite site = detail::transposing_site(CallSite{where.file_name(), where.line(), where.column(), nullptr});
  // One transpose per gradient the wait receives: one, or, passing partial sums, one per set of
  // mesh axes its terms still need a sum over. Each goes back to x as a contribution of its own (x
  // is the start's input once per possible term), so that autodiff finishes each as it would have.
  static constexpr std::size_t kTerms = 4;
  auto backward = std::make_shared<std::vector<Pending<Tensor>>>();
  const Tensor token = autodiff::record(op + " (start)", full(Shape{}, 0.0), std::vector<Tensor>(kTerms, x), [backward, op](const Tensor&) {
    if (backward->empty()) fail("grad", "the transpose of a started collective was never started");
    if (backward->size() > kTerms)
      fail("grad", "{}'s gradient arrived as {} kinds of terms, more than the {} a started collective keeps apart", op, backward->size(),
           kTerms);
    std::vector<Tensor> terms(kTerms);
    for (std::size_t i = 0; i < backward->size(); ++i) terms[i] = (*backward)[i].wait();
    backward->clear();
    return terms;
  });
  std::string what = forward.what();
  auto started = std::make_shared<Pending<Tensor>>(std::move(forward));
  return Pending<Tensor>(std::move(what), [started, token, op, site, backward, passes_partial_sums, transpose = std::move(transpose)] {
    const Tensor out = started->wait();
    Tensor recorded = autodiff::record(op + " (wait)", out, {token}, [backward, transpose, op, site](const Tensor& g) {
      const detail::BackwardOf scope(op.c_str(), site);
      backward->push_back(transpose(g));
      return std::vector<Tensor>{full(Shape{}, 0.0)};  // the token's gradient: the transpose carries the real one
    });
    if (passes_partial_sums && recorded.grad_node()) recorded.grad_node()->passes_partial_sums = true;
    return recorded;
  });
}

}  // namespace

namespace {

// Deterministic mode's sum of partial sums that stays one over other mesh axes (detail::keeps_terms)
// is reduced term by term at the start, blocking: the same value as the blocking form.
Pending<Tensor> reduced_term_by_term(std::string what, Tensor reduced) {
  return Pending<Tensor>(std::move(what), [reduced] { return reduced; });
}

}  // namespace

Pending<Tensor> start_psum(const Tensor& x, const Names& mesh_axes, std::source_location where) {
  const std::string what = describe(fmt::format("start_psum({}, {})", x.str(), mesh_axes.str()), where);
  if (detail::keeps_terms(x, mesh_axes)) return reduced_term_by_term(what, psum(x, mesh_axes, where));
  detail::Launch launch = detail::Launch::started(what);
  Tensor ready = detail::launch_psum(x, mesh_axes, launch, where);
  return with_gradient("start_psum", x, pending_of(what, std::move(launch), ready), where, [mesh_axes, what](const Tensor& g) {
    return Pending<Tensor>("the transpose of " + what, [t = pvary(g, mesh_axes)] { return t; });  // nothing to send
  });
}

namespace detail {

Tensor psum_over_input(const Tensor& x, const Names& mesh_axes, std::source_location where) {
  Launch launch = Launch::blocking();
  launch.write_over_input();
  return launch_psum(x, mesh_axes, launch, where);
}

Pending<Tensor> start_psum_over_input(const Tensor& x, const Names& mesh_axes, std::source_location where) {
  const std::string what = describe(fmt::format("start_psum({}, {})", x.str(), mesh_axes.str()), where);
  Launch launch = Launch::started(what);
  launch.write_over_input();
  const Tensor ready = launch_psum(x, mesh_axes, launch, where);
  return pending_of(what, std::move(launch), ready);
}

}  // namespace detail

Pending<Tensor> start_all_gather(const Tensor& x, const Names& mesh_axes, const std::string& axis, std::source_location where) {
  const std::string what = describe(fmt::format("start_all_gather({}, {}, {})", x.str(), mesh_axes.str(), axis), where);
  detail::Launch launch = detail::Launch::started(what);
  Tensor ready = detail::launch_all_gather(x, mesh_axes, axis, launch, where);
  const Names group = detail::gather_order(x, mesh_axes, axis);
  return with_gradient("start_all_gather", x, pending_of(what, std::move(launch), ready), where, [x = x.without_data(), group, axis, where](const Tensor& g) {
    return then(start_psum_scatter(g, group, axis, where), [x, axis](const Tensor& s) { return detail::unstack_gradient(s, x, axis); });
  });
}

Pending<Tensor> start_all_gather_invariant(const Tensor& x, const Names& mesh_axes, const std::string& axis, std::source_location where) {
  const std::string what = describe(fmt::format("start_all_gather_invariant({}, {}, {})", x.str(), mesh_axes.str(), axis), where);
  detail::Launch launch = detail::Launch::started(what);
  Tensor ready = detail::launch_all_gather_invariant(x, mesh_axes, axis, launch, where);
  const Names group = detail::gather_order(x, mesh_axes, axis);
  auto transpose = [x = x.without_data(), group, axis, what, where](const Tensor& g) {
    if (!detail::summed_over(g, group))  // the consumers' terms: reduce-scattered, as FSDP's gradients are
      return then(start_psum_scatter(g, group, axis, where), [x, axis](const Tensor& s) { return detail::unstack_gradient(s, x, axis); });
    return Pending<Tensor>("the transpose of " + what, [block = detail::own_block(g, x, group, axis)] { return block; });
  };
  return with_gradient("start_all_gather_invariant", x, pending_of(what, std::move(launch), ready), where, transpose, true);
}

Pending<Tensor> start_psum_scatter(const Tensor& x, const Names& mesh_axes, const std::string& axis, std::source_location where) {
  const std::string what = describe(fmt::format("start_psum_scatter({}, {}, {})", x.str(), mesh_axes.str(), axis), where);
  if (detail::keeps_terms(x, mesh_axes)) return reduced_term_by_term(what, psum_scatter(x, mesh_axes, axis, where));
  detail::Launch launch = detail::Launch::started(what);
  Tensor ready = detail::launch_psum_scatter(x, mesh_axes, axis, launch, where);
  return with_gradient("start_psum_scatter", x, pending_of(what, std::move(launch), ready), where, [mesh_axes, axis, where](const Tensor& g) {
    return start_all_gather(g, mesh_axes, axis, where);
  });
}

Pending<Tensor> start_ppermute(const Tensor& x, const Names& mesh_axes, const std::vector<std::pair<int, int>>& pairs,
                               std::source_location where) {
  const std::string what = describe(fmt::format("start_ppermute({}, {}, pairs [{}])", x.str(), mesh_axes.str(), detail::pairs_text(pairs)), where);
  detail::Launch launch = detail::Launch::started(what);
  Tensor ready = detail::launch_ppermute(x, mesh_axes, pairs, launch, where);
  const auto inverse = detail::inverse_pairs(pairs);
  return with_gradient("start_ppermute", x, pending_of(what, std::move(launch), ready), where, [mesh_axes, inverse, where](const Tensor& g) {
    return start_ppermute(g, mesh_axes, inverse, where);
  });
}

}  // namespace nax
