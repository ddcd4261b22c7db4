#pragma once
// Shared by the GPT-J tests: a small corpus, the tiny config's training options, Learner steps on a
// fixed batch, checkpoints resumed across meshes.
#include <fmt/format.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "data.h"
#include "files.h"
#include "helpers.h"
#include "learner.h"
#include "train.h"

namespace nax::testing {

inline const gptj::TextData& corpus() {
  static const gptj::TextData data = [] {
    std::string text;
    for (int i = 0; i < 200; ++i) text += fmt::format("line {} of a small corpus: the quick brown fox jumps over {} lazy dogs.\n", i, i % 7);
    return gptj::TextData::from_text(text);
  }();
  return data;
}

// `tiny` on `mesh` for `steps` steps of batch 4 x seq 16, quietly, without evaluation.
inline gptj::TrainOptions tiny(const std::string& mesh, std::int64_t steps, const std::string& sharding = "hand") {
  gptj::TrainOptions o;
  o.config = "tiny", o.mesh = mesh, o.steps = steps, o.batch = 4, o.seq = 16, o.lr = 1e-2, o.warmup = 2;
  o.eval_every = 0, o.eval_batches = 1, o.quiet = true, o.sharding = sharding;
  return o;
}

// The loss and gradient norm of each of `steps` Learner steps of o.config on one fixed batch
// (o.batch x o.seq tokens, the same on every mesh), run on `rt`; every device computes the same
// values, device 0's are returned. For comparing backends, devices and meshes step by step.
struct StepValues {
  std::vector<double> losses, grad_norms;
  bool operator==(const StepValues&) const = default;
};

// A fixed batch of o.batch x o.seq ids and their next-token targets, on the host.
inline std::pair<nax::Tensor, nax::Tensor> host_batch(const gptj::Config& config, const gptj::TrainOptions& o) {
  std::vector<std::int32_t> tokens;
  for (std::int64_t i = 0; i < o.batch * (o.seq + 1); ++i) tokens.push_back(static_cast<std::int32_t>((i * 7919 + i / 5 + 13) % config.vocab));
  const nax::Tensor all = nax::from_vector(nax::Shape{{"batch", o.batch}, {"seq", o.seq + 1}}, tokens, nax::DType::i32);
  return {nax::contiguous_copy(nax::slice(all, "seq", 0, o.seq)), nax::contiguous_copy(nax::slice(all, "seq", 1, o.seq + 1))};
}

// This device's block of the fixed batch, the same global batch on every mesh (the sequence in the
// cp devices' order when the mesh cuts it over cp, as gptj train does).
inline std::pair<nax::Tensor, nax::Tensor> fixed_batch(nax::Shard& s, const gptj::Config& config, const gptj::TrainOptions& o,
                                                       const nax::AxisRules& rules) {
  const auto [ids, targets] = host_batch(config, o);
  const int cp = gptj::context_devices(s.mesh());
  return {s.shard(gptj::zigzag_order(ids, cp), rules), s.shard(gptj::zigzag_order(targets, cp), rules)};
}

struct LossAndGrads {
  double loss = 0;
  std::vector<std::vector<double>> grads;  // gathered, in the order of parameter_specs
};

// tiny's loss on the fixed batch and the gradient of every parameter, on `mesh` (any of gptj's
// axes), the model set up by `configure` (remat, sequence parallelism).
inline LossAndGrads loss_and_grads(const std::string& mesh, const std::function<void(gptj::Model&)>& configure) {
  const gptj::TrainOptions o = tiny(mesh, 1);
  nax::Runtime rt = nax::Runtime::local(gptj::model_mesh(mesh));
  const gptj::Config config = gptj::padded_for(gptj::config_by_name(o.config), rt.mesh());
  return rt.run([&](nax::Shard& s) {
    const nax::AxisRules rules = gptj::axis_rules(s.mesh());
    gptj::Model model(config, nax::nn::Parameters::init(s, gptj::parameter_specs(config), rules, o.seed));
    configure(model);
    const auto [ids, targets] = fixed_batch(s, config, o, rules);
    const nax::Tensor loss = model.loss(ids, targets);
    LossAndGrads out{loss.item(), {}};
    for (const auto& g : nax::grad(loss, model.params().values())) out.grads.push_back(s.gather(g).to_vector<double>());
    return out;
  })[0];
}

inline StepValues learner_steps(nax::Runtime rt, const gptj::TrainOptions& o, int steps) {
  const gptj::Config config = gptj::padded_for(gptj::config_by_name(o.config), rt.mesh());
  return rt.run([&](nax::Shard& s) {
    const nax::AxisRules rules = gptj::axis_rules(s.mesh());
    gptj::Learner learner(s, config, rules, o);
    const auto [ids, targets] = fixed_batch(s, config, o, rules);
    StepValues values;
    for (int step = 0; step < steps; ++step) {
      const auto stats = learner.step(ids, targets, o.lr);
      values.losses.push_back(stats.loss);
      values.grad_norms.push_back(stats.grad_norm.item());
    }
    return values;
  })[0];
}

// For each (saved on, resumed on): 6 steps of `options(mesh)`, interrupted after 3 on the first mesh
// and resumed on the second, give the last 3 losses of an uninterrupted run on `straight_on` (1e-5).
inline void require_resumes_across(const std::function<gptj::TrainOptions(const std::string&)>& options, const std::string& straight_on,
                                   const std::vector<std::pair<std::string, std::string>>& pairs, const std::string& scratch) {
  const auto straight = gptj::train(options(straight_on), corpus()).losses;
  REQUIRE(straight.size() == 6);
  const std::vector<double> tail(straight.begin() + 3, straight.end());
  for (const auto& [saved_on, resumed_on] : pairs) {
    INFO("saved on " << saved_on << ", resumed on " << resumed_on);
    const std::string dir = scratch_dir(scratch);
    auto interrupted = options(saved_on);
    interrupted.ckpt_dir = dir, interrupted.stop_after = 3;
    REQUIRE(gptj::train(interrupted, corpus()).losses.size() == 3);
    auto resumed = options(resumed_on);
    resumed.ckpt_dir = dir, resumed.resume = true;
    require_close(gptj::train(resumed, corpus()).losses, tail, 1e-5);
    std::filesystem::remove_all(dir);
  }
}

}  // namespace nax::testing
