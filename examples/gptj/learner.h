#pragma once
// One model in training on this device: its parameters, its AdamW state, the loss of the chosen
// sharding (hand: the per-shard model; auto: the global view) and one optimizer step. Shared by
// `gptj train` and `gptj compare`.
#include <nax/nax.h>

#include "global_model.h"
#include "model.h"
#include "train.h"

namespace gptj {

// A --dtype value: bf16 or f32 (the compute dtypes training supports); anything else is refused.
nax::DType parse_compute_dtype(const std::string& name);

class Learner {
 public:
  // `options` have passed check_options (made on every device, they are checked once, before).
  Learner(nax::Shard& s, const Config& config, const nax::AxisRules& rules, const TrainOptions& options);
  Learner(const Learner&) = delete;  // the global view reads model_'s parameters in place
  Learner& operator=(const Learner&) = delete;

  nax::Tensor loss(const nax::Tensor& ids, const nax::Tensor& targets) const;

  struct StepStats {
    double loss = 0;           // the one host read of a step
    nax::Tensor grad_norm;     // before clipping, on the device: read it only to log it
    double forward_s = 0, backward_s = 0, optimizer_s = 0;  // with TrainOptions::time_phases
    // With a pp axis: this device's time in its stage's forwards and pullbacks, and in the schedule
    // (their ratio is what the bubble leaves; ops on a GPU run ahead of the host, so CPU only).
    double pipeline_busy_s = 0, pipeline_s = 0;
  };
  // Gradients over options.micro_batches micro-batches (with a pp axis: through the pipeline's
  // stages by options.schedule) of this device's block of the batch, clipped
  // by global norm, then an AdamW step at learning rate `lr`.
  StepStats step(const nax::Tensor& ids, const nax::Tensor& targets, double lr);

  // What step() computes before the optimizer: this device's parameters' gradients (with pp, its
  // stage's), averaged over the micro-batches, and the mean loss (f64, on every device).
  struct Gradients {
    std::vector<nax::Tensor> grads;
    nax::Tensor loss;
  };
  Gradients gradients(const nax::Tensor& ids, const nax::Tensor& targets, StepStats& stats);

  // With a pp axis: the pipeline's schedule (its timetable) for a step's micro-batches.
  const Timetable& schedule() const { return timetable_; }

  Model& model() { return model_; }
  const std::string& sharding() const { return options_.sharding; }
  nax::nn::AdamW& optimizer() { return optimizer_; }

 private:
  nax::Shard& shard_;
  const TrainOptions& options_;
  Model model_;
  GlobalModel global_;
  nax::nn::AdamW optimizer_;
  Timetable timetable_, eval_timetable_;  // a step's; an evaluation's (one micro-batch, forwards only)

  bool pipelined() const;
  StageProgram stage_program(const nax::Tensor& ids, const nax::Tensor& targets, std::int64_t micro) const;
  Gradients pipeline_gradients(const nax::Tensor& ids, const nax::Tensor& targets, StepStats& stats);
};

}  // namespace gptj
