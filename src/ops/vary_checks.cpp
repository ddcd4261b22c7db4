// Checked vary casts and assertions (include/nax/ops/vary_checks.h).
#include "nax/ops/vary_checks.h"

#include <fmt/format.h>

#include "ops/tape.h"
#include "nax/ops/collectives.h"
#include "nax/ops/ops.h"
#include "ops/internal.h"

namespace nax {

namespace {

Shard& running(std::string_view op) {
  Shard* s = Shard::current();
  if (s == nullptr) fail(op, "runs inside Runtime::run");
  return *s;
}

// x's vary type with `mesh_axes` set back to how `original` cut them (in its order).
VaryType restore_cuts(const VaryType& now, const VaryType& original, const Names& mesh_axes) {
  VaryType out = now;
  for (const auto& e : original.entries())
    if (e.kind == Vary::Split && std::find(mesh_axes.list().begin(), mesh_axes.list().end(), e.mesh_axis) != mesh_axes.list().end())
      out.set_split(e.mesh_axis, e.tensor_axis);
  return out;
}

std::string kind_text(const VaryType& v, const std::string& m) {
  switch (v.kind(m)) {
    case Vary::Invariant: return "invariant";
    case Vary::Varying: return "varying";
    case Vary::Partial: return v.local_mean(m) ? "partial-mean" : "partial";
    case Vary::Split: return v.split_axis(m);
  }
  return "?";
}

}  // namespace

Tensor as_varying(const Tensor& x, const Names& mesh_axes) {
  running("as_varying").mesh().check_axes(mesh_axes.list(), "as_varying");
  detail::check_operands("as_varying", {&x});
  VaryType vary = x.vary();
  for (const auto& m : mesh_axes.list()) {
    if (x.vary().kind(m) != Vary::Split && x.vary().kind(m) != Vary::Partial)
      fail("as_varying", "{} is not Split or Partial over mesh axis '{}' ({}): as_varying forgets a cut or that a value is a term "
           "of a sum (use pvary for an Invariant value)", x.str(), m, kind_text(x.vary(), m));
    vary.set_varying(m);
  }
  Tensor out = x.with_vary(vary);
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record("as_varying", out, {x}, [original = x.vary(), mesh_axes](const Tensor& g) {
    return std::vector<Tensor>{g.with_vary(restore_cuts(g.vary(), original, mesh_axes))};
  });
}

Tensor as_split(const Tensor& x, const Names& mesh_axes, const std::string& axis) {
  running("as_split").mesh().check_axes(mesh_axes.list(), "as_split");
  detail::check_operands("as_split", {&x});
  x.shape().require(axis, "as_split");
  VaryType vary = x.vary();
  for (const auto& m : mesh_axes.list()) {
    if (x.vary().kind(m) == Vary::Split && x.vary().split_axis(m) == axis) continue;  // already what it declares
    if (x.vary().kind(m) != Vary::Varying && x.vary().kind(m) != Vary::Partial)
      fail("as_split", "{} is {} over mesh axis '{}': only a Varying or Partial value can be declared the blocks of '{}' (an "
           "Invariant value is whole on every device: slice its own block instead)", x.str(),
           x.vary().kind(m) == Vary::Split ? "already Split" : "Invariant", m, axis);
    vary.set_split(m, axis);
  }
  Tensor out = x.with_vary(vary);
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record("as_split", out, {x}, [mesh_axes](const Tensor& g) { return std::vector<Tensor>{as_varying(g, mesh_axes)}; });
}

Tensor as_partial(const Tensor& x, const Names& mesh_axes) {
  running("as_partial").mesh().check_axes(mesh_axes.list(), "as_partial");
  detail::check_operands("as_partial", {&x});
  VaryType vary = x.vary();
  for (const auto& m : mesh_axes.list()) {
    if (x.vary().kind(m) != Vary::Varying)
      fail("as_partial", "{} is {} over mesh axis '{}': only a Varying value can be declared a term of a sum over it{}", x.str(),
           kind_text(x.vary(), m), m,
           x.vary().kind(m) == Vary::Invariant ? " (an Invariant value would be counted once per device: pvary it on purpose first)" : "");
    vary.set_partial(m);
  }
  Tensor out = x.with_vary(vary);
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record("as_partial", out, {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

void expect_vary(const Tensor& x, std::string_view spec, std::source_location where) {
  Shard& s = running("expect_vary");
  detail::check_operands("expect_vary", {&x});
  VaryType want;
  std::string text(spec);
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      fail("expect_vary", "'{}' in \"{}\" is not mesh_axis=varying or mesh_axis=tensor_axis", item, spec);
    const std::string m = item.substr(0, eq), kind = item.substr(eq + 1);
    s.mesh().check_axes({m}, "expect_vary");
    if (kind == "varying") want.set_varying(m);
    else if (kind == "partial") want.set_partial(m, PartialKind::sum);
    else if (kind == "partial-mean") want.set_partial(m, PartialKind::mean);
    else want.set_split(m, kind);
    start = end + 1;
  }
  const std::string site = fmt::format("{}:{}", where.file_name(), where.line());
  for (const auto& m : s.mesh().axis_names()) {
    if (kind_text(want, m) != kind_text(x.vary(), m))
      fail("expect_vary", "{} is {} over mesh axis '{}' but {} expects {} (at {})", x.str(), kind_text(x.vary(), m), m, spec,
           kind_text(want, m), site);
  }
  for (const auto& e : want.entries())
    if (e.kind == Vary::Split && want.split_mesh_axes(e.tensor_axis) != x.vary().split_mesh_axes(e.tensor_axis))
      fail("expect_vary", "{}: '{}' is cut over mesh axes in another order than {} expects (at {})", x.str(), e.tensor_axis, spec, site);
  if (checking_enabled()) check_invariant(x, fmt::format("expect_vary at {}", site));
}

bool checking_enabled() {
  const Shard* s = Shard::current();
  return s != nullptr && s->check_values();
}

void check_invariant(const Tensor& x, std::string_view what) {
  Shard& s = running("check_invariant");
  std::vector<std::string> invariant;
  for (const auto& m : s.mesh().axis_names())
    if (x.vary().kind(m) == Vary::Invariant && s.mesh().group_size({m}) > 1) invariant.push_back(m);
  if (invariant.empty()) return;
  const double h48 = detail::content_hash48(x);
  const Tensor mine = detail::transfer(from_vector(Shape{{"device", 1}}, std::vector<double>{h48}, DType::f64), s.device_ptr());
  const auto hashes = all_gather_invariant(pvary(mine, invariant), invariant, "device").to_vector<double>();
  const std::vector<int> devices = s.mesh().group(s.device(), invariant);  // in group rank order, as gathered
  std::vector<int> differ;
  for (std::size_t r = 1; r < hashes.size(); ++r)
    if (hashes[r] != hashes[0]) differ.push_back(devices[r]);
  if (!differ.empty())
    fail("NAX_CHECK", "{} is typed Invariant over mesh axes ({}) but its values differ across those devices ({}): device {} "
         "holds other values than device{} {}; a per-device value needs pvary (or comes from a collective)", x.str(),
         fmt::join(invariant, ", "), what, devices[0], differ.size() > 1 ? "s" : "", fmt::join(differ, ", "));
}

}  // namespace nax
