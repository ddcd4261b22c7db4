#pragma once
// How a reduction combines values: the kernels' reduce and accumulate, the communicators'
// all_reduce and reduce_scatter, and the global view's partial placements all use this one enum.
#include <string_view>

namespace nax {

enum class ReduceOp { sum, max, min };
std::string_view reduce_op_name(ReduceOp op);  // "sum", "max" or "min"

}  // namespace nax
