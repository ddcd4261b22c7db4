// redistribute: the collective for each change of placement on a mesh axis (docs/architecture.md, Global view).
//
//  from -> to            per-shard op                          its transpose (autodiff)
//  S(a) -> R             all_gather_invariant(x, m, a)         own-block slice
//  S(a) -> S(b)          all_to_all(x, m, b, a)                all_to_all(g, m, a, b)
//  P(sum) -> R           psum(x, m)                            pvary
//  P(sum) -> S(a)        psum_scatter(x, m, a)                 all_gather
//  P(max) -> R           pmax(x, m)                            none (apply it to stop_gradient values)
//  R -> S(a)             own-block slice (no communication)    all_gather_invariant
//  R -> P(sum)           kept on the group's first device      (through the implicit pvary) psum
//
// A tensor axis cut over several mesh axes is cut major first in mesh order, so cuts come off from
// the minor end and go on at it.
#include <fmt/format.h>

#include <algorithm>

#include "deterministic/deterministic.h"
#include "ops/tape.h"
#include "global/propagation.h"
#include "nax/ops/collectives.h"
#include "nax/global/global_ops.h"
#include "nax/ops/ops.h"
#include "nax/runtime/runtime.h"

namespace nax {

namespace {

// This device's block of `axis` along mesh axis m, from a value whole along m.
Tensor own_block(const Tensor& x, const std::string& m, const std::string& axis) {
  const int n = axis_size(m);
  const std::int64_t block = x.shape().size(axis) / n;
  const auto r = static_cast<std::int64_t>(axis_index(m).item());
  Tensor out;
  {
    NoGrad no_grad;
    out = slice(x, axis, r * block, (r + 1) * block);
  }
  VaryType vary = x.vary();
  vary.set_split(m, axis);
  out = out.with_vary(vary);
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record("own_block", out, {x}, [m, axis](const Tensor& g) { return std::vector<Tensor>{all_gather_invariant(g, m, axis)}; });
}

// The mesh axes cutting `axis` under `placements`, in mesh order.
std::vector<std::string> cuts_of(const Placements& placements, const std::string& axis, const Mesh& mesh) {
  std::vector<std::string> cuts;
  for (const auto& m : mesh.axis_names())
    if (placements.on(m).is_shard() && placements.on(m).axis() == axis) cuts.push_back(m);
  return cuts;
}

void check_target(const GlobalTensor& x, const Placements& target, const Mesh& mesh) {
  for (const auto& [m, p] : target.entries()) {
    if (!mesh.has(m)) fail("redistribute", "{} -> {}: '{}' is not an axis of mesh {}", x.str(), target.str(), m, mesh.str());
    if (p.is_shard() && !x.shape().has(p.axis()))
      fail("redistribute", "{} -> {}: the tensor has no axis '{}' to shard over mesh axis '{}'", x.str(), target.str(), p.axis(), m);
    if (p.is_partial() && !(x.placement(m) == p) && !x.placement(m).is_replicate())
      fail("redistribute", "{} -> {}: only a replicated value becomes partial over '{}' (it is {} there)", x.str(), target.str(), m,
           x.placement(m).str());
  }
  for (const auto& axis : x.shape().axes()) {
    std::int64_t parts = 1;
    for (const auto& m : cuts_of(target, axis.name, mesh)) parts *= mesh.axis_size(m);
    if (axis.size % parts != 0)
      fail("redistribute", "{} -> {}: axis '{}' of size {} does not divide into {} equal blocks over mesh axes ({}); uneven shards "
           "are refused, not padded", x.str(), target.str(), axis.name, axis.size, parts, fmt::join(cuts_of(target, axis.name, mesh), ", "));
  }
}

struct Redistribution {
  const Mesh& mesh;
  const Placements& target;
  Tensor t;
  Placements now;

  bool is_prefix(const std::vector<std::string>& a, const std::vector<std::string>& b) const {
    return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
  }

  // S(axis) -> S(b) over m by one all_to_all when b is whole now and m alone is to cut it.
  bool exchange(const std::string& m, const std::string& axis) {
    const Placement& to = target.on(m);
    if (!to.is_shard() || to.axis() == axis || !cuts_of(now, to.axis(), mesh).empty()) return false;
    if (cuts_of(target, to.axis(), mesh) != std::vector<std::string>{m}) return false;
    t = all_to_all(t, m, to.axis(), axis);
    now.set(m, to);
    return true;
  }

  // Phase 1: take off the cuts that the target does not keep, minor first.
  void unshard() {
    for (const auto& axis : t.shape().names()) {
      auto cuts = cuts_of(now, axis, mesh);
      const auto wanted = cuts_of(target, axis, mesh);
      std::size_t keep = 0;
      while (keep < cuts.size() && keep < wanted.size() && cuts[keep] == wanted[keep]) ++keep;
      for (std::size_t i = cuts.size(); i-- > keep;) {
        const std::string m = cuts[i];
        if (i + 1 == cuts.size() && exchange(m, axis)) continue;
        t = all_gather_invariant(t, m, axis);
        now.set(m, Placement::replicate());
      }
    }
  }

