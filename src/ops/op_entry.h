#pragma once
// How every op starts (op_entry.cpp): its result made, its operands checked, its trace slice opened.
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "nax/core/vary.h"
#include "nax/tensor/tensor.h"
#include "nax/trace/trace.h"

namespace nax::detail {

// A fresh tensor for an op's result, on `device`.
Tensor make_result(const Shape& shape, DType dtype, VaryType vary, const std::shared_ptr<Device>& device);

// An op's operand and what the op does with it if it is a partial value (refuse unless the op
// says otherwise: nax/core/vary.h).
struct Operand {
  Operand(const Tensor* t, OnPartial rule = OnPartial::refuse) : tensor(t), on_partial(rule) {}
  const Tensor* tensor;
  OnPartial on_partial;
};

// Throws naming `op` when the operands live on different devices or are undefined.
void check_operands(std::string_view op, std::initializer_list<const Tensor*> operands);
void check_operands(std::string_view op, const std::vector<const Tensor*>& operands);
// check_operands, the partial-value rules of the operands' OnPartial, then the op's slice in the
// trace (nax/trace/trace.h) until the returned span ends: every op enters through it, so an op holds it
// for its whole body.
[[nodiscard]] trace::Span enter_op(std::string_view op, std::initializer_list<Operand> operands);
[[nodiscard]] trace::Span enter_op(std::string_view op, const std::vector<Operand>& operands);
void check_same_dtype(std::string_view op, const Tensor& a, const Tensor& b);

std::string describe(const std::vector<const Tensor*>& operands);  // "f32[a=2] and f32[b=3]"

}  // namespace nax::detail
