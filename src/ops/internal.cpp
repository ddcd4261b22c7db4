#include "ops/internal.h"
#include "ops/node.h"
#include "ops/vocab_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>


namespace nax::detail {

const std::shared_ptr<Device>& current_device() {
  if (Shard* s = Shard::current()) return s->device_ptr();
  return Device::host();
}

thread_local ResultObserver* t_result_observer = nullptr;

ResultObserver* set_result_observer(ResultObserver* observer) { return std::exchange(t_result_observer, observer); }

Tensor make_result(const Shape& shape, DType dtype, VaryType vary, const std::shared_ptr<Device>& device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  if (!vary.invariant()) t = t.with_vary(std::move(vary));
  if (t_result_observer != nullptr) t_result_observer->made(t);
  return t;
}

std::string describe(const std::vector<const Tensor*>& operands) {
  std::vector<std::string> parts;
  for (const Tensor* t : operands) parts.push_back(t->str());
  return fmt::format("{}", fmt::join(parts, " and "));
}

void check_operands(std::string_view op, const std::vector<const Tensor*>& operands) {
  const Device* first = nullptr;
  for (const Tensor* t : operands) {
    if (!t->defined()) fail(op, "an operand is undefined (a default-constructed Tensor)");
    t->mark_read();
    autodiff::note_read(*t, op);
    if (first == nullptr) first = &t->device();
    else if (&t->device() != first) {
      if (t->device().str() == first->str())
        fail(op, "operands belong to different Runtimes (each has its own {}): a tensor made in another Runtime's run cannot be "
             "used here (pass it through the host with gather and shard): {}", first->str(), describe(operands));
      fail(op, "operands live on different devices ({} and {}): {}", first->str(), t->device().str(), describe(operands));
    }
  }
  if (Shard* s = Shard::current(); s != nullptr && first != nullptr && !first->is_host() && first != s->device_ptr().get()) {
    if (first->str() == s->device_ptr()->str())
      fail(op, "operand belongs to another Runtime (its {} is not this run's): a tensor made in another Runtime's run cannot be "
           "used here (pass it through the host with gather and shard): {}", first->str(), describe(operands));
    fail(op, "operand lives on {} but this code runs on cpu:{}: pass tensors between devices with collectives: {}", first->str(),
         s->device(), describe(operands));
  }
}

void check_operands(std::string_view op, std::initializer_list<const Tensor*> operands) {
  check_operands(op, std::vector<const Tensor*>(operands));
}

namespace {

std::vector<const Tensor*> tensors_of(const std::vector<Operand>& operands) {
  std::vector<const Tensor*> out;
  for (const auto& o : operands) out.push_back(o.tensor);
  return out;
}

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
        fail(op, "{} is {} but {} is {}: finish each with its own collective before combining them", p.str(), what_partial(p, m),
             x.str(), what_partial(x, m));
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

// Deterministic mode: partial sums go only through ops that move their elements or add them
// (those keep each sum's terms for psum); any other op would reassociate a sum by the mesh.
void refuse_inexact(std::string_view op, const Operand& o) {
  const Tensor& x = *o.tensor;
  if (!x.partial_terms().empty() && o.on_partial != OnPartial::add)
    fail(op, "deterministic mode: {} is a sum of partial sums over mesh axes ({}) that no psum has finished; {} of it would "
         "depend on the mesh's order of addition: psum it first (psum finishes each part in the canonical order)",
         x.str(), fmt::join(x.vary().partial_mesh_axes(), ", "), op);
  if (o.on_partial == OnPartial::add || o.on_partial == OnPartial::move) return;
  for (const auto& e : x.vary().entries())
    if (e.kind == Vary::Partial && e.partial == PartialKind::sum)
      fail(op, "deterministic mode: {} is a partial sum over mesh axis '{}' that no psum has finished; {} of it would add the "
           "devices' parts in another order than one device adds the whole (psum it first; only ops that add partial sums or "
           "move their elements, such as add, neg, concat and layout ops, may take them)", x.str(), e.mesh_axis, op);
}

}  // namespace

trace::Span enter_op(std::string_view op, const std::vector<Operand>& operands) {
  check_operands(op, tensors_of(operands));
  std::vector<std::string> partial_axes;
  for (const auto& o : operands)
    for (const auto& m : o.tensor->vary().partial_mesh_axes())
      if (std::find(partial_axes.begin(), partial_axes.end(), m) == partial_axes.end()) partial_axes.push_back(m);
  if (!autodiff::transposing())
    for (const auto& m : partial_axes) check_partials_over(op, operands, m);
  if (deterministic())
    for (const auto& o : operands) refuse_inexact(op, o);
  return trace::Span("op", op, [&] {
    std::vector<std::string> shapes;
    std::size_t bytes = 0;
    for (const auto& o : operands) shapes.push_back(trace::quote(o.tensor->str())), bytes += o.tensor->nbytes();
    return fmt::format("\"operands\": [{}], \"bytes_in\": {}", fmt::join(shapes, ", "), bytes);
  });
}

trace::Span enter_op(std::string_view op, std::initializer_list<Operand> operands) {
  return enter_op(op, std::vector<Operand>(operands));
}

void check_same_dtype(std::string_view op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype())
    fail(op, "dtype mismatch: {} and {} (cast one of them first)", a.str(), b.str());
}

