// AdamW, global-norm clipping, the learning-rate schedule and gradient accumulation.
#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>

#include "nax/kernels/kernels.h"
#include "nax/autodiff/autodiff.h"
#include "nax/ops/collectives.h"
#include "nax/ops/index_ops.h"
#include "nax/nn/optim.h"
#include "nax/ops/ops.h"
#include "nax/runtime/runtime.h"
#include "nn/zero_layout.h"

namespace nax::nn {

namespace {

// One parameter's AdamW step in one pass of the device's fused kernel (f32); m and v are replaced.
Tensor fused_step(const Tensor& p, const Tensor& g_in, Tensor& m, Tensor& v, const kernels::AdamWStep& step) {
  const Tensor g = g_in.shape().names() == p.shape().names() ? g_in : transpose(g_in, p.shape().names());
  Tensor p_out = Tensor::empty(p.shape(), DType::f32, p.device_ptr()).with_vary(p.vary());
  Tensor m_out = Tensor::empty(p.shape(), DType::f32, p.device_ptr()).with_vary(m.vary());
  Tensor v_out = Tensor::empty(p.shape(), DType::f32, p.device_ptr()).with_vary(v.vary());
  p.device().kernels().adamw(p.numel(), p.data<float>(), m.data<float>(), v.data<float>(), g.data<float>(), p_out.mutable_data<float>(),
                             m_out.mutable_data<float>(), v_out.mutable_data<float>(), step);
  m = m_out, v = v_out;
  return p_out;
}

// The same with tensor ops, for other dtypes (f64 in tests, bf16 parameters).
Tensor op_by_op_step(const Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const kernels::AdamWStep& step) {
  m = m * step.beta1 + g * (1 - step.beta1);
  v = v * step.beta2 + square(g) * (1 - step.beta2);
  Tensor direction = (m / step.correction1) / (sqrt(v / step.correction2) + step.eps);
  if (step.weight_decay > 0) direction = direction + p * step.weight_decay;
  return (p - direction * step.lr).with_vary(p.vary());
}

// g times a scalar on the device (undefined: g itself), with g's vary type.
Tensor scaled_gradient(const Tensor& g, const Tensor& scale) {
  return scale.defined() ? mul(g, cast(scale, g.dtype())).with_vary(g.vary()) : g;
}

Tensor one_step(const Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const kernels::AdamWStep& step) {
  const bool fused = p.dtype() == DType::f32 && g.dtype() == DType::f32 && m.dtype() == DType::f32;
  return fused ? fused_step(p, g, m, v, step) : op_by_op_step(p, g, m, v, step);
}

// This step's settings, computed once per step (the bias corrections); for_param picks the decay.
kernels::AdamWStep step_settings(const AdamWConfig& c, std::int64_t steps, double lr) {
  return {lr, c.beta1, c.beta2, c.eps, c.weight_decay, 1 - std::pow(c.beta1, static_cast<double>(steps)), 1 - std::pow(c.beta2, static_cast<double>(steps))};
}

// Weight decay applies to matrices (rank 2 and up) only.
kernels::AdamWStep for_param(kernels::AdamWStep step, const Shape& param) {
  if (param.rank() < 2) step.weight_decay = 0.0;
  return step;
}

// The first mesh axis over which a and b differ (kind, cut tensor axis, or the order of the mesh
// axes cutting one tensor axis), or "".
std::string first_difference(const VaryType& a, const VaryType& b) {
  for (const auto* entries : {&a.entries(), &b.entries()})
    for (const auto& e : *entries) {
      const std::string& m = e.mesh_axis;
      if (a.kind(m) != b.kind(m) || a.split_axis(m) != b.split_axis(m) || a.partial(m) != b.partial(m)) return m;
      if (a.kind(m) == Vary::Split && a.split_mesh_axes(a.split_axis(m)) != b.split_mesh_axes(b.split_axis(m))) return m;
    }
  return "";
}

std::string kind_over(const VaryType& v, const std::string& m) {
  switch (v.kind(m)) {
    case Vary::Invariant: return "Invariant";
    case Vary::Split: return fmt::format("Split along '{}'", v.split_axis(m));
    case Vary::Partial: return v.local_mean(m) ? "Partial (a local mean)" : "Partial (a partial sum)";
    case Vary::Varying: break;
  }
  return "Varying";
}

// A gradient typed otherwise than its parameter would be applied as if it were: a replicated
// parameter updated with a per-device (or partial) gradient differs per device while still typed
// Invariant, and ZeRO's parts would each come from another device's gradient.
void check_same_vary(const Tensor& p, const Tensor& g, const std::function<std::string()>& name) {
  const std::string m = first_difference(p.vary(), g.vary());
  if (m.empty()) return;
  const std::string fix = p.vary().kind(m) == Vary::Invariant
                              ? fmt::format("psum or pmean the gradient over '{}' first (grad() of a loss that is Invariant over "
                                            "'{}' returns it summed)", m, m)
                              : "a gradient must be cut and typed as its parameter (grad() returns it so)";
  fail("AdamW::step", "the gradient of {} is {} over mesh axis '{}' but the parameter is {} (gradient {}, parameter {}): applied "
       "as it is, each device would update its copy differently; {}", name(), kind_over(g.vary(), m), m, kind_over(p.vary(), m),
       g.str(), p.str(), fix);
}

}  // namespace

// Each segment of this device's chunk is updated as the whole parameter would be, element by
// element (the same kernel on the same values), then the chunks are all-gathered.
std::vector<Tensor> AdamW::sharded_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, double lr,
                                        const Tensor& grad_scale) {
  NoGrad no_grad;
  if (zero_ == nullptr) {
    zero_ = std::make_shared<detail::ZeroLayout>(params, config_.shard_state_over);
    for (const auto& seg : zero_->segments()) {
      m_.push_back(zeros(Shape{{"zero", seg.length}}, params[seg.param].dtype()));
      v_.push_back(m_.back());
    }
  }
  zero_->check_matches(params, "AdamW::step");
  ++steps_;
  const kernels::AdamWStep step = step_settings(config_, steps_, lr);
  std::vector<Tensor> updated;
  for (std::size_t k = 0; k < zero_->segments().size(); ++k) {
    const detail::Segment& seg = zero_->segments()[k];
    const Tensor p = zero_->cut(stop_gradient(params[seg.param]), seg), g = scaled_gradient(zero_->cut(grads[seg.param], seg), grad_scale);
    updated.push_back(one_step(p, g, m_[k], v_[k], for_param(step, params[seg.param].shape())));
  }
  return zero_->gather(updated);
}

