#pragma once
// What every op implementation includes: how an op starts and the vary rules it applies, the dtype
// it computes in, copies between devices and layouts, and the helpers defined with their ops.
#include <string>
#include <vector>

#include "nax/kernels/kernels.h"
#include "nax/ops/ops.h"
#include "nax/shard/shard.h"
#include "ops/compute_dtype.h"
#include "ops/op_entry.h"
#include "ops/transfer.h"
#include "ops/vary_rules.h"
#include "tensor/copies.h"

namespace nax::detail {

// Copies x into the axis order `order` (a permutation of x's axes); x itself when already there
// (layout.cpp).
Tensor permute_to(const Tensor& x, const std::vector<std::string>& order);

// g summed over the axes `shape` lacks: the gradient of a broadcast (reduce.cpp).
Tensor sum_to(const Tensor& g, const Shape& shape);

// The block at `offsets` (of shape `local`) of the global random tensor of shape `global`
// (creation.cpp).
Tensor random_block(const Shape& global, const Shape& local, const std::vector<std::int64_t>& offsets,
                    std::uint64_t seed, std::string_view name, DType dtype, bool normal, double a, double b);

}  // namespace nax::detail
