// Layout ops: rename, transpose, split/merge axes, slice, concat, cast.
#include <fmt/format.h>

#include <set>

#include "ops/tape.h"
#include "ops/internal.h"

namespace nax {

namespace {

Tensor rename_forward(const Tensor& x, const std::vector<std::pair<std::string, std::string>>& renames) {
  const auto op_span = detail::enter_op("rename", {{&x, OnPartial::move}});
  std::vector<Axis> axes = x.shape().axes();
  VaryType vary = x.vary();
  std::set<std::string> sources;
  for (const auto& [from, to] : renames) {
    int i = x.shape().require(from, "rename");
    if (!sources.insert(from).second) fail("rename", "axis '{}' renamed twice in {}", from, x.str());
    axes[static_cast<std::size_t>(i)].name = to;
  }
  // Rename the vary type's tensor axes in two steps so that swaps ({a->b, b->a}) work.
  for (const auto& [from, to] : renames) vary.rename_tensor_axis(from, "\x01" + to);
  for (const auto& [from, to] : renames) vary.rename_tensor_axis("\x01" + to, to);
  for (std::size_t i = 0; i < axes.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (axes[i].name == axes[j].name)
        fail("rename", "the new name '{}' clashes with another axis of {} (renames: {})", axes[i].name, x.str(), [&] {
          std::vector<std::string> parts;
          for (const auto& [from, to] : renames) parts.push_back(from + "->" + to);
          return fmt::format("{}", fmt::join(parts, ", "));
        }());
  return x.with_shape(Shape(axes)).with_vary(vary);
}

Tensor transpose_forward(const Tensor& x, const Names& order) {
  const auto op_span = detail::enter_op("transpose", {{&x, OnPartial::move}});
  const auto& names = order.list();
  std::vector<Axis> axes;
  for (const auto& name : names) axes.push_back(x.shape()[x.shape().require(name, "transpose")]);
  const std::set<std::string> distinct(names.begin(), names.end());
  if (static_cast<int>(names.size()) != x.rank() || distinct.size() != names.size())
    fail("transpose", "order {} is not a permutation of the axes of {}", order.str(), x.str());
  Shape shape(axes);
  if (shape == x.shape()) return x;
  Tensor out = detail::make_result(shape, x.dtype(), x.vary(), x.device_ptr());
  detail::kernels_of(out).copy(dtype_size(x.dtype()), x.raw(), out.raw_mutable(), detail::layout_over(axes, x.shape(), shape));
  return out;
}

Tensor contiguous_copy_forward(const Tensor& x) {
  const auto op_span = detail::enter_op("contiguous_copy", {{&x, OnPartial::move}});
  Tensor out = detail::make_result(x.shape(), x.dtype(), x.vary(), x.device_ptr());
  detail::kernels_of(out).copy_bytes(out.raw_mutable(), x.raw(), x.nbytes());
  return out;
}

Tensor split_axis_forward(const Tensor& x, const std::string& axis, const std::vector<Axis>& parts) {
  const auto op_span = detail::enter_op("split_axis", {{&x, OnPartial::move}});
  int i = x.shape().require(axis, "split_axis");
  std::int64_t product = 1;
  std::vector<std::string> part_names;
  for (const auto& p : parts) {
    product *= p.size;
    part_names.push_back(fmt::format("{}={}", p.name, p.size));
  }
  if (parts.empty() || product != x.shape()[i].size)
    fail("split_axis", "parts [{}] do not multiply to the size {} of axis '{}' in {}", fmt::join(part_names, ", "),
         x.shape()[i].size, axis, x.str());
  std::vector<Axis> axes = x.shape().axes();
  axes.erase(axes.begin() + i);
  axes.insert(axes.begin() + i, parts.begin(), parts.end());
  Shape shape = [&] {
    try {
      return Shape(axes);
    } catch (const Error&) {
      fail("split_axis", "parts [{}] clash with the other axes of {}", fmt::join(part_names, ", "), x.str());
    }
  }();
  VaryType vary = x.vary();
  vary.rename_tensor_axis(axis, parts[0].name);  // a block of the outer part is a block of the whole
  return x.with_shape(shape).with_vary(vary);
}

Tensor merge_axes_forward(const Tensor& x, const Names& axes, const std::string& merged) {
  const auto op_span = detail::enter_op("merge_axes", {{&x, OnPartial::move}});
  const auto& names = axes.list();
  if (names.empty()) fail("merge_axes", "no axes to merge in {}", x.str());
  std::set<std::string> distinct(names.begin(), names.end());
  if (distinct.size() != names.size()) fail("merge_axes", "an axis is named twice in {}", axes.str());
  for (std::size_t j = 0; j < names.size(); ++j) {
    x.shape().require(names[j], "merge_axes");
    if (j > 0 && x.vary().split_mesh_axes(names[j]).size() > 0)
      fail("merge_axes", "axis '{}' is cut over mesh axis '{}'; only the first (outermost) merged axis may be cut: {}", names[j],
           x.vary().split_mesh_axes(names[j])[0], x.str());
  }
  // Bring the merged axes together, in the order given, where the first of them stands.
  std::vector<std::string> order;
  for (const auto& a : x.shape().axes()) {
    if (a.name == names[0]) order.insert(order.end(), names.begin(), names.end());
    else if (!distinct.count(a.name)) order.push_back(a.name);
  }
  Tensor t = x.shape().names() == order ? x : transpose_forward(x, order);
  std::vector<Axis> out_axes;
  std::int64_t size = 1;
  for (const auto& a : t.shape().axes()) {
    if (!distinct.count(a.name)) out_axes.push_back(a);
    else if (a.name == names[0]) out_axes.push_back({merged, 0});
  }
  for (const auto& n : names) size *= x.shape().size(n);
  for (auto& a : out_axes)
    if (a.name == merged && a.size == 0) a.size = size;
  Shape shape = [&] {
    try {
      return Shape(out_axes);
    } catch (const Error&) {
      fail("merge_axes", "merged name '{}' clashes with another axis of {}", merged, x.str());
    }
  }();
  VaryType vary = t.vary();
  vary.rename_tensor_axis(names[0], merged);
  return t.with_shape(shape).with_vary(vary);
}

Tensor slice_forward(const Tensor& x, const std::string& axis, std::int64_t start, std::int64_t stop) {
  const auto op_span = detail::enter_op("slice", {{&x, OnPartial::move}});
  int i = x.shape().require(axis, "slice");
  std::int64_t size = x.shape()[i].size;
  if (start < 0 || stop < start || stop > size)
    fail("slice", "range [{}, {}) is out of bounds for axis '{}' of size {} in {}", start, stop, axis, size, x.str());
  std::vector<Axis> axes = x.shape().axes();
  axes[static_cast<std::size_t>(i)].size = stop - start;
  Shape shape(axes);
  VaryType vary = x.vary();
  for (const auto& m : x.vary().split_mesh_axes(axis)) vary.set_varying(m);  // a slice of a block is no global block
  Tensor out = detail::make_result(shape, x.dtype(), vary, x.device_ptr());
  const kernels::Layout<2> layout = detail::layout_over(axes, x.shape(), shape);
  const std::size_t es = dtype_size(x.dtype());
  const auto* src = static_cast<const char*>(x.raw()) + static_cast<std::size_t>(start * layout.strides[0][static_cast<std::size_t>(i)]) * es;
  detail::kernels_of(out).copy(es, src, out.raw_mutable(), layout);
  return out;
}

Tensor concat_forward(const std::vector<Tensor>& xs, const std::string& axis) {
  if (xs.empty()) fail("concat", "no tensors to concatenate along '{}'", axis);
  const Tensor& first = xs[0];
  std::vector<detail::Operand> moved;
  for (const auto& x : xs) moved.push_back({&x, OnPartial::move});
  const auto op_span = detail::enter_op("concat", moved);
  int i = first.shape().require(axis, "concat");
  std::vector<Tensor> parts;
  std::int64_t total = 0;
  for (const auto& x : xs) {
    detail::check_operands("concat", {&first, &x});
    detail::check_same_dtype("concat", first, x);
    x.shape().require(axis, "concat");
    if (x.rank() != first.rank()) fail("concat", "axes differ: {} and {}", first.str(), x.str());
    for (const auto& a : first.shape().axes())
      if (a.name != axis && (!x.shape().has(a.name) || x.shape().size(a.name) != a.size))
        fail("concat", "{} and {} differ outside axis '{}'", first.str(), x.str(), axis);
    parts.push_back(detail::permute_to(x, first.shape().names()));
    total += x.shape().size(axis);
  }
  std::vector<Axis> axes = first.shape().axes();
  axes[static_cast<std::size_t>(i)].size = total;
  Shape shape(axes);
  std::vector<Tensor> typed;  // a block of a block is no global block: Split(axis) becomes Varying
  std::vector<const Tensor*> operands;
  for (const auto& p : parts) {
    VaryType pv = p.vary();
    for (const auto& m : pv.split_mesh_axes(axis)) pv.set_varying(m);
    typed.push_back(p.with_vary(pv));
  }
  for (const auto& t : typed) operands.push_back(&t);
  VaryType vary = detail::merge_vary("concat", operands);
  Tensor out = detail::make_result(shape, first.dtype(), vary, first.device_ptr());
  const std::size_t es = dtype_size(first.dtype());
  std::int64_t offset = 0;
  auto out_strides = shape.strides();
  for (const auto& p : parts) {
    char* dst = static_cast<char*>(out.raw_mutable()) + static_cast<std::size_t>(offset * out_strides[static_cast<std::size_t>(i)]) * es;
    detail::kernels_of(out).copy(es, p.raw(), dst, detail::layout_over(p.shape().axes(), p.shape(), shape));
    offset += p.shape().size(axis);
  }
  return out;
}

// Whether every value of `from` is a value of `to`: a lossy cast of a partial sum would round each
// term instead of the sum.
bool widens(DType from, DType to) {
  if (from == to || to == DType::f64) return true;
  if (from == DType::bf16) return to == DType::f32;
  return from == DType::i32 && to == DType::f32;  // exact below 2^24: counts and sums of masks
}

Tensor cast_forward(const Tensor& x, DType dtype) {
  const auto op_span = detail::enter_op("cast", {{&x, widens(x.dtype(), dtype) ? OnPartial::scale : OnPartial::refuse}});
  if (x.dtype() == dtype) return x;
  Tensor out = detail::make_result(x.shape(), dtype, x.vary(), x.device_ptr());
  detail::kernels_of(out).convert(x.dtype(), x.raw(), dtype, out.raw_mutable(), x.numel());
  return x.known_zero() ? out.as_known_zero() : out;
}

}  // namespace

// Each layout op's gradient is the inverse layout op applied to the incoming gradient.

Tensor rename(const Tensor& x, const std::vector<std::pair<std::string, std::string>>& renames) {
  Tensor out = rename_forward(x, renames);
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record("rename", out, {x}, [renames](const Tensor& g) {
    std::vector<std::pair<std::string, std::string>> back;
    for (const auto& [from, to] : renames) back.push_back({to, from});
    return std::vector<Tensor>{rename(g, back)};
  });
}

Tensor rename(const Tensor& x, const std::string& from, const std::string& to) { return rename(x, {{from, to}}); }

Tensor transpose(const Tensor& x, const Names& order) {
  Tensor out = transpose_forward(x, order);
  if (!autodiff::any_requires_grad({&x}) || out.same_storage(x)) return out;
  return autodiff::record("transpose", out, {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor contiguous_copy(const Tensor& x) {
  Tensor out = contiguous_copy_forward(x);
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record("contiguous_copy", out, {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor split_axis(const Tensor& x, const std::string& axis, const std::vector<Axis>& parts) {
  Tensor out = split_axis_forward(x, axis, parts);
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record("split_axis", out, {x}, [axis, parts](const Tensor& g) {
    std::vector<std::string> names;
    for (const auto& p : parts) names.push_back(p.name);
    return std::vector<Tensor>{merge_axes(g, names, axis)};
  });
}

Tensor merge_axes(const Tensor& x, const Names& axes, const std::string& merged) {
  Tensor out = merge_axes_forward(x, axes, merged);
  if (!autodiff::any_requires_grad({&x})) return out;
  std::vector<Axis> parts;
  for (const auto& name : axes.list()) parts.push_back({name, x.shape().size(name)});
  return autodiff::record("merge_axes", out, {x}, [merged, parts](const Tensor& g) {
    return std::vector<Tensor>{split_axis(g, merged, parts)};
  });
}

Tensor slice(const Tensor& x, const std::string& axis, std::int64_t start, std::int64_t stop) {
  Tensor out = slice_forward(x, axis, start, stop);
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record("slice", out, {x}, [x = x.without_data(), axis, start, stop](const Tensor& g) {
    std::vector<Tensor> pieces;
    auto zeros_of = [&](std::int64_t n) {
      std::vector<Axis> axes = g.shape().axes();
      axes[static_cast<std::size_t>(g.shape().index_of(axis))].size = n;
      Tensor z = detail::make_result(Shape(axes), g.dtype(), g.vary(), g.device_ptr());  // varies as g does
      detail::kernels_of(z).fill(z.dtype(), z.raw_mutable(), z.numel(), 0.0);
      return z;
    };
    if (start > 0) pieces.push_back(zeros_of(start));
    pieces.push_back(g);
    if (stop < x.shape().size(axis)) pieces.push_back(zeros_of(x.shape().size(axis) - stop));
    return std::vector<Tensor>{pieces.size() == 1 ? g : concat(pieces, axis)};
  });
}

Tensor concat(const std::vector<Tensor>& xs, const std::string& axis) {
  Tensor out = concat_forward(xs, axis);
  bool needed = false;
  for (const auto& x : xs) needed = needed || autodiff::any_requires_grad({&x});
  if (!needed) return out;
  std::vector<std::int64_t> sizes;
  for (const auto& x : xs) sizes.push_back(x.shape().size(axis));
  return autodiff::record("concat", out, xs, [axis, sizes](const Tensor& g) {
    std::vector<Tensor> grads;
    std::int64_t offset = 0;
    for (auto n : sizes) {
      grads.push_back(slice(g, axis, offset, offset + n));
      offset += n;
    }
    return grads;
  });
}

Tensor cast(const Tensor& x, DType dtype) {
  Tensor out = cast_forward(x, dtype);
  if (!autodiff::any_requires_grad({&x}) || out.same_storage(x)) return out;
  if (!is_floating(dtype) || !is_floating(x.dtype())) return stop_gradient(out);
  Tensor recorded = autodiff::record("cast", out, {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  if (recorded.grad_node()) recorded.grad_node()->passes_partial_sums = true;
  return recorded;
}

}  // namespace nax

namespace nax::detail {

Tensor permute_to(const Tensor& x, const std::vector<std::string>& order) {
  if (x.shape().names() == order) return x;
  return transpose(x, order);
}

}  // namespace nax::detail
