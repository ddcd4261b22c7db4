#pragma once
// Gradient checks against central finite differences in f64: on the host for single-device ops,
// and on a mesh for per-shard programs (the params are global tensors cut by axis rules; the
// program's loss must end Invariant over every mesh axis).
#include <cstdlib>
#include <fmt/format.h>

#include <functional>

#include "helpers.h"

namespace nax::testing {

struct GradCheckOptions {
  double eps = 1e-6;
  double tolerance = 1e-6;  // on |analytic - numeric| / max(1, |analytic|, |numeric|)
};

// f64 random inputs from fixed seeds, so that a failure reproduces: the seed of every input is
// printed when a check fails; NAX_TEST_SEED=N starts elsewhere to explore new points.
inline std::uint64_t fresh_seed() {
  static const std::uint64_t base = [] {
    const char* env = std::getenv("NAX_TEST_SEED");
    return env != nullptr ? std::strtoull(env, nullptr, 10) : std::uint64_t{20261204};
  }();
  static std::uint64_t counter = 0;
  return base + counter++;
}

inline Tensor random_input(const Shape& shape, const std::string& name, double scale = 1.0) {
  std::uint64_t seed = fresh_seed();
  UNSCOPED_INFO("input " << name << " seed " << seed);
  return random_normal(shape, seed, name, scale, DType::f64);
}

// A general scalar of y: sum(y * w) with fixed random weights w of y's shape (host).
inline Tensor weighted_sum(const Tensor& y, std::uint64_t seed = 99) {
  Tensor w = random_normal(y.shape(), seed, "grad_check_weights", 1.0, y.dtype());
  return sum(y * w, y.shape().names());
}

inline Tensor replace_element(const Tensor& x, std::size_t i, double value) {
  auto v = x.to_vector<double>();
  v[i] = value;
  return from_vector(x.shape(), v, x.dtype());
}

inline void compare_gradient(const std::vector<double>& analytic, const std::vector<double>& numeric, const std::string& what,
                             double tolerance) {
  REQUIRE(analytic.size() == numeric.size());
  for (std::size_t j = 0; j < analytic.size(); ++j) {
    const double scale = std::max({1.0, std::abs(analytic[j]), std::abs(numeric[j])});
    const double err = std::abs(analytic[j] - numeric[j]) / scale;
    INFO(what << " element " << j << ": analytic " << analytic[j] << " numeric " << numeric[j]);
    REQUIRE(err <= tolerance);
  }
}

// Host: f maps the inputs to a scalar.
inline void check_gradients(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
                            GradCheckOptions options = {}) {
  auto [value, grads] = value_and_grad(f, inputs);
  REQUIRE(grads.size() == inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    REQUIRE(grads[i].shape() == inputs[i].shape());
    std::vector<double> numeric;
    const auto x = inputs[i].to_vector<double>();
    for (std::size_t j = 0; j < x.size(); ++j) {
      auto at = [&](double delta) {
        NoGrad no_grad;
        auto moved = inputs;
        moved[i] = replace_element(inputs[i], j, x[j] + delta);
        return f(moved).item();
      };
      numeric.push_back((at(options.eps) - at(-options.eps)) / (2 * options.eps));
    }
    compare_gradient(grads[i].to_vector<double>(), numeric, fmt::format("input {}", i), options.tolerance);
  }
}

// Mesh: `program` runs per shard on the params' blocks (cut by `rules`) and returns a scalar loss
// Invariant over every mesh axis. Gradients are gathered and compared with finite differences of
// the whole mesh program.
inline void check_mesh_gradients(Runtime& rt, const std::function<Tensor(Shard&, const std::vector<Tensor>&)>& program,
                                 const std::vector<Tensor>& globals, const AxisRules& rules, GradCheckOptions options = {}) {
  auto loss_of = [&](const std::vector<Tensor>& params) {
    return rt.run([&](Shard& s) {
      NoGrad no_grad;
      std::vector<Tensor> local;
      for (const auto& p : params) local.push_back(s.shard(p, rules));
      return program(s, local).item();
    })[0];
  };
  auto grads = rt.run([&](Shard& s) {
    std::vector<Tensor> local;
    for (const auto& p : globals) local.push_back(s.shard(p, rules));
    auto [loss, g] = value_and_grad([&](const std::vector<Tensor>& ps) { return program(s, ps); }, local);
    NAX_EXPECT(loss.vary().invariant());
    std::vector<std::vector<double>> gathered;
    for (const auto& gi : g) gathered.push_back(s.gather(gi).to_vector<double>());
    return gathered;
  })[0];
  for (std::size_t i = 0; i < globals.size(); ++i) {
    std::vector<double> numeric;
    const auto x = globals[i].to_vector<double>();
    for (std::size_t j = 0; j < x.size(); ++j) {
      auto moved_up = globals, moved_down = globals;
      moved_up[i] = replace_element(globals[i], j, x[j] + options.eps);
      moved_down[i] = replace_element(globals[i], j, x[j] - options.eps);
      numeric.push_back((loss_of(moved_up) - loss_of(moved_down)) / (2 * options.eps));
    }
    compare_gradient(grads[i], numeric, fmt::format("mesh {} param {}", rt.mesh().str(), i), options.tolerance);
  }
}

// Sums a per-device scalar over every mesh axis it varies on, so that it is Invariant.
inline Tensor invariant_total(const Tensor& x) {
  auto axes = x.vary().unreduced_mesh_axes();
  return axes.empty() ? x : psum(x, axes);
}

}  // namespace nax::testing