std::vector<Tensor> AdamW::step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, double lr) {
  return named_step(params, grads, lr, [](std::size_t i) { return fmt::format("parameter {}", i); });
}

std::vector<Tensor> AdamW::step(const Parameters& params, const std::vector<Tensor>& grads, double lr) {
  return named_step(params.values(), grads, lr, [&](std::size_t i) { return fmt::format("parameter '{}'", params.specs()[i].name); });
}

void AdamW::update(Parameters& params, std::vector<Tensor> grads, double lr, const Tensor& grad_scale) {
  check_gradients(params.values(), grads, [&](std::size_t i) { return fmt::format("parameter '{}'", params.specs()[i].name); });
  if (!config_.shard_state_over.empty()) {
    params.assign(sharded_step(params.values(), grads, lr, grad_scale));
    return;
  }
  step_each(params.values(), std::move(grads), lr, [&](std::size_t i, Tensor updated) { params.assign(i, std::move(updated)); }, grad_scale);
}

void AdamW::check_gradients(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                            const std::function<std::string(std::size_t)>& name_of) const {
  if (params.size() != grads.size()) fail("AdamW::step", "{} parameters but {} gradients", params.size(), grads.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (grads[i].shape() != params[i].shape())
      fail("AdamW::step", "the gradient of {} is {}, the parameter {}", name_of(i), grads[i].str(), params[i].str());
    check_same_vary(params[i], grads[i], [&] { return name_of(i); });
  }
}

void AdamW::step_each(const std::vector<Tensor>& params, std::vector<Tensor> grads, double lr,
                      const std::function<void(std::size_t, Tensor)>& deliver, const Tensor& grad_scale) {
  NoGrad no_grad;
  if (m_.empty()) {  // the moments, at the first step
    for (const auto& p : params) {
      m_.push_back(zeros(p.shape(), p.dtype()).with_vary(p.vary()));
      v_.push_back(m_.back());
    }
  }
  if (m_.size() != params.size()) fail("AdamW::step", "state for {} parameters, got {}", m_.size(), params.size());
  ++steps_;
  const kernels::AdamWStep settings = step_settings(config_, steps_, lr);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor g = scaled_gradient(std::exchange(grads[i], Tensor()), grad_scale);  // the unscaled one goes here
    deliver(i, one_step(stop_gradient(params[i]), g, m_[i], v_[i], for_param(settings, params[i].shape())));
  }
}

