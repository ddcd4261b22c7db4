#include "learner.h"

namespace gptj {

using namespace nax;

namespace {

// Micro-batch m of this device's block of the batch: the devices' micro-batches m together are one
// global micro-batch, cut over dp like the batch.
Tensor micro_batch(const Tensor& t, std::int64_t m, std::int64_t count) {
  if (count == 1) return t;
  const std::int64_t n = t.size("batch") / count;
  return slice(t, "batch", m * n, (m + 1) * n).with_vary(t.vary());
}

// This device's model: its pipeline stage's parameters (every parameter without pp), initialised as
// on one device. A stage's parameters differ from the other stages', so they are Varying over pp
// (their gradients then stay on the stage: no sum over pp).
Model stage_model(Shard& s, const Config& config, const AxisRules& rules, const TrainOptions& o) {
  const Stage stage = device_stage(config, s.mesh(), s);
  nn::Parameters p = nn::Parameters::init(s, stage_specs(config, stage), rules, o.seed);
  if (stage.count > 1) {
    NoGrad no_grad;
    std::vector<Tensor> values;
    for (const auto& v : p.values()) values.push_back(pvary(v, "pp"));
    p = nn::Parameters::from_values(p.specs(), values);
  }
  return Model(config, std::move(p), o.dtype, stage);
}

}  // namespace

DType parse_compute_dtype(const std::string& name) {
  if (name == "bf16") return DType::bf16;
  if (name == "f32") return DType::f32;
  fail("train", "--dtype expects bf16 or f32, got '{}'", name);
}

// The parameters are f32 whatever the compute dtype: they are the master weights the optimizer updates.
Learner::Learner(Shard& s, const Config& config, const AxisRules& rules, const TrainOptions& options)
    : shard_(s),
      options_(options),
      model_(stage_model(s, config, rules, options)),
      global_(config, model_.params(), options.dtype),
      optimizer_({.weight_decay = options.weight_decay, .shard_state_over = options.zero ? "dp" : ""}),
      timetable_(timetable(parse_schedule(options.schedule), model_.stage().count, options.micro_batches)),
      eval_timetable_(timetable(Schedule::gpipe, model_.stage().count, 1)) {
  model_.set_remat(options.remat);
  model_.set_sequence_parallel(options.sequence_parallel);
  model_.set_overlap_pieces(options.overlap_pieces);
  global_.set_sequence_parallel(options.sequence_parallel);
}

bool Learner::pipelined() const { return model_.stage().count > 1; }

StageProgram Learner::stage_program(const Tensor& ids, const Tensor& targets, std::int64_t micro) const {
  StageProgram p;
  p.stage = model_.stage();
  p.forward = [this, ids, targets, micro](const std::vector<Tensor>& values, const Tensor& input, std::int64_t m) {
    return model_.stage_forward(values, input, micro_batch(ids, m, micro), micro_batch(targets, m, micro));
  };
  p.activation_like = [this, ids, micro] { return model_.stage_activation_zeros(micro_batch(ids, 0, micro)); };
  return p;
}

Tensor Learner::loss(const Tensor& ids, const Tensor& targets) const {
  if (pipelined()) {  // forwards only, one micro-batch after another through the stages
    return run_pipeline(eval_timetable_, stage_program(ids, targets, 1), model_.params().values(), false).loss_sum;
  }
  return options_.sharding == "auto" ? global_.loss(ids, targets) : model_.loss(ids, targets);
}

Learner::Gradients Learner::pipeline_gradients(const Tensor& ids, const Tensor& targets, StepStats& stats) {
  const trace::Span span("phase", "pipeline");
  PipelineStep r = run_pipeline(timetable_, stage_program(ids, targets, options_.micro_batches), model_.params().values(), true);
  stats.pipeline_busy_s = r.busy_s, stats.pipeline_s = r.total_s;
  return {std::move(r.grads), r.loss_sum / static_cast<double>(options_.micro_batches)};
}

Learner::Gradients Learner::gradients(const Tensor& ids, const Tensor& targets, StepStats& stats) {
  if (pipelined()) return pipeline_gradients(ids, targets, stats);
  const std::int64_t micro = options_.micro_batches;
  nn::GradAccumulator acc;
  // Phase times need the device's queue drained at each boundary: only when asked for.
  auto phase = [&, t0 = std::chrono::steady_clock::now()](double& seconds) mutable {
    if (!options_.time_phases) return;
    shard_.synchronize();
    const auto now = std::chrono::steady_clock::now();
    seconds += std::chrono::duration<double>(now - t0).count();
    t0 = now;
  };
  Tensor loss_sum;
  for (std::int64_t m = 0; m < micro; ++m) {
    Tensor l;
    {
      const trace::Span forward_span("phase", "forward");
      l = loss(micro_batch(ids, m, micro), micro_batch(targets, m, micro));
      phase(stats.forward_s);
    }
    const trace::Span backward_span("phase", "backward");
    const auto bucket_bytes = static_cast<std::size_t>(options_.bucket_mb * (1 << 20));
    acc.add(grad(l, model_.params().values(), {.allow_varying_loss = false, .bucket_bytes = bucket_bytes}));
    phase(stats.backward_s);
    const Tensor wide = cast(stop_gradient(l), DType::f64);
    loss_sum = loss_sum.defined() ? loss_sum + wide : wide;
  }
  return {acc.mean(), loss_sum / static_cast<double>(micro)};
}

Learner::StepStats Learner::step(const Tensor& ids, const Tensor& targets, double lr) {
  StepStats stats;
  Gradients g = gradients(ids, targets, stats);
  const trace::Span optimizer_span("phase", "optimizer");
  // Phase times need the device's queue drained at each boundary: only when asked for.
  if (options_.time_phases) shard_.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  // With pp each stage holds its own parameters: the norm adds every stage's squares.
  stats.grad_norm = pipelined() ? nn::global_norm(g.grads, "pp") : nn::global_norm(g.grads);
  // clipped as each is used: one parameter's old and new values, and one scaled gradient, at a time
  optimizer_.update(model_.params(), std::move(g.grads), lr, nn::clip_scale(stats.grad_norm, options_.clip));
  if (options_.time_phases) {
    shard_.synchronize();
    stats.optimizer_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  stats.loss = g.loss.item();
  return stats;
}

}  // namespace gptj
