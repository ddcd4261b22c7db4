#include "ops/internal.h"
#include "ops/vocab_parallel.h"

#include <fmt/format.h>

#include <algorithm>
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

void check_operands(std::string_view op, std::initializer_list<const Tensor*> operands) {
  const Device* first = nullptr;
  for (const Tensor* t : operands) {
    if (!t->defined()) fail(op, "an operand is undefined (a default-constructed Tensor)");
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

trace::Span enter_op(std::string_view op, std::initializer_list<const Tensor*> operands) {
  check_operands(op, operands);
  if (deterministic())
    for (const Tensor* t : operands) refuse_unfinished_sum(op, *t);
  return trace::Span("op", op, [&] {
    std::vector<std::string> shapes;
    std::size_t bytes = 0;
    for (const Tensor* t : operands) shapes.push_back(trace::quote(t->str())), bytes += t->nbytes();
    return fmt::format("\"operands\": [{}], \"bytes_in\": {}", fmt::join(shapes, ", "), bytes);
  });
}

void check_same_dtype(std::string_view op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype())
    fail(op, "dtype mismatch: {} and {} (cast one of them first)", a.str(), b.str());
}

void refuse_unfinished_terms(std::string_view op, const Tensor& x) {
  std::vector<std::string> axes;
  for (const auto& e : x.vary().entries())
    if (e.kind == Vary::Varying && e.reason == VaryReason::partial_sum) axes.push_back(e.mesh_axis);
  fail(op, "deterministic mode: {} is a sum of partial sums over mesh axes ({}) that no psum has finished; {} of it would "
       "depend on the mesh's order of addition: psum it first (psum finishes each part in the canonical order)",
       x.str(), fmt::join(axes, ", "), op);
}

namespace {

// Ops exact on a partial sum's parts: they move, negate or ignore its elements, never combine them.
bool exact_on_partial_sums(std::string_view op) {
  static constexpr std::string_view ops[] = {"add",         "neg",     "concat",     "slice",           "rename",        "transpose",
                                             "expand_dims", "squeeze", "split_axis", "merge_axes",      "dynamic_slice", "full_like",
                                             "contiguous_copy"};
  return std::find(std::begin(ops), std::end(ops), op) != std::end(ops);
}

}  // namespace

void refuse_unfinished_sum(std::string_view op, const Tensor& x) {
  if (!x.partial_terms().empty() && op != "add") refuse_unfinished_terms(op, x);  // a layout change would lose the terms
  if (exact_on_partial_sums(op)) return;
  for (const auto& e : x.vary().entries())
    if (e.kind == Vary::Varying && e.reason == VaryReason::partial_sum)
      fail(op, "deterministic mode: {} is a partial sum over mesh axis '{}' that no psum has finished; {} of it would add the "
           "devices' parts in another order than one device adds the whole (psum it first; only add, neg, concat and layout "
           "ops may take partial sums)", x.str(), e.mesh_axis, op);
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

}  // namespace

std::vector<Tensor> partial_terms_of_sum(const Tensor& a, const Tensor& b, const Shape& shape) {
  if (!deterministic()) return {};
  bool common = false;
  for (const auto& e : a.vary().entries())
    common = common || (e.kind == Vary::Varying && e.reason == VaryReason::partial_sum && b.vary().kind(e.mesh_axis) == Vary::Varying &&
                        b.vary().reason(e.mesh_axis) == VaryReason::partial_sum);
  if (!common) return {};
  return {term_of_shape(a, shape), term_of_shape(b, shape)};  // each keeps its own terms: psum redoes the adds in order
}

VaryType merge_vary(std::string_view op, const std::vector<const Tensor*>& operands, const std::vector<std::string>& reduced,
                    VaryReason reduced_reason) {
  std::vector<std::string> mesh_axes;  // in order of first appearance
  for (const Tensor* t : operands)
    for (const auto& e : t->vary().entries())
      if (std::find(mesh_axes.begin(), mesh_axes.end(), e.mesh_axis) == mesh_axes.end()) mesh_axes.push_back(e.mesh_axis);

  VaryType result;
  for (const auto& m : mesh_axes) {
    bool varying = false;
    VaryReason reason = VaryReason::per_device;
    const Tensor* splitter = nullptr;
    for (const Tensor* t : operands) {
      Vary k = t->vary().kind(m);
      if (k == Vary::Varying) {
        const VaryReason p = t->vary().reason(m);
        reason = !varying || p == reason ? p : VaryReason::per_device;  // mixed reasons: just per-device
        varying = true;
      }
      if (k != Vary::Split) continue;
      if (splitter != nullptr && splitter->vary().split_axis(m) != t->vary().split_axis(m))
        fail(op, "two tensor axes, '{}' and '{}', are cut over mesh axis '{}' in one result: {}", splitter->vary().split_axis(m),
             t->vary().split_axis(m), m, describe(operands));
      if (splitter != nullptr && splitter->vary().split_mesh_axes(t->vary().split_axis(m)) != t->vary().split_mesh_axes(t->vary().split_axis(m)))
        fail(op, "axis '{}' is cut over mesh axes in different orders ({} vs {}): {}", t->vary().split_axis(m),
             fmt::join(splitter->vary().split_mesh_axes(t->vary().split_axis(m)), ","),
             fmt::join(t->vary().split_mesh_axes(t->vary().split_axis(m)), ","), describe(operands));
      splitter = t;
    }
    if (varying) {
      result.set_varying(m, reason);
      continue;
    }
    if (splitter == nullptr) continue;
    const std::string& a = splitter->vary().split_axis(m);
    for (const Tensor* t : operands)
      if (t->vary().kind(m) == Vary::Invariant && t->shape().has(a))
        fail(op, "axis '{}' is cut over mesh axis '{}' in one operand but whole in another: {} (shard both alike, or all_gather first)",
             a, m, describe(operands));
    if (std::find(reduced.begin(), reduced.end(), a) != reduced.end()) result.set_varying(m, reduced_reason);
    else result.set_split(m, a);
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
Tensor narrow_to(const Tensor& x, DType dtype) { return x.dtype() == dtype ? x : cast(x, dtype); }

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

double content_hash48(const Tensor& x) {
  const Tensor readable = x.device().host_accessible() ? x : transfer(x, Device::host());
  constexpr std::uint64_t kPrime = 1099511628211ull;
  std::uint64_t h = 1469598103934665603ull;
  const auto* bytes = static_cast<const unsigned char*>(readable.raw());
  const std::size_t n = static_cast<std::size_t>(readable.numel()) * dtype_size(readable.dtype());
  for (std::size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * kPrime;
  return static_cast<double>(h >> 16);
}

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
