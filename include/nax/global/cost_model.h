#pragma once
// The alpha-beta ring model that prices collectives (docs/architecture.md, Global view): a collective over n devices on
// a link of latency alpha and bandwidth beta takes (ring steps) * alpha + (bytes on the wire per
// device) / beta. Sharding propagation uses it to pick the cheapest strategy; `gptj compare` uses it
// to project counted communication onto declared clusters.
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "nax/comm/communicator.h"

namespace nax::io {
class JsonValue;
}

namespace nax {

struct Link {
  std::string name;
  double latency_s = 0;      // alpha, per ring step
  double bandwidth_Bps = 1;  // beta, bytes per second one device sends (bus bandwidth)
};

class CostModel {
 public:
  // Defaults: every mesh axis inside a node ("intra": 5 us, 150 GB/s, NVLink-class); "inter"
  // (15 us, 45 GB/s, 400 Gb/s InfiniBand-class) is there to be assigned to mesh axes.
  CostModel();
  // A small JSON config: {"links": {"nvlink": {"latency_us": 3, "bandwidth_GBps": 300}, ...},
  // "mesh_axes": {"mp": "nvlink", "dp": "ib"}, "default": "nvlink", "memory_GBps": 20}. Links named
  // here add to (or replace) the defaults; "default" is the link of mesh axes not listed. Read by
  // nax's bounded JSON reader (nax/io/json.h); errors name `source` and the field.
  static CostModel parse(std::string_view json, const std::string& source = "<cost model>");
  // The same from a file (at most 1 MiB).
  static CostModel from_file(const std::string& path);

  void set_link(const std::string& name, Link link);
  void assign(const std::string& mesh_axis, const std::string& link_name);
  const Link& link_of(const std::string& mesh_axis) const;

  // Seconds for one collective of `kind` over `n` devices along `mesh_axis`. `bytes` is the payload
  // as the communicators count it: the buffer reduced (all_reduce), each device's block
  // (all_gather), the whole input (reduce_scatter, all_to_all), the message (permute, broadcast).
  double seconds(CollectiveKind kind, std::size_t bytes, int n, const std::string& mesh_axis) const;
  static double seconds(CollectiveKind kind, std::size_t bytes, int n, const Link& link);
  // Seconds to copy `bytes` within a device (a local slice).
  double copy_seconds(std::size_t bytes) const { return static_cast<double>(bytes) / memory_Bps_; }

  std::string str() const;

 private:
  static CostModel from_json(const io::JsonValue& root);

  std::map<std::string, Link> links_;
  std::map<std::string, std::string> mesh_axes_;
  std::string default_link_ = "intra";
  double memory_Bps_ = 20e9;
};

// The model sharding propagation uses (process-wide; a snapshot, safe to keep while another is
// set). Setting it forgets cached strategy choices.
std::shared_ptr<const CostModel> cost_model();
void set_cost_model(CostModel model);

}  // namespace nax
