// The vary rules of ops on partial values and the vary type of an op's result (docs/ops.md).
#include "ops/vary_rules.h"

#include <fmt/format.h>

#include <algorithm>

#include "nax/shard/shard.h"
#include "ops/op_entry.h"

namespace nax::detail {

namespace {

std::string what_partial(const Tensor& x, const std::string& m) {
  return x.vary().local_mean(m) ? fmt::format("a local mean over mesh axis '{}' (a mean over a tensor axis cut along it)", m)
                                : fmt::format("a partial sum over mesh axis '{}' (one term of a sum over its devices)", m);
}

std::string finisher(const Tensor& x, const std::string& m) { return x.vary().local_mean(m) ? "pmean" : "psum"; }

std::string kind_of(const Tensor& x, const std::string& m) {
  switch (x.vary().kind(m)) {
    case Vary::Invariant: return "Invariant, the same on every device";
    case Vary::Split: return fmt::format("Split along '{}'", x.vary().split_axis(m));
    case Vary::Varying: return "Varying, per-device values";
    case Vary::Partial: return what_partial(x, m);
  }
  return "?";
}

// How many devices share a sum over mesh axis m, for messages.
std::string devices_over(const std::string& m) {
  const Shard* s = Shard::current();
  return s != nullptr && s->mesh().has(m) ? std::to_string(s->mesh().axis_size(m)) : "n";
}

bool sums_operands(OnPartial rule) { return rule == OnPartial::add || rule == OnPartial::accumulate || rule == OnPartial::move; }

}  // namespace

// The rules of OnPartial over mesh axis m, for an op with an operand partial over it.
void check_partials_over(std::string_view op, const std::vector<Operand>& operands, const std::string& m) {
  const Operand* factor = nullptr;
  const Tensor* partial = nullptr;
  for (const auto& o : operands) {
    const Tensor& x = *o.tensor;
    if (x.vary().kind(m) != Vary::Partial) continue;
    if (o.on_partial == OnPartial::refuse)
      fail(op, "{} is {}: {} of the parts is not {} of the whole; {} over '{}' first", x.str(), what_partial(x, m), op, op,
           finisher(x, m), m);
    if (o.on_partial == OnPartial::scale) {
      if (factor != nullptr)
        fail(op, "{} and {} are both partial over mesh axis '{}': the product of two sums is not the sum of the products; {} "
             "one of them over '{}' first", factor->tensor->str(), x.str(), m, finisher(x, m), m);
      factor = &o;
    }
    if (partial == nullptr) partial = &x;
  }
  const Tensor& p = *partial;
  // A local mean is what pmean averages, so constants and per-device values may join it
  // (pmean(mean + c) = the mean + c); a partial sum takes only its own kind.
  const bool mean = p.vary().local_mean(m);
  for (const auto& o : operands) {
    const Tensor& x = *o.tensor;
    const Vary k = x.vary().kind(m);
    if (k == Vary::Partial) {
      if (x.vary().partial(m) != p.vary().partial(m))
        fail(op, "{} is {} but {} is {}: finish each with its own collective before combining them (a per-device value "
             "joins a local mean as it is, Varying, with no as_partial)", p.str(), what_partial(p, m), x.str(), what_partial(x, m));
      continue;
    }
    // Split beside a partial value: merge_vary names it. A per-device factor or selector makes each
    // term its device's own weighting: still terms of one (weighted) sum.
    if (mean || k == Vary::Split) continue;
    if (!sums_operands(o.on_partial) || x.known_zero()) continue;  // zero is a term of any sum
    fail(op, "{} is {} but {} is {}: psum would add it once per device ({} times); {} it after the psum over '{}'{}", p.str(),
         what_partial(p, m), x.str(), kind_of(x, m), devices_over(m), op, m,
         k == Vary::Varying ? " (or, if it holds terms of this very sum, not a replicated value made Varying with pvary, "
                              "declare it with as_partial)"
                            : "");
  }
}

VaryType merge_vary(std::string_view op, const std::vector<const Tensor*>& operands, const std::vector<std::string>& reduced,
                    std::optional<PartialKind> reduced_to) {
  std::vector<std::string> mesh_axes;  // in order of first appearance
  for (const Tensor* t : operands)
    for (const auto& e : t->vary().entries())
      if (std::find(mesh_axes.begin(), mesh_axes.end(), e.mesh_axis) == mesh_axes.end()) mesh_axes.push_back(e.mesh_axis);

  VaryType result;
  for (const auto& m : mesh_axes) {
    bool varying = false;
    const Tensor* partial = nullptr;
    const Tensor* splitter = nullptr;
    for (const Tensor* t : operands) {
      Vary k = t->vary().kind(m);
      if (k == Vary::Varying) varying = true;
      if (k == Vary::Partial && partial == nullptr) partial = t;
      if (k != Vary::Split) continue;
      if (splitter != nullptr && splitter->vary().split_axis(m) != t->vary().split_axis(m))
        fail(op, "two tensor axes, '{}' and '{}', are cut over mesh axis '{}' in one result: {} (where one operand's block is "
             "not this device's, as a block passed around a ring in a collective matmul, forget its cut with as_varying first; "
             "attention over blocks of a cut sequence is attention_block, which needs no cast)",
             splitter->vary().split_axis(m), t->vary().split_axis(m), m, describe(operands));
      if (splitter != nullptr && splitter->vary().split_mesh_axes(t->vary().split_axis(m)) != t->vary().split_mesh_axes(t->vary().split_axis(m)))
        fail(op, "axis '{}' is cut over mesh axes in different orders ({} vs {}): {}", t->vary().split_axis(m),
             fmt::join(splitter->vary().split_mesh_axes(t->vary().split_axis(m)), ","),
             fmt::join(t->vary().split_mesh_axes(t->vary().split_axis(m)), ","), describe(operands));
      splitter = t;
    }
    if (partial != nullptr) {
      if (splitter != nullptr)
        fail(op, "{} is {} while {} is Split along '{}' over it: a term of a sum meets a block of a tensor ({} the one or "
             "all_gather the other first)", partial->str(), what_partial(*partial, m), splitter->str(), splitter->vary().split_axis(m),
             finisher(*partial, m));
      result.set_partial(m, partial->vary().partial(m));
      continue;
    }
    if (splitter == nullptr) {
      if (varying) result.set_varying(m);
      continue;
    }
    const std::string& a = splitter->vary().split_axis(m);
    const bool reduces_cut = std::find(reduced.begin(), reduced.end(), a) != reduced.end();
    // Per-device values that carry the cut axis hold values for this device's block of it (a
    // dropout mask, a weight per row): the result stays that block. Per-device values without it
    // make the result Varying (a block moved around a ring, a per-device constant). Either way,
    // summing over the cut axis sums this device's block only: a partial sum.
    bool aligned = false;
    for (const Tensor* t : operands) aligned = aligned || (t->vary().kind(m) == Vary::Varying && t->shape().has(a));
    if (!varying)
      for (const Tensor* t : operands)
        if (t->vary().kind(m) == Vary::Invariant && t->shape().has(a))
          fail(op, "axis '{}' is cut over mesh axis '{}' in one operand but whole in another: {} (shard both alike, or all_gather "
               "first; a value that holds this device's block of '{}', made from per-device values such as axis_index, is no "
               "whole value: mark it with pvary(x, '{}'))", a, m, describe(operands), a, m);
    if (reduces_cut && reduced_to) result.set_partial(m, *reduced_to);
    else if (reduces_cut || (varying && !aligned)) result.set_varying(m);
    else result.set_split(m, a);
  }
  return result;
}

}  // namespace nax::detail
