// Global-view primitives: each states its sharding rule and runs the per-shard op (propagation.h).
#include <fmt/format.h>

#include "global/propagation.h"
#include "nax/ops/ops.h"
#include "nax/ops/transformer_ops.h"

namespace nax {

using global_detail::apply;
using global_detail::has;
using global_detail::Rule;
using global_detail::without;

namespace {

// The names of a, then b's other names: the result of a broadcasting elementwise op.
std::vector<std::string> union_of(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<std::string> out = a;
  for (const auto& n : b)
    if (!has(out, n)) out.push_back(n);
  return out;
}

GlobalTensor unary(const std::string& op, const GlobalTensor& x, bool linear, const std::function<Tensor(const Tensor&)>& fn) {
  Rule rule(op, op, {x.shape().names()}, x.shape().names());
  if (linear) rule.linear = {{0}};
  return apply(rule, {&x}, [&](const std::vector<Tensor>& t) { return fn(t[0]); });
}

// linear: the operand sets that may be partial sums together (add: both; mul: either one).
GlobalTensor binary(const std::string& op, const GlobalTensor& a, const GlobalTensor& b, std::vector<std::vector<int>> linear,
                    Tensor (*fn)(const Tensor&, const Tensor&)) {
  Rule rule(op, op, {a.shape().names(), b.shape().names()}, union_of(a.shape().names(), b.shape().names()));
  rule.linear = std::move(linear);
  return apply(rule, {&a, &b}, [&](const std::vector<Tensor>& t) { return fn(t[0], t[1]); });
}

std::string joined(const std::vector<std::string>& names) { return fmt::format("{}", fmt::join(names, ",")); }

}  // namespace

GlobalTensor add(const GlobalTensor& a, const GlobalTensor& b) { return binary("add", a, b, {{0, 1}}, nax::add); }
GlobalTensor sub(const GlobalTensor& a, const GlobalTensor& b) { return binary("sub", a, b, {{0, 1}}, nax::sub); }
GlobalTensor mul(const GlobalTensor& a, const GlobalTensor& b) { return binary("mul", a, b, {{0}, {1}}, nax::mul); }
GlobalTensor div(const GlobalTensor& a, const GlobalTensor& b) { return binary("div", a, b, {{0}}, nax::div); }
GlobalTensor operator+(const GlobalTensor& a, const GlobalTensor& b) { return add(a, b); }
GlobalTensor operator-(const GlobalTensor& a, const GlobalTensor& b) { return sub(a, b); }
GlobalTensor operator*(const GlobalTensor& a, const GlobalTensor& b) { return mul(a, b); }
GlobalTensor operator/(const GlobalTensor& a, const GlobalTensor& b) { return div(a, b); }

// Adding a constant to a partial sum would add it once per device: those need the whole value.
GlobalTensor operator+(const GlobalTensor& a, double b) { return unary("add_scalar", a, false, [b](const Tensor& t) { return t + b; }); }
GlobalTensor operator-(const GlobalTensor& a, double b) { return unary("sub_scalar", a, false, [b](const Tensor& t) { return t - b; }); }
GlobalTensor operator*(const GlobalTensor& a, double b) { return unary("mul_scalar", a, true, [b](const Tensor& t) { return t * b; }); }
GlobalTensor operator/(const GlobalTensor& a, double b) { return unary("div_scalar", a, true, [b](const Tensor& t) { return t / b; }); }
GlobalTensor operator*(double a, const GlobalTensor& b) { return b * a; }
GlobalTensor operator-(const GlobalTensor& x) { return unary("neg", x, true, [](const Tensor& t) { return -t; }); }
GlobalTensor exp(const GlobalTensor& x) { return unary("exp", x, false, [](const Tensor& t) { return exp(t); }); }
GlobalTensor log(const GlobalTensor& x) { return unary("log", x, false, [](const Tensor& t) { return log(t); }); }
GlobalTensor sqrt(const GlobalTensor& x) { return unary("sqrt", x, false, [](const Tensor& t) { return sqrt(t); }); }
GlobalTensor rsqrt(const GlobalTensor& x) { return unary("rsqrt", x, false, [](const Tensor& t) { return rsqrt(t); }); }
GlobalTensor tanh(const GlobalTensor& x) { return unary("tanh", x, false, [](const Tensor& t) { return tanh(t); }); }
GlobalTensor square(const GlobalTensor& x) { return unary("square", x, false, [](const Tensor& t) { return square(t); }); }
GlobalTensor gelu(const GlobalTensor& x) { return unary("gelu", x, false, [](const Tensor& t) { return gelu(t); }); }
GlobalTensor cast(const GlobalTensor& x, DType dtype) {
  return unary(fmt::format("cast_{}", dtype_name(dtype)), x, true, [dtype](const Tensor& t) { return cast(t, dtype); });
}

GlobalTensor dot(const GlobalTensor& a, const GlobalTensor& b, const Names& contract) {
  const auto& c = contract.list();
  Rule rule("dot", "dot:" + joined(c), {a.shape().names(), b.shape().names()}, without(union_of(a.shape().names(), b.shape().names()), c));
  rule.linear = {{0}, {1}};
  return apply(rule, {&a, &b}, [&](const std::vector<Tensor>& t) { return dot(t[0], t[1], contract); });
}

namespace {
GlobalTensor reduction(const std::string& op, const GlobalTensor& x, const Names& axes, PartialOp combine, bool linear,
                       Tensor (*fn)(const Tensor&, const Names&)) {
  for (const auto& a : axes.list()) x.shape().require(a, op);
  Rule rule(op, op + ":" + joined(axes.list()), {x.shape().names()}, without(x.shape().names(), axes.list()));
  rule.reduction = combine;
  if (linear) rule.linear = {{0}};
  return apply(rule, {&x}, [&](const std::vector<Tensor>& t) { return fn(t[0], axes); });
}
}  // namespace

GlobalTensor sum(const GlobalTensor& x, const Names& axes) { return reduction("sum", x, axes, PartialOp::sum, true, nax::sum); }
GlobalTensor max(const GlobalTensor& x, const Names& axes) { return reduction("max", x, axes, PartialOp::max, false, nax::max); }

// The per-shard mean divides by the local count; the global one by the global count.
GlobalTensor mean(const GlobalTensor& x, const Names& axes) {
  double count = 1;
  for (const auto& a : axes.list()) count *= static_cast<double>(x.shape().size(a));
  return sum(x, axes) / count;
}

// Layout ops move no data between devices: the placements follow the axes.
GlobalTensor rename(const GlobalTensor& x, const std::string& from, const std::string& to) {
  return GlobalTensor::from_local(rename(x.local(), from, to), global_detail::partial_ops(x.placements()));
}

GlobalTensor transpose(const GlobalTensor& x, const Names& order) {
  return GlobalTensor::from_local(transpose(x.local(), order), global_detail::partial_ops(x.placements()));
}

}  // namespace nax