std::vector<Tensor> AdamW::named_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, double lr,
                                      const std::function<std::string(std::size_t)>& name_of) {
  check_gradients(params, grads, name_of);
  if (!config_.shard_state_over.empty()) return sharded_step(params, grads, lr);
  std::vector<Tensor> updated;
  step_each(params, grads, lr, [&](std::size_t, Tensor t) { updated.push_back(std::move(t)); });
  return updated;
}

std::vector<Tensor> AdamW::state() const {
  if (zero_ != nullptr) {
    NoGrad no_grad;
    std::vector<Tensor> out = zero_->gather(m_);
    for (auto& v : zero_->gather(v_)) out.push_back(v);
    return out;
  }
  std::vector<Tensor> out = m_;
  out.insert(out.end(), v_.begin(), v_.end());
  return out;
}

void AdamW::load_state(std::vector<Tensor> state, std::int64_t steps) {
  if (state.size() % 2 != 0) fail("AdamW::load_state", "{} tensors: expected first and second moments", state.size());
  const auto half = static_cast<std::ptrdiff_t>(state.size() / 2);
  m_.assign(state.begin(), state.begin() + half);
  v_.assign(state.begin() + half, state.end());
  steps_ = steps;
  zero_ = nullptr;
  if (config_.shard_state_over.empty() || m_.empty()) return;
  NoGrad no_grad;
  auto layout = std::make_shared<detail::ZeroLayout>(m_, config_.shard_state_over);
  layout->check_matches(v_, "AdamW::load_state");
  std::vector<Tensor> m, v;
  for (const auto& seg : layout->segments()) {
    m.push_back(layout->cut(m_[seg.param], seg));
    v.push_back(layout->cut(v_[seg.param], seg));
  }
  m_ = std::move(m), v_ = std::move(v), zero_ = std::move(layout);
}

std::size_t AdamW::state_bytes() const {
  std::size_t bytes = 0;
  for (const auto* moments : {&m_, &v_})
    for (const auto& t : *moments) bytes += t.nbytes();
  return bytes;
}

// Each gradient's sum of squares, added up locally per set of mesh axes it is cut over, then one
// psum per set adds the other blocks' squares: a few scalar all-reduces, not one per gradient.
namespace {

// g's sum of squares in f64. Deterministic mode sums one axis at a time, innermost first, and
// finishes a sum over a cut axis with its psum at once: the order is then the same whichever axes
// a mesh (or the automatic sharding) cuts, so the norm, and the clipping, are mesh-independent.
Tensor sum_of_squares(const Tensor& g) {
  Tensor total = square(cast(g, DType::f64));
  const Shard* shard = Shard::current();
  if (shard == nullptr || !shard->deterministic()) return sum(total, g.shape().names());
  const auto names = g.shape().names();
  for (auto axis = names.rbegin(); axis != names.rend(); ++axis) {
    const auto cuts = total.vary().split_mesh_axes(*axis);
    total = sum(total, *axis);
    if (!cuts.empty()) total = psum(total, cuts);
  }
  return total;
}

}  // namespace

namespace {

// The sum of the gradients' squares, each finished over the mesh axes it is cut over but
// `stage_axis` (empty: all of them); one psum per set of axes.
Tensor total_squares(const std::vector<Tensor>& grads, const std::string& stage_axis = "") {
  std::map<std::vector<std::string>, Tensor> by_axes;
  for (const auto& g : grads) {
    Tensor squares = sum_of_squares(g);
    std::vector<std::string> axes;
    for (const auto& e : squares.vary().entries())
      if (e.mesh_axis != stage_axis) axes.push_back(e.mesh_axis);
    std::sort(axes.begin(), axes.end());
    auto [slot, fresh] = by_axes.try_emplace(axes, squares);
    if (!fresh) slot->second = slot->second + squares;
  }
  Tensor total;
  for (const auto& [axes, squares] : by_axes) {
    Tensor whole = axes.empty() ? squares : psum(squares, axes);
    total = total.defined() ? total + whole : whole;
  }
  return total;
}

// Deterministic mode's staged sum: every stage's finished squares (sum_of_squares finishes them),
// stacked on the device, padded with zeros to the longest stage, gathered over the stage axis and
// added on the host in the model's order, as one device adds them (a square is >= 0, so adding
// the padding's +0 changes no bit).
double staged_squares_in_order(const std::vector<Tensor>& grads, const std::string& stage_axis) {
  const auto mine = static_cast<std::int64_t>(grads.size());
  const auto longest = static_cast<std::int64_t>(pmax(pvary(scalar(static_cast<double>(mine), DType::f64), stage_axis), stage_axis).item());
  if (longest == 0) return 0.0;
  std::vector<Tensor> squares;
  for (const auto& g : grads) squares.push_back(expand_dims(sum_of_squares(g), "square"));
  if (longest > mine) squares.push_back(pvary(zeros(Shape{{"square", longest - mine}}, DType::f64), stage_axis));
  double total = 0;
  for (double x : all_gather_invariant_stacked(concat(squares, "square"), stage_axis, "stage").to_vector<double>()) total += x;
  return total;
}

}  // namespace