namespace {

// t as a term of a sum of shape `shape`: broadcast (with its own terms) where the add broadcast it.
Tensor term_of_shape(const Tensor& t, const Shape& shape) {
  if (t.shape() == shape) return t;
  Tensor wide = broadcast_to(t, shape);  // a copy, off the tape: the gradient flows through the add itself
  const auto& terms = t.partial_terms();
  if (terms.empty()) return wide;
  return wide.with_partial_terms({term_of_shape(terms[0], shape), term_of_shape(terms[1], shape)});
}

bool common_partial_sum(const Tensor& a, const Tensor& b) {
  for (const auto& m : a.vary().partial_mesh_axes())
    if (a.vary().partial_sum(m) && b.vary().partial_sum(m)) return true;
  return false;
}

}  // namespace

std::vector<Tensor> partial_terms_of_sum(const Tensor& a, const Tensor& b, const Shape& shape, bool negate_b) {
  if (!deterministic() || !common_partial_sum(a, b)) return {};
  Tensor right = b;
  if (negate_b) {
    if (!b.partial_terms().empty())  // negating would lose its terms
      fail("sub", "deterministic mode: {} is a sum of partial sums that no psum has finished; subtracting it would depend on the "
           "mesh's order of addition: psum it first", b.str());
    NoGrad no_grad;  // a term for psum only: the gradient flows through the sub itself
    right = neg(b);
  }
  return {term_of_shape(a, shape), term_of_shape(right, shape)};  // each keeps its own terms: psum redoes the adds in order
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
             "not this device's, as a block passed around a ring in a collective matmul, forget its cut with as_varying first)",
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
    if (varying && !aligned) {
      if (!reduces_cut) result.set_varying(m);
      else if (reduced_to) result.set_partial(m, *reduced_to);
      else result.set_varying(m);
      continue;
    }
    for (const Tensor* t : operands)
      if (!varying && t->vary().kind(m) == Vary::Invariant && t->shape().has(a))
        fail(op, "axis '{}' is cut over mesh axis '{}' in one operand but whole in another: {} (shard both alike, or all_gather "
             "first; a value that holds this device's block of '{}', made from per-device values such as axis_index, is no "
             "whole value: mark it with pvary(x, '{}'))", a, m, describe(operands), a, m);
    if (!reduces_cut) result.set_split(m, a);
    else if (reduced_to) result.set_partial(m, *reduced_to);
    else result.set_varying(m);
  }
  return result;
}

kernels::Dims strides_in_order(const Shape& x, const std::vector<Axis>& axes) {
  kernels::Dims out{};
  auto strides = x.strides();
  for (std::size_t i = 0; i < axes.size(); ++i) {
    int j = x.index_of(axes[i].name);
    out[i] = j < 0 ? 0 : strides[static_cast<std::size_t>(j)];
  }
  return out;
}

kernels::Dims sizes_of(const std::vector<Axis>& axes) {
  kernels::Dims out{};
  for (std::size_t i = 0; i < axes.size(); ++i) out[i] = axes[i].size;
  return out;
}

