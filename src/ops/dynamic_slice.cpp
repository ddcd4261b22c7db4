// dynamic_slice / dynamic_update_slice: slices whose start is a tensor (one value per device, e.g.
// axis_index(m) * block), read on the host; the data moves with the static slice and concat ops.
#include "ops/tape.h"
#include "nax/ops/index_ops.h"
#include "ops/row_ops.h"
#include "nax/trace/trace.h"

namespace nax {

namespace {

// The start as an integer, checked: an i32 scalar with [start, start + size) inside `axis`.
std::int64_t checked_start(std::string_view op, const Tensor& x, const std::string& axis, const Tensor& start, std::int64_t size) {
  if (start.dtype() != DType::i32 || start.rank() != 0) fail(op, "start must be an i32 scalar, got {}", start.str());
  const std::int64_t n = x.size(axis);
  if (size < 0 || size > n) fail(op, "size {} is outside [0, {}] (axis '{}' of {})", size, n, axis, x.str());
  const auto s = static_cast<std::int64_t>(start.item());
  if (s < 0 || s + size > n)
    fail(op, "start {} with size {} is out of bounds for axis '{}' of size {} in {}{}", s, size, axis, n, x.str(),
         Shard::current() ? fmt::format(" (on device {})", Shard::current()->device()) : "");
  return s;
}

// x's values with update's written at s along axis (no history); Split(axis) becomes Varying.
Tensor write_block(const Tensor& x, const Tensor& update, const std::string& axis, std::int64_t s) {
  const std::int64_t n = x.size(axis), u = update.size(axis);
  std::vector<Tensor> pieces;
  if (s > 0) pieces.push_back(slice(x, axis, 0, s));
  pieces.push_back(update);
  if (s + u < n) pieces.push_back(slice(x, axis, s + u, n));
  if (s == 0) pieces[0] = detail::permute_to(update, x.shape().names());  // concat keeps the first operand's order
  return concat(pieces, axis);
}

// (the retyped result is the op's: observers such as the locator's recorder read its type)
Tensor with_start_vary(std::string_view op, const Tensor& out, const Tensor& start) {
  return trace::made(out.with_vary(detail::merge_vary(op, {&out, &start})));
}

void check_update(const Tensor& x, const Tensor& update, const std::string& axis) {
  detail::check_same_dtype("dynamic_update_slice", x, update);
  x.shape().require(axis, "dynamic_update_slice");
  bool same = x.rank() == update.rank();
  for (const auto& a : x.shape().axes())
    same = same && update.shape().has(a.name) && (a.name == axis || update.size(a.name) == a.size);
  if (!same)
    fail("dynamic_update_slice", "update {} must have the axes of {} with equal sizes except along '{}'", update.str(), x.str(), axis);
  detail::check_axis_whole("dynamic_update_slice", x, axis, "each device holds a block of it");
}

}  // namespace

Tensor dynamic_slice(const Tensor& x, const std::string& axis, const Tensor& start, std::int64_t size) {
  const auto op_span = detail::enter_op("dynamic_slice", {{&x, OnPartial::move}, &start});
  x.shape().require(axis, "dynamic_slice");
  const std::int64_t s = checked_start("dynamic_slice", x, axis, start, size);
  const Tensor out = with_start_vary("dynamic_slice", slice(stop_gradient(x), axis, s, s + size), start);
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record("dynamic_slice", out, {x}, [x = stop_gradient(x).without_data(), axis, s](const Tensor& g) {
    return std::vector<Tensor>{write_block(zeros_like(x), g, axis, s)};
  });
}

Tensor dynamic_update_slice(const Tensor& x, const Tensor& update, const std::string& axis, const Tensor& start) {
  const auto op_span =
      detail::enter_op("dynamic_update_slice", {{&x, OnPartial::move}, {&update, OnPartial::move}, &start});
  check_update(x, update, axis);
  const std::int64_t u = update.size(axis);
  const std::int64_t s = checked_start("dynamic_update_slice", x, axis, start, u);
  const Tensor out = with_start_vary("dynamic_update_slice", write_block(stop_gradient(x), stop_gradient(update), axis, s), start);
  if (!autodiff::any_requires_grad({&x, &update})) return out;
  return autodiff::record("dynamic_update_slice", out, {x, update}, [axis, s, u](const Tensor& g) {
    const Tensor block = slice(g, axis, s, s + u);
    return std::vector<Tensor>{write_block(g, zeros_like(block), axis, s), block};
  });
}

}  // namespace nax
