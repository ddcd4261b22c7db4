#pragma once
// `gptj compare`: the hand-coded (per-shard) GPT-J against the same model in the global view with
// automatic sharding, on the same config, mesh, data and steps, their steps interleaved so that
// both see the same machine; optionally JAX's jit/NamedSharding baseline on the same run.
#include <map>
#include <string>
#include <vector>

#include "data.h"
#include "replay.h"
#include "train.h"

namespace gptj {

struct CompareOptions {
  TrainOptions train;             // config, mesh, data, steps, batch, seq, lr, seed, ...
  std::int64_t timing_skip = 2;   // first steps left out of the tokens/s median (warm-up)
  std::string json;               // write the rows there
  std::string cost_model;         // a cost-model JSON file for sharding propagation (nax/global/cost_model.h)
  bool with_jax = false;          // also run bench/jax_baseline.py (scripts/jax_baseline.sh)
  bool install_jax = false;       // let the script install JAX from PyPI when missing
  double projected_mfu = 0.4;     // compute efficiency assumed for the cluster projections
  // The mesh-comparison locator instead (compare_meshes): two meshes as DPxMP, e.g. {"1x1", "2x2"}.
  std::vector<std::string> meshes;
};

// One row of the comparison.
struct CompareRow {
  std::string sharding;  // hand, auto or jax
  double tokens_per_s = 0;
  double bytes_per_step = 0;                       // sent by one device in one step, all mesh axes
  std::map<std::string, double> bytes_by_axes;     // per group of mesh axes ("mp", "dp", "dp,mp")
  double collectives_per_step = 0;
  std::map<std::string, nax::CommStats> comm_per_step;  // calls and bytes per kind, per group
  std::size_t peak_bytes = 0;
  double first_loss = 0, final_loss = 0;
  std::vector<double> losses;
  bool measured_comm = true;  // false for jax (XLA's collectives are not counted)
  // With a pp axis: the schedule's bubble (share of stage-ticks idle) and device 0's measured idle
  // share of the schedule's time (median over the timed steps).
  double bubble = 0, pipeline_idle = 0;
  // The last step, traced: every device's timeline (replay.h), its measured time (the slowest
  // device's step) and its replay with this machine's compute and the links fitted to its own
  // collectives (how far the replay is from the run). Empty where the trace could not see every
  // device (under mpirun) and for jax.
  std::vector<Timeline> timelines;
  Links fitted_links;  // by group of mesh axes
  double traced_step_s = 0, replayed_step_s = 0;
};

// A declared cluster: devices, the mesh it would run (every axis but dp as in the run, the rest dp)
// and the link of each mesh axis.
struct Cluster {
  std::string name;
  int devices = 8;
  double peak_flops = kGpuPeakBf16Flops;  // per device
  std::map<std::string, nax::Link> links;  // by mesh axis
};
std::vector<Cluster> declared_clusters();

struct Projection {
  std::string cluster, sharding;
  double compute_s = 0, comm_s = 0, step_s = 0, tokens_per_s = 0;
  // The traced step replayed on the cluster (its compute scaled to compute_s, its collectives priced
  // on the cluster's links): what overlapped in the run overlaps here. 0 without timelines.
  double replayed_step_s = 0, replayed_tokens_per_s = 0;
};
// Step time on `cluster` under weak scaling (each device keeps its share of the run's batch): the
// model FLOPs at `mfu` of the cluster's peak (stretched by a pipeline's bubble), plus the counted
// collectives priced by the alpha-beta model on the cluster's links (no overlap assumed); and the
// replay of the row's traced step on the cluster, which counts the overlap.
Projection project(const CompareRow& row, const Cluster& cluster, const CompareOptions& options);

std::vector<CompareRow> compare(const CompareOptions& options, const TextData& data);

// --meshes "1x1,2x2" as its two meshes, checked.
std::vector<std::string> split_meshes(const std::string& list);
// The same train.steps (hand sharding) on options.meshes, every op recorded on every device, then
// the first op whose global value differs between them printed (nax/debug/locator.h): 1 when one
// does, else 0 ("no difference in N ops over K step(s)").
int compare_meshes(const CompareOptions& options, const TextData& data);
void print_comparison(const std::vector<CompareRow>& rows, const CompareOptions& options);
void write_comparison_json(const std::vector<CompareRow>& rows, const CompareOptions& options, const std::string& path);

}  // namespace gptj
