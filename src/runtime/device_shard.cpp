#include "runtime/device_shard.h"

#include <fmt/format.h>

namespace nax::detail {

DeviceShard::Block DeviceShard::block_of(const Shape& global, const AxisRules& rules, std::string_view op) {
  rules.check(mesh_, global, op);
  rules_use().note(rules, global);
  Block b;
  std::vector<Axis> axes = global.axes();
  b.offsets.assign(axes.size(), 0);
  for (std::size_t i = 0; i < axes.size(); ++i) {
    const auto& mesh_axes = rules.mesh_axes(axes[i].name);
    if (mesh_axes.empty()) continue;
    const std::int64_t parts = mesh_.group_size(mesh_axes);
    axes[i].size /= parts;
    b.offsets[i] = axes[i].size * mesh_.rank_in_group(device_, mesh_axes);
    for (const auto& m : mesh_axes) b.vary.set_split(m, axes[i].name);
  }
  b.local = Shape(axes);
  return b;
}

Communicator& DeviceShard::comm(const Names& mesh_axes) {
  auto it = comms_.find(mesh_axes.list());
  if (it != comms_.end()) return *it->second;
  mesh_.check_axes(mesh_axes.list(), "comm");
  auto comm = make_comm_(mesh_axes.list());  // may fail (MPI: a member never came): then nothing is cached
  return *(comms_[mesh_axes.list()] = std::move(comm));
}

std::map<std::string, CommStats> DeviceShard::comm_stats() const {
  std::map<std::string, CommStats> out;
  for (const auto& [axes, c] : comms_) out[fmt::format("{}", fmt::join(axes, ","))] = c->stats();
  return out;
}

CommStats DeviceShard::comm_totals() const {
  CommStats total;
  for (const auto& [axes, c] : comms_) total += c->stats();
  return total;
}

}  // namespace nax::detail
