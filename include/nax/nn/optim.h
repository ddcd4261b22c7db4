#pragma once
// Training utilities: AdamW with decoupled weight decay, global-norm clipping over a mesh,
// warmup + cosine learning-rate schedule, gradient accumulation.
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nax/nn/parameters.h"

namespace nax::nn {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // decoupled, on parameters of rank >= 2 only (not biases or norms)
  // ZeRO-1: the mesh axis (e.g. "dp") over which the parameters are replicated and the moments
  // cut. Each device keeps the moments of 1/n of the parameters' elements (laid end to end), updates
  // those elements and all-gathers the updated parameters over the axis: the same step, 2/n of the
  // state. Empty: every device keeps every moment. A name the mesh lacks is an error at the first
  // step (or load_state).
  std::string shard_state_over;
};

namespace detail {
class ZeroLayout;
}

class AdamW {
 public:
  AdamW() : AdamW(AdamWConfig{}) {}
  // A template only so that `AdamW opt({})` compiles: an empty list would convert as well to an
  // AdamWConfig as to an AdamW for the move constructor, and the tie goes to the non-template.
  template <std::same_as<AdamWConfig> Config = AdamWConfig>
  explicit AdamW(Config config) : config_(std::move(config)) {}
  // One step: returns the new parameter values (same shapes, dtypes and vary types). Each gradient
  // must have its parameter's shape and vary type: a gradient that differs per device where its
  // parameter is replicated would update each device's copy differently (psum or pmean it over
  // that mesh axis first; grad() of an Invariant loss does). The state cut over
  // shard_state_over needs that mesh axis on the shard's mesh. The Parameters form names them.
  std::vector<Tensor> step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, double lr);
  std::vector<Tensor> step(const Parameters& params, const std::vector<Tensor>& grads, double lr);
  // The same step, each parameter replaced in `params` as soon as its update is made and its
  // gradient let go (`grads` is consumed): the old and new values of one parameter at a time
  // instead of all of them. With shard_state_over, as step() (the updates are gathered together).
  // `grad_scale` (a scalar on the device, e.g. clip_scale's; undefined: 1) multiplies each gradient
  // just before its update, so that no scaled copy of every gradient is made (gradients that share
  // a storage, as a summed bucket's do, free it only once all are let go).
  void update(Parameters& params, std::vector<Tensor> grads, double lr, const Tensor& grad_scale = {});
  std::int64_t steps() const { return steps_; }
  // Moment estimates, in parameter order: first moments, then second moments, each shaped and cut
  // as its parameter whether or not the state is sharded (checkpoints do not depend on it). With
  // shard_state_over, state() all-gathers over that axis (call it on every device) and
  // load_state keeps this device's part.
  std::vector<Tensor> state() const;
  void load_state(std::vector<Tensor> state, std::int64_t steps);
  // Bytes of moment estimates this device holds.
  std::size_t state_bytes() const;

 private:
  std::vector<Tensor> named_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, double lr,
                                 const std::function<std::string(std::size_t)>& name_of);  // named only in errors
  std::vector<Tensor> sharded_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, double lr,
                                   const Tensor& grad_scale = {});
  void check_gradients(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                       const std::function<std::string(std::size_t)>& name_of) const;  // shapes and vary types
  // The unsharded step, one parameter at a time: `deliver(i, new value)` takes each as it is made,
  // and each gradient goes once used.
  void step_each(const std::vector<Tensor>& params, std::vector<Tensor> grads, double lr,
                 const std::function<void(std::size_t, Tensor)>& deliver, const Tensor& grad_scale = {});

  AdamWConfig config_;
  std::int64_t steps_ = 0;
  std::vector<Tensor> m_, v_;  // per parameter; with shard_state_over, per segment of zero_
  std::shared_ptr<const detail::ZeroLayout> zero_;
};

// The global L2 norm of `grads`: each gradient's squares are summed over the mesh axes its value
// is cut over (and nowhere else), then over the gradients. Invariant on every device.
Tensor global_norm(const std::vector<Tensor>& grads);
// The global norm of a model cut into stages over mesh axis `stage_axis` (a pipeline): each device
// passes its own stage's gradients (Varying over the axis), the stages in model order along it.
// Deterministic mode adds every stage's squares in the model's order, as one device holding all of
// them adds them, so the norm has one device's bits.
Tensor global_norm(const std::vector<Tensor>& grads, const std::string& stage_axis);

// Scales grads so that their global norm is at most max_norm; returns the norm before clipping.
double clip_by_global_norm(std::vector<Tensor>& grads, double max_norm);
// The same scaling with no host read: the scale min(1, max_norm / (norm + 1e-6)) (1 exactly when
// norm <= max_norm) is computed on the device; the norm comes back as a tensor, to read (a host
// synchronisation) only when it is logged.
Tensor clip_by_global_norm_on_device(std::vector<Tensor>& grads, double max_norm);
// The same scaling by a norm computed before (e.g. global_norm over pipeline stages).
void clip_to_norm_on_device(std::vector<Tensor>& grads, const Tensor& norm, double max_norm);
// The factor that scaling applies, on the device: max_norm / (norm + 1e-6) where norm > max_norm,
// else exactly 1 (for AdamW::update's grad_scale).
Tensor clip_scale(const Tensor& norm, double max_norm);

// Linear warmup from 0 to peak over warmup_steps, then cosine decay to peak * final_ratio at
// total_steps (and flat after).
double warmup_cosine(std::int64_t step, std::int64_t warmup_steps, std::int64_t total_steps, double peak,
                     double final_ratio = 0.1);

// Sums gradients over micro-batches; mean() divides by their count (one: the gradients as added, not copied).
class GradAccumulator {
 public:
  void add(const std::vector<Tensor>& grads);
  std::vector<Tensor> mean() const;
  int count() const { return count_; }
  void clear();

 private:
  std::vector<Tensor> sum_;
  int count_ = 0;
};

}  // namespace nax::nn
