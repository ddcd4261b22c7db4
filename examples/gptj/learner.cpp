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
      model_(config, nn::Parameters::init(s, parameter_specs(config), rules, options.seed), options.dtype),
      global_(config, model_.params(), options.dtype),
      optimizer_({.weight_decay = options.weight_decay, .shard_state_over = options.zero ? "dp" : ""}) {
  model_.set_remat(options.remat);
  model_.set_sequence_parallel(options.sequence_parallel);
}

Tensor Learner::loss(const Tensor& ids, const Tensor& targets) const {
  return options_.sharding == "auto" ? global_.loss(ids, targets) : model_.loss(ids, targets);
}

Learner::StepStats Learner::step(const Tensor& ids, const Tensor& targets, double lr) {
  const std::int64_t micro = options_.micro_batches;
  nn::GradAccumulator acc;
  StepStats stats;
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
    acc.add(grad(l, model_.params().values()));
    phase(stats.backward_s);
    const Tensor wide = cast(stop_gradient(l), DType::f64);
    loss_sum = loss_sum.defined() ? loss_sum + wide : wide;
  }
  const trace::Span optimizer_span("phase", "optimizer");
  auto grads = acc.mean();
  stats.grad_norm = nn::clip_by_global_norm_on_device(grads, options_.clip);
  model_.params().assign(optimizer_.step(model_.params(), grads, lr));
  phase(stats.optimizer_s);
  stats.loss = loss_sum.item() / static_cast<double>(micro);
  return stats;
}

}  // namespace gptj