Tensor global_norm(const std::vector<Tensor>& grads) {
  NoGrad no_grad;
  const Tensor total = total_squares(grads);
  return total.defined() ? sqrt(total) : scalar(0.0, DType::f64);
}

Tensor global_norm(const std::vector<Tensor>& grads, const std::string& stage_axis) {
  NoGrad no_grad;
  const Shard* shard = Shard::current();
  if (shard == nullptr || !shard->mesh().has(stage_axis))
    fail("global_norm", "the stage axis '{}' is not an axis of the mesh{}", stage_axis, shard != nullptr ? " " + shard->mesh().str() : "");
  if (shard->deterministic()) return scalar(std::sqrt(staged_squares_in_order(grads, stage_axis)), DType::f64);
  Tensor total = total_squares(grads, stage_axis);
  if (!total.defined()) total = pvary(scalar(0.0, DType::f64), stage_axis);
  if (total.vary().kind(stage_axis) == Vary::Invariant) total = pvary(total, stage_axis);
  return sqrt(psum(total, stage_axis));
}

double clip_by_global_norm(std::vector<Tensor>& grads, double max_norm) {
  const double norm = global_norm(grads).item();
  if (norm > max_norm) {
    NoGrad no_grad;
    const double scale = max_norm / (norm + 1e-6);
    for (auto& g : grads) g = (g * scale).with_vary(g.vary());
  }
  return norm;
}

Tensor clip_by_global_norm_on_device(std::vector<Tensor>& grads, double max_norm) {
  const Tensor norm = global_norm(grads);
  clip_to_norm_on_device(grads, norm, max_norm);
  return norm;
}

Tensor clip_scale(const Tensor& norm, double max_norm) {
  NoGrad no_grad;
  // over is 1 or 0, so the scale is max / (norm + 1e-6) or exactly 1, as the host version decides.
  const Tensor over = gt(norm, full_like(norm, max_norm));
  return over * (max_norm / (norm + 1e-6)) + (1.0 - over);
}

void clip_to_norm_on_device(std::vector<Tensor>& grads, const Tensor& norm, double max_norm) {
  NoGrad no_grad;
  const Tensor scale = clip_scale(norm, max_norm);
  for (auto& g : grads) g = scaled_gradient(g, scale);
}

double warmup_cosine(std::int64_t step, std::int64_t warmup_steps, std::int64_t total_steps, double peak, double final_ratio) {
  if (step < warmup_steps) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (step >= total_steps) return peak * final_ratio;
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(std::max<std::int64_t>(1, total_steps - warmup_steps));
  const double cosine = 0.5 * (1 + std::cos(std::numbers::pi * progress));
  return peak * (final_ratio + (1 - final_ratio) * cosine);
}

void GradAccumulator::add(const std::vector<Tensor>& grads) {
  NoGrad no_grad;
  if (sum_.empty()) {
    sum_ = grads;
  } else {
    if (grads.size() != sum_.size()) fail("GradAccumulator::add", "{} gradients, expected {}", grads.size(), sum_.size());
    for (std::size_t i = 0; i < grads.size(); ++i)
      if (const std::string m = first_difference(sum_[i].vary(), grads[i].vary()); !m.empty())
        fail("GradAccumulator::add", "gradient {} is {} over mesh axis '{}', the gradients added before it {} ({} and {}): every "
             "micro-batch's gradients must be typed alike (psum or pmean each the same way)", i, kind_over(grads[i].vary(), m), m,
             kind_over(sum_[i].vary(), m), grads[i].str(), sum_[i].str());
    for (std::size_t i = 0; i < grads.size(); ++i) sum_[i] = (sum_[i] + grads[i]).with_vary(sum_[i].vary());
  }
  ++count_;
}

std::vector<Tensor> GradAccumulator::mean() const {
  if (count_ == 0) fail("GradAccumulator::mean", "no gradients were added");
  if (count_ == 1) return sum_;  // x / 1 is x: no copy
  NoGrad no_grad;
  std::vector<Tensor> out;
  for (const auto& s : sum_) out.push_back((s / static_cast<double>(count_)).with_vary(s.vary()));
  return out;
}

void GradAccumulator::clear() {
  sum_.clear();
  count_ = 0;
}

}  // namespace nax::nn
