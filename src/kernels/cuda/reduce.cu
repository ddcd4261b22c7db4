// The reduction. The coalesced layout splits into the kept dimensions (one output each) and the
// reduced ones. A group of threads computes one output: a whole block (256) or a warp when the
// reduced dimensions are the input's innermost (the lanes read consecutive elements), a single
// thread when the kept ones are (neighbouring threads read neighbouring outputs' elements). When
// the outputs are too few to fill the GPU, the reduced range is also split over blockIdx.y; the
// splits' partial results (in the accumulation type) go to the workspace, and a second pass
// combines them in a fixed order, so the result does not depend on timing. Deterministic mode's
// sums (tree.on) go through tree_sums instead: one thread per (output, leaf), then one launch per
// level of the tree.
#include "kernels/cuda/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/group_reduce.cuh"
#include "kernels/cuda/layout.h"
#include "kernels/cuda/numeric.cuh"
#include "kernels/cuda/strided.cuh"
#include "kernels/cuda/tree_sum.cuh"
#include "nax/core/error.h"

namespace nax::cuda {

namespace {

using detail::compute_t;
using detail::convert_to;
using detail::Offsets;

constexpr int kThreads = 256;

struct ReducePlan {
  kernels::Layout<2> kept;     // the outputs' dimensions: strides[0] into the input, strides[1] into the output
  kernels::Layout<1> reduced;  // the reduced dimensions: strides into the input
  std::int64_t outputs = 1, reduce_count = 1;
  std::int64_t chunk = 1;  // reduced elements per split (blockIdx.y)
  bool partial = false;    // write partials[split * outputs + j] rather than the output
};

template <typename In, typename Acc, typename Out, ReduceOp op, int Group>
__global__ void __launch_bounds__(kThreads) reduce_kernel(const __grid_constant__ ReducePlan plan, const In* __restrict__ in,
                                                          Out* __restrict__ out) {
  constexpr int kGroupsPerBlock = kThreads / Group;
  const int lane = static_cast<int>(threadIdx.x) % Group;
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / Group;
  const std::int64_t split = blockIdx.y;
  const bool active = j < plan.outputs;
  Offsets<2> at{};
  Acc acc = detail::identity<op, Acc>();
  if (active) {
    at = detail::offsets_of(plan.kept, j);
    const In* base = in + at.at[0];
    const std::int64_t begin = split * plan.chunk;
    const std::int64_t end = min(plan.reduce_count, begin + plan.chunk);
    if (plan.reduced.rank == 1) {
      const std::int64_t stride = plan.reduced.strides[0][0];
      for (std::int64_t r = begin + lane; r < end; r += Group) acc = detail::combine<op>(acc, convert_to<Acc>(base[r * stride]));
    } else {
      for (std::int64_t r = begin + lane; r < end; r += Group)
        acc = detail::combine<op>(acc, convert_to<Acc>(base[detail::offsets_of(plan.reduced, r).at[0]]));
    }
  }
  acc = detail::group_reduce<Group>(acc, [](Acc a, Acc b) { return detail::combine<op>(a, b); });
  if (active && lane == 0) {
    if (plan.partial) out[split * plan.outputs + j] = convert_to<Out>(acc);
    else out[at.at[1]] = convert_to<Out>(acc);
  }
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The kept and the reduced dimensions of a coalesced layout, each coalesced again.
ReducePlan split_dimensions(const kernels::Layout<2>& l) {
  ReducePlan plan;
  for (int d = 0; d < l.rank; ++d) {
    if (l.strides[1][d] == 0) {
      auto& r = plan.reduced;
      r.sizes[r.rank] = l.sizes[d];
      r.strides[0][r.rank] = l.strides[0][d];
      ++r.rank;
    } else {
      auto& k = plan.kept;
      k.sizes[k.rank] = l.sizes[d];
      k.strides[0][k.rank] = l.strides[0][d];
      k.strides[1][k.rank] = l.strides[1][d];
      ++k.rank;
    }
  }
  plan.kept = kernels::coalesce(plan.kept);  // an empty list becomes one element
  plan.reduced = kernels::coalesce(plan.reduced);
  plan.outputs = detail::element_count(plan.kept);
  plan.reduce_count = detail::element_count(plan.reduced);
  return plan;
}

// Threads per output: lanes along the reduced dimensions when those are the innermost in memory.
int group_size(const ReducePlan& plan) {
  if (plan.reduce_count < 32) return 1;
  const std::int64_t reduced_inner = std::llabs(plan.reduced.strides[0][plan.reduced.rank - 1]);
  const std::int64_t kept_inner =
      plan.outputs == 1 ? std::numeric_limits<std::int64_t>::max() : std::llabs(plan.kept.strides[0][plan.kept.rank - 1]);
  if (reduced_inner >= kept_inner) return 1;
  return plan.reduce_count >= 4096 ? 256 : 32;
}

// Splits of the reduced range: enough for about one full wave of threads, each thread still
// combining at least kMinPerThread elements.
std::int64_t split_count(const ReducePlan& plan, int group, int multiprocessors) {
  constexpr std::int64_t kMinPerThread = 16;
  const std::int64_t target = static_cast<std::int64_t>(std::max(multiprocessors, 1)) * 2048;
  const std::int64_t active = plan.outputs * group;
  if (active >= target) return 1;
  const std::int64_t splits = std::min(ceil_div(target, active), ceil_div(plan.reduce_count, group * kMinPerThread));
  return std::clamp<std::int64_t>(splits, 1, 65535);
}

template <typename In, typename Acc, typename Out, ReduceOp op>
void launch(cudaStream_t stream, int group, const ReducePlan& plan, std::int64_t splits, const In* in, Out* out) {
  const std::int64_t blocks = ceil_div(plan.outputs, kThreads / group);
  if (blocks > std::numeric_limits<std::int32_t>::max()) fail("reduce", "{} outputs are too many for one grid", plan.outputs);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(splits));
  switch (group) {
    case 1: reduce_kernel<In, Acc, Out, op, 1><<<grid, kThreads, 0, stream>>>(plan, in, out); break;
    case 32: reduce_kernel<In, Acc, Out, op, 32><<<grid, kThreads, 0, stream>>>(plan, in, out); break;
    default: reduce_kernel<In, Acc, Out, op, kThreads><<<grid, kThreads, 0, stream>>>(plan, in, out); break;
  }
  NAX_CUDA_CHECK_LAUNCH();
}

// The second pass: partials [splits x outputs] combined per output, written where plan.kept says.
ReducePlan combine_partials_plan(const ReducePlan& first, std::int64_t splits) {
  ReducePlan plan = first;
  std::int64_t stride = 1;
  for (int d = plan.kept.rank - 1; d >= 0; --d) {  // output j's partials start at j
    plan.kept.strides[0][d] = stride;
    stride *= plan.kept.sizes[d];
  }
  plan.reduced = kernels::Layout<1>{};
  plan.reduced.rank = 1;
  plan.reduced.sizes[0] = splits;
  plan.reduced.strides[0][0] = first.outputs;
  plan.reduce_count = plan.chunk = splits;
  plan.partial = false;
  return plan;
}

template <typename T, ReduceOp op>
void reduce_typed(cudaStream_t stream, Workspace& workspace, int multiprocessors, ReducePlan plan, const T* in, T* out) {
  using Acc = compute_t<T>;
  const int group = group_size(plan);
  std::int64_t splits = split_count(plan, group, multiprocessors);
  plan.chunk = ceil_div(plan.reduce_count, splits);
  splits = ceil_div(plan.reduce_count, plan.chunk);
  if (splits == 1) {
    launch<T, Acc, T, op>(stream, group, plan, 1, in, out);
    return;
  }
  auto* partials = static_cast<Acc*>(workspace.get(static_cast<std::size_t>(splits * plan.outputs) * sizeof(Acc)));
  plan.partial = true;
  launch<T, Acc, Acc, op>(stream, group, plan, splits, in, partials);
  const ReducePlan second = combine_partials_plan(plan, splits);
  launch<Acc, Acc, T, op>(stream, plan.outputs >= 2048 ? 1 : 32, second, 1, partials, out);
}

// Term i of output o: the input element at row-major index i over the reduced dimensions.
template <typename T>
struct ReduceTerms {
  ReducePlan plan;
  const T* in;
  T* out;
  __device__ compute_t<T> operator()(std::int64_t o, std::int64_t i) const {
    const std::int64_t base = detail::offsets_of(plan.kept, o).at[0];
    const std::int64_t at = plan.reduced.rank == 1 ? i * plan.reduced.strides[0][0] : detail::offsets_of(plan.reduced, i).at[0];
    return convert_to<compute_t<T>>(in[base + at]);
  }
  __device__ void finish(std::int64_t o, compute_t<T> sum) const { out[detail::offsets_of(plan.kept, o).at[1]] = convert_to<T>(sum); }
};

double identity_value(ReduceOp op, DType dtype) {
  const bool integer = dtype == DType::i32;
  switch (op) {
    case ReduceOp::sum: return 0.0;
    case ReduceOp::max: return integer ? std::numeric_limits<std::int32_t>::lowest() : -INFINITY;
    case ReduceOp::min: return integer ? std::numeric_limits<std::int32_t>::max() : INFINITY;
  }
  return 0.0;
}

}  // namespace

void reduce(cudaStream_t stream, Workspace& workspace, int multiprocessors, ReduceOp op, DType dtype, const void* in, void* out,
            std::int64_t out_count, const kernels::Layout<2>& layout, const SumTree& tree) {
  const kernels::Layout<2> l = kernels::coalesce(layout);
  const ReducePlan plan = split_dimensions(l);
  if (detail::element_count(l) == 0 || plan.outputs < out_count) fill(stream, dtype, out, out_count, identity_value(op, dtype));
  if (detail::element_count(l) == 0) return;
  if (op == ReduceOp::sum && tree.on && dtype != DType::i32) {
    detail::with_floating_dtype(dtype, "reduce", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const ReduceTerms<T> terms{plan, static_cast<const T*>(in), static_cast<T*>(out)};
      detail::tree_sums<compute_t<T>>(stream, workspace, terms, plan.outputs, plan.reduce_count, tree, "reduce");
    });
    return;
  }
  detail::with_dtype(dtype, "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* pi = static_cast<const T*>(in);
    auto* po = static_cast<T*>(out);
    switch (op) {
      case ReduceOp::sum: return reduce_typed<T, ReduceOp::sum>(stream, workspace, multiprocessors, plan, pi, po);
      case ReduceOp::max: return reduce_typed<T, ReduceOp::max>(stream, workspace, multiprocessors, plan, pi, po);
      case ReduceOp::min: return reduce_typed<T, ReduceOp::min>(stream, workspace, multiprocessors, plan, pi, po);
    }
  });
}

}  // namespace nax::cuda