bool needs_widening(const Tensor& x) { return x.dtype() == DType::bf16 && !kernels_of(x).computes(DType::bf16); }
Tensor widen(const Tensor& x) { return needs_widening(x) ? cast(x, DType::f32) : x; }
// The op's own rounding of its result to the dtype it computes in, not a user's cast: it records
// nothing and is not subject to the partial-value rules (a bf16 dot's partial sum is bf16).
Tensor narrow_to(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  if (x.requires_grad()) return cast(x, dtype);
  Tensor out = make_result(x.shape(), dtype, x.vary(), x.device_ptr());
  kernels_of(out).convert(x.dtype(), x.raw(), dtype, out.raw_mutable(), x.numel());
  return out;
}

Tensor transfer(const Tensor& x, const std::shared_ptr<Device>& device) {
  if (x.device_ptr() == device) return x;
  Tensor out = make_result(x.shape(), x.dtype(), x.vary(), device);
  const Device& from = x.device();
  if (from.host_accessible()) device->kernels().copy_from_host(out.raw_mutable(), x.raw(), x.nbytes());
  else if (device->host_accessible()) {
    from.kernels().copy_to_host(out.raw_mutable(), x.raw(), x.nbytes());
    resolve_deferred_id_checks();
  }
  else return transfer(transfer(x, Device::host()), device);
  return out;
}

namespace {
std::uint64_t mix(std::uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}
}  // namespace

std::uint64_t content_hash64(const Tensor& x) {
  const Tensor readable = x.device().host_accessible() ? x : transfer(x, Device::host());
  const auto* bytes = static_cast<const unsigned char*>(readable.raw());
  const std::size_t n = readable.nbytes();
  constexpr std::uint64_t kMul = 0x9E3779B97F4A7C15ull;
  std::uint64_t lane[4] = {n, n ^ 1, n ^ 2, n ^ 3};
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) {
      std::uint64_t w;
      std::memcpy(&w, bytes + i + 8 * k, 8);
      lane[k] = (lane[k] ^ w) * kMul;
      lane[k] ^= lane[k] >> 29;
    }
  std::uint64_t h = mix(lane[0]) ^ mix(lane[1] + 1) * 3 ^ mix(lane[2] + 2) * 5 ^ mix(lane[3] + 3) * 7;
  for (; i < n; ++i) h = (h ^ bytes[i]) * kMul;
  return mix(h);
}

double content_hash48(const Tensor& x) { return static_cast<double>(content_hash64(x) >> 16); }

Tensor permute_to(const Tensor& x, const std::vector<std::string>& order) {
  if (x.shape().names() == order) return x;
  return transpose(x, order);
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  std::vector<std::string> extra;
  for (const auto& a : g.shape().axes())
    if (!shape.has(a.name)) extra.push_back(a.name);
  return extra.empty() ? g : sum(g, extra);
}

Tensor broadcast_to(const Tensor& g, const Shape& shape) {
  Tensor out = make_result(shape, g.dtype(), g.vary(), g.device_ptr());
  kernels::Layout<2> layout;
  layout.rank = shape.rank();
  layout.sizes = sizes_of(shape.axes());
  layout.strides[0] = strides_in_order(g.shape(), shape.axes());
  layout.strides[1] = strides_in_order(shape, shape.axes());
  detail::kernels_of(out).copy(dtype_size(g.dtype()), g.raw(), out.raw_mutable(), layout);
  return out;
}

}  // namespace nax::detail

namespace nax::detail {

bool deterministic() {
  const Shard* s = Shard::current();
  return s != nullptr && s->deterministic();
}

SumTree sum_tree(std::string_view op, const Tensor& x, const std::vector<std::string>& axes) {
  if (!deterministic()) return {};
  std::int64_t blocks = 1;
  const Mesh& mesh = Shard::current()->mesh();
  bool leading = true;  // every axis so far whole and of size 1
  for (const auto& axis : axes) {
    const auto cuts = x.vary().split_mesh_axes(axis);
    if (!cuts.empty()) {
      if (!leading)
        fail(op, "deterministic mode sums over ({}) of {}, where '{}' is cut over mesh axes ({}) behind another axis: a "
             "device's part would not be one block of the sum; sum over '{}' first or put it first",
             fmt::join(axes, ", "), x.str(), axis, fmt::join(cuts, ", "), axis);
      for (const auto& m : cuts) blocks *= mesh.axis_size(m);
    }
    if (!cuts.empty() || x.shape().size(axis) > 1) leading = false;
  }
  return SumTree::canonical_for_block_of(blocks);
}

}  // namespace nax::detail
