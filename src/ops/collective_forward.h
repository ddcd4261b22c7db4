#pragma once
// The forward halves of the collectives that have start forms (collectives.cpp), for
// async_collectives.cpp: the same checks, vary rules and packing, blocking or started by `launch`.
#include <string>
#include <utility>
#include <vector>

#include "nax/core/names.h"
#include "ops/collective_launch.h"

namespace nax::detail {

Tensor launch_psum(const Tensor& x, const Names& mesh_axes, Launch& launch);
Tensor launch_all_gather(const Tensor& x, const Names& mesh_axes, const std::string& axis, Launch& launch);
Tensor launch_psum_scatter(const Tensor& x, const Names& mesh_axes, const std::string& axis, Launch& launch);
Tensor launch_ppermute(const Tensor& x, const Names& mesh_axes, const std::vector<std::pair<int, int>>& pairs, Launch& launch);
// An Invariant x marked Varying over the group (an implicit pvary) when it takes a gradient.
Tensor vary_over_group(const Tensor& x, const Names& mesh_axes);
// The gradient of a gather's input from the gradient of its result's own block.
Tensor unstack_gradient(const Tensor& g, const Tensor& x, const std::string& axis);

}  // namespace nax::detail
