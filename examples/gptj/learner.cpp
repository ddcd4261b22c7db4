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

void check_sharding(const std::string& sharding) {
  if (sharding != "hand" && sharding != "auto") fail("train", "--sharding expects hand or auto, got '{}'", sharding);
}

DType parse_compute_dtype(const std::string& name) {
  if (name == "bf16") return DType::bf16;
  if (name == "f32") return DType::f32;
  fail("train", "--dtype expects bf16 or f32, got '{}'", name);
}

void check_compute_dtype(DType dtype) {
  if (dtype != DType::bf16 && dtype != DType::f32) fail("train", "--dtype expects bf16 or f32, got '{}'", dtype_name(dtype));
}

// The parameters are f32 whatever the compute dtype: they are the master weights the optimizer updates.
Learner::Learner(Shard& s, const Config& config, const AxisRules& rules, const TrainOptions& options)
    : options_(options),
      model_(config, nn::Parameters::init(s, parameter_specs(config), rules, options.seed), options.dtype),
      global_(config, model_.params(), options.dtype),
      optimizer_({.weight_decay = options.weight_decay}) {
  check_sharding(options.sharding);
  check_compute_dtype(options.dtype);
}

Tensor Learner::loss(const Tensor& ids, const Tensor& targets) const {
  return options_.sharding == "auto" ? global_.loss(ids, targets) : model_.loss(ids, targets);
}

Learner::StepStats Learner::step(const Tensor& ids, const Tensor& targets, double lr) {
  const std::int64_t micro = options_.micro_batches;
  nn::GradAccumulator acc;
  StepStats stats;
  for (std::int64_t m = 0; m < micro; ++m) {
    Tensor l;
    {
      const trace::Span phase("phase", "forward");
      l = loss(micro_batch(ids, m, micro), micro_batch(targets, m, micro));
    }
    const trace::Span phase("phase", "backward");
    acc.add(grad(l, model_.params().values()));
    stats.loss += l.item() / static_cast<double>(micro);
  }
  const trace::Span phase("phase", "optimizer");
  auto grads = acc.mean();
  stats.grad_norm = nn::clip_by_global_norm(grads, options_.clip);
  model_.params().assign(optimizer_.step(model_.params().values(), grads, lr));
  return stats;
}

}  // namespace gptj
