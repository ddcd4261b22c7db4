#pragma once
// The Shard every runtime hands to per-shard code: backend-independent, with communicators made
// by the backend's factory on first use.
#include <functional>
#include <map>
#include <memory>

#include "nax/runtime/runtime.h"

namespace nax::detail {

using CommFactory = std::function<std::unique_ptr<Communicator>(const std::vector<std::string>& mesh_axes)>;

class DeviceShard final : public Shard {
 public:
  DeviceShard(int device, const Mesh& mesh, std::shared_ptr<Device> dev, CommFactory make_comm)
      : device_(device), mesh_(mesh), dev_(std::move(dev)), make_comm_(std::move(make_comm)) {}

  int device() const override { return device_; }
  const Mesh& mesh() const override { return mesh_; }
  Tensor shard(const Tensor& global, const AxisRules& rules) override;
  // Devices cutting one host tensor must all pass the same one (a hash compared over the cuts).
  void check_same_tensor(const Tensor& global, const VaryType& cuts);
  Tensor gather(const Tensor& t) override;
  void check_returned(const Tensor& value) override;
  Tensor random_normal(const Shape& global, const AxisRules& rules, std::uint64_t seed, std::string_view name,
                       double stddev, DType dtype) override;
  Tensor random_uniform(const Shape& global, const AxisRules& rules, std::uint64_t seed, std::string_view name,
                        double low, double high, DType dtype) override;
  Tensor full(const Shape& global, const AxisRules& rules, double value, DType dtype) override;
  Communicator& comm(const Names& mesh_axes) override;
  AllocatorStats memory() const override { return dev_->allocator().stats(); }
  const std::shared_ptr<Device>& device_ptr() const override { return dev_; }
  // The options of the runtime running this shard, resolved (with_environment).
  void set_options(const RuntimeOptions& options) { options_ = options; }
  bool deterministic() const override { return options_.deterministic; }
  std::int64_t deterministic_max_cut() const override { return options_.deterministic_max_cut; }
  bool check_values() const override { return options_.check_values.value_or(false); }
  bool sharding_log() const override { return options_.sharding_log.value_or(false); }
  bool strict_axis_rules() const { return options_.strict_axis_rules; }

  std::map<std::string, CommStats> comm_stats() const override;
  CommStats comm_totals() const;

 private:
  struct Block {
    Shape local;
    std::vector<std::int64_t> offsets;
    VaryType vary;
  };
  Block block_of(const Shape& global, const AxisRules& rules, std::string_view op);

  int device_;
  const Mesh& mesh_;
  std::shared_ptr<Device> dev_;
  CommFactory make_comm_;
  RuntimeOptions options_;
  std::map<std::vector<std::string>, std::unique_ptr<Communicator>> comms_;
};

}  // namespace nax::detail
