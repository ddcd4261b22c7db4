#pragma once
// Shared by the GPT-J tests: a small corpus, the tiny config's training options, Learner steps on a
// fixed batch.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "data.h"
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

// This device's block of a fixed batch of o.batch x o.seq ids and their next-token targets, the same
// on every mesh.
inline std::pair<nax::Tensor, nax::Tensor> fixed_batch(nax::Shard& s, const gptj::Config& config, const gptj::TrainOptions& o,
                                                       const nax::AxisRules& rules) {
  std::vector<std::int32_t> tokens;
  for (std::int64_t i = 0; i < o.batch * (o.seq + 1); ++i) tokens.push_back(static_cast<std::int32_t>((i * 7919 + i / 5 + 13) % config.vocab));
  const nax::Shape shape{{"batch", o.batch}, {"seq", o.seq + 1}};
  const nax::Tensor all = s.shard(nax::from_vector(shape, tokens, nax::DType::i32), rules);
  return {nax::slice(all, "seq", 0, o.seq), nax::slice(all, "seq", 1, o.seq + 1)};
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

}  // namespace nax::testing
