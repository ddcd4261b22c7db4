// The members of DeviceShard that make tensors (shard, gather, the sharded random and constant
// initialisers) with the op layer below: transfers, all_gather_invariant, random blocks.

#include "nax/ops/collectives.h"
#include "nax/kernels/kernels.h"
#include "nax/ops/vary_checks.h"
#include "ops/internal.h"
#include "runtime/device_shard.h"

namespace nax::detail {

Tensor DeviceShard::shard(const Tensor& global, const AxisRules& rules) {
  if (!global.defined()) fail("shard", "the global tensor is undefined");
  if (!global.device().is_host() && &global.device() != dev_.get())
    fail("shard", "expects a host tensor or one of this device's, got {} on {}", global.str(), global.device().str());
  if (!global.vary().invariant())
    fail("shard", "expects a global value, got the per-device value {} (gather it first)", global.str());
  Block b = block_of(global.shape(), rules, "shard");
  if (!global.device().host_accessible()) return shard(transfer(global, Device::host()), rules);
  check_same_tensor(global, b.vary);
  Tensor out = make_result(b.local, global.dtype(), b.vary, Device::host());
  const kernels::Layout<2> layout = layout_over(b.local.axes(), global.shape(), b.local);
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < b.offsets.size(); ++i) offset += b.offsets[i] * layout.strides[0][i];
  const std::size_t es = dtype_size(global.dtype());
  kernels::cpu_kernels_ptr()->copy(es, static_cast<const char*>(global.raw()) + static_cast<std::size_t>(offset) * es,
                                   out.raw_mutable(), layout);
  return transfer(out, dev_);
}

void DeviceShard::check_same_tensor(const Tensor& global, const VaryType& cuts) {
  std::vector<std::string> cutting;
  for (const auto& e : cuts.entries()) cutting.push_back(e.mesh_axis);
  if (cutting.empty() || mesh_.group_size(cutting) == 1) return;
  const double h48 = content_hash48(global);
  // The largest and the smallest hash over the cutting axes agree only when all do.
  Tensor mine = transfer(from_vector(Shape{{"h", 2}}, std::vector<double>{h48, -h48}, DType::f64), dev_);
  const auto extremes = pmax(pvary(mine, cutting), cutting).to_vector<double>();
  if (extremes[0] != h48 || extremes[1] != -h48)
    fail("shard", "the devices of mesh axes ({}) passed different host tensors {} to cut along them (their contents differ): "
         "every device must pass the same global tensor (for per-device data, shard nothing and pvary it)",
         fmt::join(cutting, ", "), global.str());
}

void DeviceShard::check_returned(const Tensor& value) {
  if (value.defined() && checking_enabled()) check_invariant(value, "a value Runtime::run returns");
}

Tensor DeviceShard::gather(const Tensor& t) {
  check_operands("gather", {&t});
  for (const auto& e : t.vary().entries()) {
    if (e.kind == Vary::Partial)
      fail("gather", "{} is {} over mesh axis '{}' (each device holds one term of it): finish it with {} over '{}' first", t.str(),
           e.partial == PartialKind::mean ? "a local mean" : "a partial sum", e.mesh_axis,
           e.partial == PartialKind::mean ? "pmean" : "psum", e.mesh_axis);
    if (e.kind == Vary::Varying)
      fail("gather", "{} is Varying over mesh axis '{}' (per-device values): reduce it with psum/pmean or all_gather_invariant "
           "first", t.str(), e.mesh_axis);
  }
  if (checking_enabled()) check_invariant(t, "gather");
  return transfer(all_gather_cuts(t).with_vary(VaryType{}), Device::host());
}

Tensor DeviceShard::random_normal(const Shape& global, const AxisRules& rules, std::uint64_t seed, std::string_view name,
                                  double stddev, DType dtype) {
  Block b = block_of(global, rules, "random_normal");
  return random_block(global, b.local, b.offsets, seed, name, dtype, true, stddev, 0).with_vary(b.vary);
}

Tensor DeviceShard::random_uniform(const Shape& global, const AxisRules& rules, std::uint64_t seed, std::string_view name,
                                   double low, double high, DType dtype) {
  Block b = block_of(global, rules, "random_uniform");
  return random_block(global, b.local, b.offsets, seed, name, dtype, false, low, high).with_vary(b.vary);
}

Tensor DeviceShard::full(const Shape& global, const AxisRules& rules, double value, DType dtype) {
  Block b = block_of(global, rules, "full");
  Tensor out = make_result(b.local, dtype, b.vary, dev_);
  detail::kernels_of(out).fill(dtype, out.raw_mutable(), out.numel(), value);
  return out;
}

}  // namespace nax::detail
