#pragma once
// The vary rules of ops (vary_rules.cpp, docs/ops.md): partial values checked against each
// operand's OnPartial, and the vary type of a result.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nax/core/vary.h"
#include "nax/tensor/tensor.h"
#include "ops/op_entry.h"

namespace nax::detail {

// The rules of OnPartial over mesh axis m, for an op with an operand partial over it: refusals
// name the op, the operands and the collective that finishes the sum.
void check_partials_over(std::string_view op, const std::vector<Operand>& operands, const std::string& m);

// The result vary type of an op over `operands` (docs/ops.md), once enter_op has checked their
// partial values: over each mesh axis a Partial operand makes the result Partial (a Split operand
// beside it is an error); a Split axis in `reduced` makes it Partial of `reduced_to` (a sum unless
// told; Varying when `reduced_to` is empty: max, min), even beside Varying operands; a Varying
// operand with the axis `a` cut keeps the result Split(a), one without it makes it Varying;
// Split(a) and Split(a) agree. Split(a) meeting a whole `a`, or two axes cut over one mesh axis,
// is an error.
VaryType merge_vary(std::string_view op, const std::vector<const Tensor*>& operands, const std::vector<std::string>& reduced = {},
                    std::optional<PartialKind> reduced_to = PartialKind::sum);

}  // namespace nax::detail
