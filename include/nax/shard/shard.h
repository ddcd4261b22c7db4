#pragma once
// What per-shard code sees of its device: its coordinates on the mesh, its communicators, the
// bridge between global host tensors and its blocks, and the shard the calling thread runs. The op
// layer works through this interface; the runtime (nax/runtime/runtime.h) implements it.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "nax/comm/communicator.h"
#include "nax/core/allocator.h"
#include "nax/core/axis_rules.h"
#include "nax/core/mesh.h"
#include "nax/core/names.h"
#include "nax/kernels/sum_tree.h"
#include "nax/tensor/tensor.h"

namespace nax {

// This device's view of the program: its coordinates, its communicators, and the bridge between
// global host tensors and per-device blocks.
class Shard {
 public:
  virtual ~Shard() = default;
  virtual int device() const = 0;
  virtual const Mesh& mesh() const = 0;
  int coord(const std::string& mesh_axis) const { return mesh().coord(device(), mesh_axis); }

  // This device's block of a global (host) tensor: axes named in `rules` are cut over their mesh
  // axes (vary type Split), the rest are whole (Invariant).
  virtual Tensor shard(const Tensor& global, const AxisRules& rules) = 0;
  // The global tensor rebuilt on the host from every device's block. Refuses a value that is
  // Varying over any mesh axis (reduce it first). Every device must call it.
  virtual Tensor gather(const Tensor& t) = 0;

  // This device's block of the global random tensor random_*(global, seed, name, ...).
  virtual Tensor random_normal(const Shape& global, const AxisRules& rules, std::uint64_t seed,
                               std::string_view name, double stddev = 1,
                               DType dtype = DType::f32) = 0;
  virtual Tensor random_uniform(const Shape& global, const AxisRules& rules, std::uint64_t seed,
                                std::string_view name, double low = 0, double high = 1,
                                DType dtype = DType::f32) = 0;

  // This device's block of a constant global tensor.
  virtual Tensor full(const Shape& global, const AxisRules& rules, double value, DType dtype = DType::f32) = 0;

  // The communicator over `mesh_axes` (ranked row-major over them in the order given), built on
  // first use and cached.
  virtual Communicator& comm(const Names& mesh_axes) = 0;
  virtual AllocatorStats memory() const = 0;
  // Calls and bytes sent by this device per collective kind, for each group of mesh axes it has
  // communicated over (keyed "mp", "dp,mp", ...).
  virtual std::map<std::string, CommStats> comm_stats() const = 0;
  // What this device has communicated since `before` (an earlier comm_stats()), per group.
  std::map<std::string, CommStats> comm_stats_since(const std::map<std::string, CommStats>& before) const;
  virtual const std::shared_ptr<Device>& device_ptr() const = 0;
  // Waits until every op enqueued on this device has finished (a GPU's stream; on the CPU every
  // op has finished when it returns). Reading values (item, to_vector, gather) waits by itself.
  void synchronize() const;

  // Checking mode (NAX_CHECK=1, nax/ops/vary_checks.h): a value that run returns, typed Invariant over
  // some mesh axes, is compared across their devices. Nothing otherwise.
  virtual void check_returned(const Tensor& value) = 0;
  // RuntimeOptions::deterministic, deterministic_max_cut, check_values and sharding_log of the
  // runtime running this shard.
  virtual bool deterministic() const { return false; }
  virtual std::int64_t deterministic_max_cut() const { return SumTree::kMaxCut; }
  virtual bool check_values() const { return false; }
  virtual bool sharding_log() const { return false; }

  // The shard the calling thread is running, or nullptr outside Runtime::run.
  static Shard* current();

  // The axis rules this run applied and the axes they met (the runtime checks them when the run ends).
  RulesUse& rules_use() { return rules_use_; }

  // An error found where it cannot be thrown (a destructor: a started collective never waited
  // for): the runtime raises it when the program returns. take_deferred_error() hands it over.
  void defer_error(std::string message);
  std::string take_deferred_error();

 private:
  std::string deferred_error_;
  RulesUse rules_use_;
};

}  // namespace nax
