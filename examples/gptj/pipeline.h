#pragma once
// Pipeline parallelism over the mesh's pp axis: the layers cut into consecutive stages, one per pp
// coordinate (stage 0 also holds the embedding, the last stage the final LayerNorm, the head and
// the loss), and the schedules that run micro-batches through them: each stage's forward is a vjp,
// its activation goes on with a ppermute, and its pullback runs when the next stage's cotangent
// comes back (docs/parallelism.md, Pipeline).
#include <nax/nax.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config.h"

namespace gptj {

struct Stage {
  int index = 0, count = 1;
  std::int64_t first_layer = 0, end_layer = 0;  // the stage's layers: [first_layer, end_layer)
  bool first() const { return index == 0; }
  bool last() const { return index == count - 1; }
};

// Stage `index` of `count` of config c's layers: consecutive runs, the first n_layers % count
// stages one layer longer. A mesh without pp has one stage of every layer.
Stage stage_of(const Config& c, int index, int count);
Stage device_stage(const Config& c, const nax::Mesh& mesh, const nax::Shard& s);

// The parameter specs stage `stage` holds (a subsequence of parameter_specs, in its order).
std::vector<nax::nn::ParamSpec> stage_specs(const Config& c, const Stage& stage);
// The index of the stage holding parameter `name` when the layers are cut into `count` stages.
int stage_holding(const Config& c, int count, const std::string& name);

enum class Schedule { one_f_one_b, gpipe };
// --schedule: 1f1b or gpipe.
Schedule parse_schedule(const std::string& name);
const char* schedule_name(Schedule s);

// What a stage runs in one tick of a schedule: micro-batch m's forward or backward, or nothing (the
// bubble). After every tick the stages pass their activations on and their cotangents back.
struct Action {
  enum Kind { idle, forward, backward } kind = idle;
  std::int64_t micro = -1;
};
using Timetable = std::vector<std::vector<Action>>;  // [tick][stage]

// The ticks of `schedule` with `micro` micro-batches over `stages` stages, each stage running its
// next action as soon as its input has arrived. 1F1B: stage s runs stages - 1 - s forwards ahead,
// then one backward per forward, so at most stages - s micro-batches wait for their backward;
// GPipe: every forward, then every backward (all micro-batches wait).
Timetable timetable(Schedule schedule, int stages, std::int64_t micro);
// The fraction of stage-ticks spent idle: (stages - 1) / (micro + stages - 1) for both schedules.
double bubble_fraction(const Timetable& t);
// The most micro-batches stage `stage` holds between their forward and backward, and the most any holds.
std::int64_t in_flight_on(const Timetable& t, int stage);
std::int64_t most_in_flight(const Timetable& t);

// What a pipeline step runs on this device, given by the model: its stage's forward from the
// previous stage's activation (undefined on stage 0) to the next stage's activation or, on the
// last stage, the micro-batch's loss, reading the parameters it is given (vjp's fresh leaves).
struct StageProgram {
  Stage stage;
  std::function<nax::Tensor(const std::vector<nax::Tensor>& params, const nax::Tensor& input, std::int64_t micro)> forward;
  // Zeros shaped as the activation a stage passes on (what a stage with nothing to send passes to
  // the ppermute).
  std::function<nax::Tensor()> activation_like;
};

struct PipelineStep {
  std::vector<nax::Tensor> grads;  // this stage's parameter gradients, averaged over the micro-batches
  nax::Tensor loss_sum;            // the micro-batches' losses added, f64 (every device)
  double busy_s = 0, total_s = 0;  // this device's time in its forwards and pullbacks, and in the whole schedule
};
// Collective over pp: runs the timetable; with backward, every micro-batch's pullback (without:
// the forwards alone, for evaluation).
PipelineStep run_pipeline(const Timetable& t, const StageProgram& program, const std::vector<nax::Tensor>& params, bool backward);

}  // namespace gptj
