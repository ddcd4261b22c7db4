// Elementwise ops, broadcasting by axis name: the result has a's axes in order, then b's others.
#include <utility>

#include "deterministic/deterministic.h"
#include "ops/tape.h"
#include "ops/internal.h"

namespace nax {

namespace {

std::string_view binary_name(kernels::BinaryOp op) {
  static constexpr std::string_view names[] = {"add", "sub", "mul", "div", "maximum", "minimum", "pow",
                                               "eq",  "ne",  "lt",  "le",  "gt",      "ge"};
  return names[static_cast<int>(op)];
}

std::vector<Axis> broadcast_axes(std::string_view op, const Tensor& a, const Tensor& b) {
  std::vector<Axis> axes = a.shape().axes();
  for (const auto& axis : b.shape().axes()) {
    int i = a.shape().index_of(axis.name);
    if (i < 0) axes.push_back(axis);
    else if (a.shape()[i].size != axis.size)
      fail(op, "axis '{}' has size {} on the left and {} on the right: {}", axis.name, a.shape()[i].size, axis.size,
           detail::describe({&a, &b}));
  }
  return axes;
}

// What each binary op does with a partial value (docs/ops.md "Partial sums"): add and sub add
// their operands, mul scales one by the other, div scales its numerator; the rest are nonlinear.
std::pair<OnPartial, OnPartial> on_partial(kernels::BinaryOp op) {
  using kernels::BinaryOp;
  switch (op) {
    case BinaryOp::add:
    case BinaryOp::sub: return {OnPartial::add, OnPartial::add};
    case BinaryOp::mul: return {OnPartial::scale, OnPartial::scale};
    case BinaryOp::div: return {OnPartial::scale, OnPartial::refuse};
    default: return {OnPartial::refuse, OnPartial::refuse};
  }
}

Tensor binary_forward(kernels::BinaryOp op, const Tensor& a_in, const Tensor& b_in) {
  const auto name = binary_name(op);
  const auto [on_a, on_b] = on_partial(op);
  const auto op_span = detail::enter_op(name, {{&a_in, on_a}, {&b_in, on_b}});
  detail::check_same_dtype(name, a_in, b_in);
  Shape shape(broadcast_axes(name, a_in, b_in));
  VaryType vary = detail::merge_vary(name, {&a_in, &b_in});
  if (detail::needs_widening(a_in) && !detail::kernels_of(a_in).binary_computes(DType::bf16))
    return detail::narrow_to(binary_forward(op, detail::widen(a_in), detail::widen(b_in)), DType::bf16);

  Tensor out = detail::make_result(shape, a_in.dtype(), vary, a_in.device_ptr());
  detail::kernels_of(out).binary(op, a_in.dtype(), a_in.raw(), b_in.raw(), out.raw_mutable(),
                                 detail::layout_over(shape.axes(), a_in.shape(), b_in.shape(), shape));
  return out;
}

// d out / d a (which = 0) or d out / d b (which = 1), times g, summed to that operand's axes.
Tensor binary_backward(kernels::BinaryOp op, int which, const Tensor& g, const Tensor& a, const Tensor& b, const Tensor& out) {
  using kernels::BinaryOp;
  const Shape& shape = which == 0 ? a.shape() : b.shape();
  switch (op) {
    case BinaryOp::add: return detail::sum_to(g, shape);
    case BinaryOp::sub: return detail::sum_to(which == 0 ? g : -g, shape);
    case BinaryOp::mul: return detail::sum_to(g * (which == 0 ? b : a), shape);
    case BinaryOp::div: return detail::sum_to(which == 0 ? g / b : -g * out / b, shape);
    case BinaryOp::max:
    case BinaryOp::min: {  // ties send the gradient to a
      Tensor pick_a = op == BinaryOp::max ? ge(a, b) : le(a, b);
      return detail::sum_to(g * (which == 0 ? pick_a : 1.0 - pick_a), shape);
    }
    case BinaryOp::pow: return detail::sum_to(which == 0 ? g * b * pow(a, b - 1.0) : g * out * log(a), shape);
    default:  // comparisons are flat
      return Tensor();
  }
}

Tensor binary(kernels::BinaryOp op, const Tensor& a, const Tensor& b) {
  using kernels::BinaryOp;
  Tensor out = binary_forward(op, a, b);
  if (!autodiff::any_requires_grad({&a, &b})) return out;
  const bool reads_b = op != BinaryOp::add && op != BinaryOp::sub;  // binary_backward's rules
  const bool reads_a = reads_b && op != BinaryOp::div;
  const bool reads_out = op == BinaryOp::div || op == BinaryOp::pow;
  return autodiff::record(std::string(binary_name(op)), out, {a, b},
                          [op, a = autodiff::kept(a, reads_a), b = autodiff::kept(b, reads_b), out = autodiff::kept(stop_gradient(out), reads_out)](const Tensor& g) {
                            return std::vector<Tensor>{a.requires_grad() ? binary_backward(op, 0, g, a, b, out) : Tensor(),
                                                       b.requires_grad() ? binary_backward(op, 1, g, a, b, out) : Tensor()};
                          });
}

Tensor unary_backward(kernels::UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& out) {
  using kernels::UnaryOp;
  switch (op) {
    case UnaryOp::neg: return -g;
    case UnaryOp::abs: return g * (gt(x, 0.0 * x) - lt(x, 0.0 * x));
    case UnaryOp::exp: return g * out;
    case UnaryOp::log: return g / x;
    case UnaryOp::sqrt: return g * 0.5 / out;
    case UnaryOp::rsqrt: return g * -0.5 * out * out * out;
    case UnaryOp::tanh: return g * (1.0 - out * out);
    case UnaryOp::square: return g * 2.0 * x;
  }
  return Tensor();
}

Tensor unary_forward(kernels::UnaryOp op, std::string_view name, const Tensor& x);

Tensor unary(kernels::UnaryOp op, std::string_view name, const Tensor& x) {
  Tensor out = unary_forward(op, name, x);
  if (!autodiff::any_requires_grad({&x})) return out;
  using kernels::UnaryOp;
  const bool reads_x = op == UnaryOp::abs || op == UnaryOp::log || op == UnaryOp::square;
  const bool reads_out = op == UnaryOp::exp || op == UnaryOp::sqrt || op == UnaryOp::rsqrt || op == UnaryOp::tanh;
  return autodiff::record(std::string(name), out, {x}, [op, x = autodiff::kept(x, reads_x), out = autodiff::kept(stop_gradient(out), reads_out)](const Tensor& g) {
    return std::vector<Tensor>{unary_backward(op, g, x, out)};
  });
}

Tensor unary_forward(kernels::UnaryOp op, std::string_view name, const Tensor& x) {
  // neg moves a partial sum's terms exactly; every other unary op is nonlinear.
  const auto op_span = detail::enter_op(name, {{&x, op == kernels::UnaryOp::neg ? OnPartial::move : OnPartial::refuse}});
  if (detail::needs_widening(x)) return detail::narrow_to(unary_forward(op, name, detail::widen(x)), DType::bf16);
  if (x.dtype() == DType::i32 && op != kernels::UnaryOp::neg && op != kernels::UnaryOp::abs && op != kernels::UnaryOp::square)
    fail(name, "needs a floating dtype, got {}", x.str());
  Tensor out = detail::make_result(x.shape(), x.dtype(), x.vary(), x.device_ptr());
  detail::kernels_of(out).unary(op, x.dtype(), x.raw(), out.raw_mutable(), x.numel());
  return out;
}

Tensor constant_like(const Tensor& x, double value) {
  Tensor c = Tensor::empty(Shape{}, x.dtype(), x.device_ptr());
  detail::kernels_of(c).fill(x.dtype(), c.raw_mutable(), 1, value);
  return c;
}

}  // namespace

// Deterministic mode: a sum of partial sums remembers its terms for psum (docs/determinism.md).
Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary(kernels::BinaryOp::add, a, b);
  deterministic::keep_terms_of_sum(out, a, b, /*negate_b=*/false);
  return out;
}
Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary(kernels::BinaryOp::sub, a, b);
  deterministic::keep_terms_of_sum(out, a, b, /*negate_b=*/true);
  return out;
}
Tensor mul(const Tensor& a, const Tensor& b) { return binary(kernels::BinaryOp::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(kernels::BinaryOp::div, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(kernels::BinaryOp::max, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(kernels::BinaryOp::min, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary(kernels::BinaryOp::pow, a, b); }
Tensor eq(const Tensor& a, const Tensor& b) { return binary(kernels::BinaryOp::eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary(kernels::BinaryOp::ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(kernels::BinaryOp::lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary(kernels::BinaryOp::le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(kernels::BinaryOp::gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary(kernels::BinaryOp::ge, a, b); }

Tensor neg(const Tensor& x) { return unary(kernels::UnaryOp::neg, "neg", x); }
Tensor abs(const Tensor& x) { return unary(kernels::UnaryOp::abs, "abs", x); }
Tensor exp(const Tensor& x) { return unary(kernels::UnaryOp::exp, "exp", x); }
Tensor log(const Tensor& x) { return unary(kernels::UnaryOp::log, "log", x); }
Tensor sqrt(const Tensor& x) { return unary(kernels::UnaryOp::sqrt, "sqrt", x); }
Tensor rsqrt(const Tensor& x) { return unary(kernels::UnaryOp::rsqrt, "rsqrt", x); }
Tensor tanh(const Tensor& x) { return unary(kernels::UnaryOp::tanh, "tanh", x); }
Tensor square(const Tensor& x) { return unary(kernels::UnaryOp::square, "square", x); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, double b) { return add(a, constant_like(a, b)); }
Tensor operator-(const Tensor& a, double b) { return sub(a, constant_like(a, b)); }
Tensor operator*(const Tensor& a, double b) { return mul(a, constant_like(a, b)); }
Tensor operator/(const Tensor& a, double b) { return div(a, constant_like(a, b)); }
Tensor operator+(double a, const Tensor& b) { return add(constant_like(b, a), b); }
Tensor operator-(double a, const Tensor& b) { return sub(constant_like(b, a), b); }
Tensor operator*(double a, const Tensor& b) { return mul(constant_like(b, a), b); }
Tensor operator/(double a, const Tensor& b) { return div(constant_like(b, a), b); }

}  // namespace nax