  // Phase 2: the cuts that cost nothing, a replica's own block, before any reduction, so that the
  // psums move the cut value (FSDP's embedding: its partial sum over mp cut along the batch over
  // fsdp first, then summed): in the target's order, up to the first cut over a mesh axis on which
  // the value is not a replica. Not for deterministic mode's sum of partial sums, which takes no
  // slice before its psum finishes its terms.
  void shard_replicas() {
    if (!deterministic::terms_of(t).empty()) return;
    for (const auto& axis : t.shape().names()) {
      const auto wanted = cuts_of(target, axis, mesh);
      for (std::size_t i = cuts_of(now, axis, mesh).size(); i < wanted.size() && now.on(wanted[i]).is_replicate(); ++i) {
        t = own_block(t, wanted[i], axis);
        now.set(wanted[i], Placement::shard(axis));
      }
    }
  }

  // Phase 3: reduce the partial values the target does not keep partial, one mesh axis at a time
  // (two rings, e.g. inside and across nodes, beat one flat ring over both under the alpha-beta model).
  void reduce() {
    for (const auto& m : mesh.axis_names()) {
      const Placement from = now.on(m), to = target.on(m);
      if (!from.is_partial() || to == from) continue;
      if (from.op() == PartialOp::sum && to.is_shard()) {
        auto cuts = cuts_of(now, to.axis(), mesh);
        cuts.push_back(m);
        if (is_prefix(cuts, cuts_of(target, to.axis(), mesh))) {
          t = psum_scatter(t, m, to.axis());
          now.set(m, to);
          continue;
        }
      }
      t = from.op() == PartialOp::sum ? psum(t, m) : pmax(t, m);
      now.set(m, Placement::replicate());
    }
  }

  // Phase 4: a replica becomes a partial sum by keeping it on the group's first device only (a
  // partial max of copies is the copies themselves).
  void make_partial() {
    for (const auto& m : mesh.axis_names()) {
      const Placement& to = target.on(m);
      if (!to.is_partial() || !now.on(m).is_replicate()) continue;
      if (to.op() == PartialOp::max) {
        t = pvary(t, m);
      } else {  // typed a partial sum (not merely per-device), as it is: psum gives the replica back
        t = t * cast(eq(axis_index(m), scalar(0, DType::i32)), t.dtype());
        VaryType vary = t.vary();
        vary.set_partial(m, PartialKind::sum);
        t = t.with_vary(vary);
      }
      now.set(m, to);
    }
  }

  // Phase 5: cut what the target cuts, at the minor end.
  void shard() {
    for (const auto& axis : t.shape().names()) {
      const auto cuts = cuts_of(now, axis, mesh);
      const auto wanted = cuts_of(target, axis, mesh);
      for (std::size_t i = cuts.size(); i < wanted.size(); ++i) {
        t = own_block(t, wanted[i], axis);
        now.set(wanted[i], Placement::shard(axis));
      }
    }
  }
};

}  // namespace

using global_detail::partial_ops;

GlobalTensor redistribute(const GlobalTensor& x, const Placements& target) {
  if (!x.defined()) fail("redistribute", "the tensor is undefined");
  if (x.placements() == target) return x;
  const Mesh& mesh = Shard::current()->mesh();
  check_target(x, target, mesh);
  Redistribution r{mesh, target, x.local(), x.placements()};
  r.unshard();
  r.shard_replicas();
  r.reduce();
  r.make_partial();
  r.shard();
  return GlobalTensor::from_local(r.t, partial_ops(target));
}

GlobalTensor with_sharding_constraint(const GlobalTensor& x, const AxisRules& rules) {
  if (!x.defined()) fail("with_sharding_constraint", "the tensor is undefined");
  const Mesh& mesh = Shard::current()->mesh();
  Placements target;
  for (const auto& axis : x.shape().names())
    for (const auto& m : rules.mesh_axes(axis)) {
      if (!mesh.has(m)) fail("with_sharding_constraint", "{}: rule {} -> {} names no axis of mesh {}", x.str(), axis, m, mesh.str());
      if (!target.on(m).is_replicate())
        fail("with_sharding_constraint", "{}: mesh axis '{}' would cut both '{}' and '{}' (rules {})", x.str(), m, target.on(m).axis(), axis,
             rules.str());
      target.set(m, Placement::shard(axis));
    }
  return redistribute(x, target);
}

GlobalTensor stop_gradient(const GlobalTensor& x) { return GlobalTensor::from_local(stop_gradient(x.local()), partial_ops(x.placements())); }

GlobalTensor parameter(const GlobalTensor& x) { return GlobalTensor::from_local(parameter(x.local()), partial_ops(x.placements())); }

}  // namespace nax
