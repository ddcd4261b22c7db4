// Indexing ops: one_hot, argmax / argmin, top_k, scatter_add. argmax and top_k run the device's row
// kernel (kernels::top_k_rows) where it has one, else are composed of the elementwise and reduction
// ops (k passes); one_hot is a comparison with arange; scatter_add runs the embedding gradient's
// scatter_add_rows kernel, and its gradient to the updates is an embedding (a row gather). Indices
// are i32 and take no gradient.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <optional>

#include "deterministic/deterministic.h"
#include "ops/tape.h"
#include "nax/ops/index_ops.h"
#include "nax/ops/collectives.h"
#include "nax/ops/transformer_ops.h"
#include "ops/across_blocks.h"
#include "ops/row_ops.h"

namespace nax {

namespace {

Tensor constant_on(const std::shared_ptr<Device>& device, double value, DType dtype) {
  Tensor out = detail::make_result(Shape{}, dtype, VaryType{}, device);
  detail::kernels_of(out).fill(dtype, out.raw_mutable(), 1, value);
  return out;
}

void check_ids(std::string_view op, const Tensor& ids) {
  if (ids.dtype() != DType::i32) fail(op, "ids must be i32, got {}", ids.str());
}

// The value below (above) every other of `dtype`: what an excluded element is replaced with.
double lowest(DType dtype, bool largest) {
  const double bound = is_floating(dtype) ? INFINITY : static_cast<double>(std::numeric_limits<std::int32_t>::max());
  return largest ? -bound : bound;
}

// The first index along `axis` of the largest (smallest) element of v not marked in `taken` (1 =
// excluded; undefined: none), NaN first. v carries no history.
Tensor first_extreme_index(const Tensor& v, const std::string& axis, bool largest, const Tensor& taken) {
  const auto& device = v.device_ptr();
  const std::int64_t n = v.size(axis);
  const Tensor candidates = taken.defined() ? where(taken, constant_on(device, lowest(v.dtype(), largest), v.dtype()), v) : v;
  const Tensor extreme = largest ? max(candidates, axis) : min(candidates, axis);
  Tensor hit = eq(v, extreme);
  Tensor nan = ne(v, v);
  if (taken.defined()) {
    hit = hit * (1.0 - taken);
    nan = nan * (1.0 - taken);
  }
  const Tensor has_nan = max(nan, axis);
  hit = where(has_nan, nan, hit);
  const Tensor positions = detail::transfer(arange(Axis{axis, n}, DType::i32), device);
  return min(where(hit, positions, constant_on(device, static_cast<double>(n), DType::i32)), axis);
}

// Values and i32 indices of the k extreme elements of v (no history) along `axis`, with v's other
// axes then `k_axis`, by the device's row kernel; nullopt where the device has none.
std::optional<TopK> top_k_by_kernel(const Tensor& v, const std::string& axis, std::int64_t k, bool largest, const std::string& k_axis) {
  const std::int64_t n = v.size(axis);
  const Tensor rows = detail::permute_to(v, detail::order_with_last(v.shape(), axis));
  std::vector<Axis> axes = rows.shape().axes();
  axes.back() = Axis{k_axis, k};
  Tensor values = detail::make_result(Shape(axes), v.dtype(), v.vary(), v.device_ptr());
  Tensor indices = detail::make_result(Shape(axes), DType::i32, v.vary(), v.device_ptr());
  if (!detail::kernels_of(values).top_k_rows(v.dtype(), n == 0 ? 0 : rows.numel() / n, n, k, largest, rows.raw(), values.raw_mutable(),
                                             indices.mutable_data<std::int32_t>()))
    return std::nullopt;
  return TopK{values, indices};
}

Tensor arg_extreme(std::string_view op, const Tensor& x, const std::string& axis, bool largest) {
  const auto op_span = detail::enter_op(op, {&x});
  const int i = x.shape().require(axis, op);
  if (x.shape()[i].size == 0) fail(op, "axis '{}' of {} is empty", axis, x.str());
  if (!x.vary().split_mesh_axes(axis).empty()) {
    const std::string one = std::string(op) + "_of_" + axis;
    const Tensor v = stop_gradient(x);  // only the indices are wanted: record nothing
    return squeeze(detail::top_k_across_blocks(largest ? v : neg(v), axis, 1, one).indices, one);
  }
  const Tensor v = detail::compute_values(x);
  if (auto by_kernel = top_k_by_kernel(v, axis, 1, largest, axis)) return squeeze(by_kernel->indices, axis);
  return first_extreme_index(v, axis, largest, Tensor());
}

// top_k composed of other ops: k passes of first_extreme_index, each value picked from x by a
// one-hot mask (exact, and differentiable in x).
TopK composed_top_k(const Tensor& x, const std::string& axis, std::int64_t k, const std::string& k_axis) {
  const std::int64_t n = x.size(axis);
  const Tensor v = stop_gradient(x);
  const Tensor zero = constant_on(x.device_ptr(), 0.0, x.dtype());
  Tensor taken;
  std::vector<Tensor> values, indices;
  for (std::int64_t j = 0; j < k; ++j) {
    const Tensor index = first_extreme_index(v, axis, true, taken);
    const Tensor chosen = one_hot(index, Axis{axis, n}, x.dtype());
    values.push_back(sum(where(chosen, x, zero), axis));
    indices.push_back(index);
    taken = taken.defined() ? taken + chosen : chosen;
  }
  const int last = x.rank() - 1;
  return {stack(values, k_axis, last), stack(indices, k_axis, last)};
}

std::string names_of(const Shape& shape) { return fmt::format("{}", fmt::join(shape.names(), ", ")); }

void check_scatter(const Tensor& target, const std::string& axis, const Tensor& ids, const Tensor& updates) {
  check_ids("scatter_add", ids);
  detail::check_same_dtype("scatter_add", target, updates);
  // Each device adds the rows of its own ids: over a mesh axis that cuts the ids the added rows are
  // a partial sum, and a target that is not one (nor zero) would be counted once per device.
  for (const auto& a : ids.shape().names())
    for (const auto& m : ids.vary().split_mesh_axes(a))
      if (!target.vary().partial_sum(m) && !target.known_zero())
        fail("scatter_add", "axis '{}' of the ids {} is cut over mesh axis '{}', so the rows each device adds are a partial sum "
             "over it, but the target {} is not one: psum would count it {} times; scatter into zeros and add the target after "
             "the psum", a, ids.str(), m, target.str(), axis_size(m));
  detail::check_floating("scatter_add", target);
  target.shape().require(axis, "scatter_add");
  detail::check_axis_whole("scatter_add", target, axis, "each device holds a block of the rows");
  for (const auto& a : ids.shape().axes())
    if (target.shape().has(a.name))
      fail("scatter_add", "ids axis '{}' is also an axis of the target (rename one): ids {}, target {}", a.name, ids.str(), target.str());
  std::vector<Axis> expected = ids.shape().axes();
  for (const auto& a : target.shape().axes())
    if (a.name != axis) expected.push_back(a);
  bool ok = static_cast<int>(expected.size()) == updates.rank();
  for (const auto& a : expected) ok = ok && updates.shape().has(a.name) && updates.shape().size(a.name) == a.size;
  if (!ok)
    fail("scatter_add", "updates {} must have ids' axes and the target's axes other than '{}', i.e. [{}] in any order (ids {}, target {})",
         updates.str(), axis, names_of(Shape(expected)), ids.str(), target.str());
  if (ids.numel() == 0) return;
  const std::int64_t n = target.size(axis);
  const Tensor all = ids.rank() == 0 ? ids : stop_gradient(ids);
  const double low = ids.rank() == 0 ? all.item() : min(all, all.shape().names()).item();
  const double high = ids.rank() == 0 ? low : max(all, all.shape().names()).item();
  if (low < 0 || high >= static_cast<double>(n))
    fail("scatter_add", "ids range over [{}, {}] but axis '{}' of the target {} has size {}", low, high, axis, target.str(), n);
}

// The sum of the update rows at each id, as a tensor of shape `table` with `axis` first (the
// device's scatter_add_rows kernel: one pass over the updates).
Tensor added_rows(const Tensor& updates, const Shape& table, const std::string& axis, const Tensor& ids) {
  const std::vector<std::string> rows_first = [&] {
    std::vector<std::string> order{axis};
    for (const auto& a : table.axes())
      if (a.name != axis) order.push_back(a.name);
    return order;
  }();
  std::vector<std::string> update_order = ids.shape().names();
  update_order.insert(update_order.end(), rows_first.begin() + 1, rows_first.end());
  const Tensor rows = detail::permute_to(updates, update_order);
  std::vector<Axis> axes;
  for (const auto& name : rows_first) axes.push_back(table[table.index_of(name)]);
  const Shape shape(axes);
  const std::int64_t n = table.size(axis);
  Tensor added = detail::make_result(shape, rows.dtype(), detail::merge_vary("scatter_add", {&ids, &rows}, ids.shape().names()),
                                     rows.device_ptr());
  detail::kernels_of(added).scatter_add_rows(rows.dtype(), ids.data<std::int32_t>(), ids.numel(), kernels::VocabRange{0, n}, rows.raw(),
                                             n == 0 ? 0 : shape.numel() / n, added.raw_mutable(),
                                             deterministic::sum_tree("scatter_add", ids, ids.shape().names()));
  return added;
}

}  // namespace

Tensor one_hot(const Tensor& ids, const Axis& axis, DType dtype) {
  const auto op_span = detail::enter_op("one_hot", {&ids});
  check_ids("one_hot", ids);
  if (ids.shape().has(axis.name)) fail("one_hot", "the new axis '{}' is already an axis of the ids {}", axis.name, ids.str());
  const Tensor positions = detail::transfer(arange(axis, DType::i32), ids.device_ptr());
  return cast(eq(stop_gradient(ids), positions), dtype);
}

Tensor argmax(const Tensor& x, const std::string& axis) { return arg_extreme("argmax", x, axis, true); }
Tensor argmin(const Tensor& x, const std::string& axis) { return arg_extreme("argmin", x, axis, false); }

TopK top_k(const Tensor& x, const std::string& axis, std::int64_t k, const std::string& k_axis) {
  const auto op_span = detail::enter_op("top_k", {&x});
  x.shape().require(axis, "top_k");
  const std::int64_t n = x.size(axis);
  const auto cuts = x.vary().split_mesh_axes(axis);
  const std::int64_t global = cuts.empty() ? n : n * axis_size(cuts);
  if (k < 1 || k > global) fail("top_k", "k = {} must lie in [1, {}] (the size of axis '{}' of {})", k, global, axis, x.str());
  if (x.shape().has(k_axis)) fail("top_k", "the new axis '{}' is already an axis of {}", k_axis, x.str());
  if (!cuts.empty()) return detail::top_k_across_blocks(x, axis, k, k_axis);
  auto by_kernel = top_k_by_kernel(detail::compute_values(x), axis, k, true, k_axis);
  if (!by_kernel) return composed_top_k(x, axis, k, k_axis);
  Tensor values = detail::narrow_to(by_kernel->values, x.dtype());  // exact: the values are x's
  if (autodiff::any_requires_grad({&x}))
    values = autodiff::record("top_k", values, {x}, [indices = by_kernel->indices, axis, n, k_axis](const Tensor& g) {
      return std::vector<Tensor>{dot(one_hot(indices, Axis{axis, n}, g.dtype()), g, k_axis)};  // g at the chosen elements
    });
  return {values, by_kernel->indices};
}

Tensor scatter_add(const Tensor& target, const std::string& axis, const Tensor& ids, const Tensor& updates) {
  const auto op_span = detail::enter_op("scatter_add", {{&target, OnPartial::accumulate}, &ids, {&updates, OnPartial::accumulate}});
  check_scatter(target, axis, ids, updates);
  const Tensor out = detail::compute_values(target) + added_rows(detail::compute_values(updates), target.shape(), axis, ids);
  const Tensor result = detail::narrow_to(out, target.dtype());
  if (!autodiff::any_requires_grad({&target, &updates})) return result;
  return autodiff::record("scatter_add", result, {target, updates}, [axis, ids](const Tensor& g) {
    return std::vector<Tensor>{g, embedding(g, ids, axis)};  // updates: g's rows at ids
  });
}

}  // namespace nax
