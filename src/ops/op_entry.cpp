// How every op starts: its result made, its operands checked (devices, reads, the partial-value
// rules, deterministic mode's refusals), and its slice of the trace opened.
#include "ops/op_entry.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "deterministic/deterministic.h"
#include "nax/shard/shard.h"
#include "ops/tape.h"
#include "ops/vary_rules.h"

namespace nax::detail {

Tensor make_result(const Shape& shape, DType dtype, VaryType vary, const std::shared_ptr<Device>& device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  if (!vary.invariant()) t = t.with_vary(std::move(vary));
  return trace::made(t);
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

}  // namespace

trace::Span enter_op(std::string_view op, const std::vector<Operand>& operands) {
  check_operands(op, tensors_of(operands));
  std::vector<std::string> partial_axes;
  for (const auto& o : operands)
    for (const auto& m : o.tensor->vary().partial_mesh_axes())
      if (std::find(partial_axes.begin(), partial_axes.end(), m) == partial_axes.end()) partial_axes.push_back(m);
  if (!autodiff::transposing())
    for (const auto& m : partial_axes) check_partials_over(op, operands, m);
  if (deterministic::on())
    for (const auto& o : operands) deterministic::check_operand(op, *o.tensor, o.on_partial);
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

}  // namespace nax::detail
