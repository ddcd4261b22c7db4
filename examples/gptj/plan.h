#pragma once
// `gptj plan`: the bytes one device needs to train a config on a mesh, counted from what the
// trainer keeps (docs/memory.md): f32 parameters (the master weights), their gradients, AdamW's two
// moments (cut over dp with --zero), the activations the backward reads (only each block's input
// with --remat, plus one block's recompute at a time; those cut along seq divided by mp with
// --sequence-parallel), and the peak, the larger of the backward's
// start and the optimizer step. Checked against measured peaks (tests/test_train_memory.cpp,
// bench/memory_plan.sh).
#include <cstdint>
#include <string>
#include <vector>

#include "config.h"

namespace gptj {

struct PlanOptions {
  std::string config = "small";
  std::string mesh = "dp=1,mp=1";
  std::int64_t batch = 8;
  std::int64_t seq = 128;
  bool remat = false;
  bool zero = false;
  bool sequence_parallel = false;
  bool deterministic = false;  // as gptj train --deterministic (f32 only)
  double bucket_mb = 25;  // as gptj train's --bucket-mb
  std::int64_t micro_batches = 1;  // as gptj train's; with pp, what the stages pass along
  std::string schedule = "1f1b";   // with pp, as gptj train's
  nax::DType dtype = nax::DType::f32;  // the compute dtype, as gptj train --dtype
  double device_memory = 141e9;        // bytes (an H200)
};

struct MemoryPlan {
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0;  // bytes per device
  double backward_peak = 0;   // parameters, moments, saved activations, the loss's gradients
  double optimizer_peak = 0;  // parameters, moments, the clipped gradients, one parameter's update
  double peak = 0;
  bool fits = false;
  std::vector<double> stage_peaks;  // with pp: each stage's peak (the fields above are the busiest stage's)
  double bubble = 0;                // with pp: the schedule's idle share of the stage-ticks
};

// The plan of config `c` (vocabulary as trained: padded for the mesh) on `mesh`.
MemoryPlan plan_memory(const Config& c, const nax::Mesh& mesh, const PlanOptions& o);
MemoryPlan plan_memory(const PlanOptions& o);

// "141GB", "80GiB", "512MB", "1e9" (bytes); an error naming --device-memory otherwise.
double parse_bytes(const std::string& text);

// The plan as printed by gptj plan.
std::string format_plan(const PlanOptions& o, const MemoryPlan& p);

}  // namespace gptj
