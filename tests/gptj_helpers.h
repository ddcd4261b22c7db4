#pragma once
// Shared by the GPT-J tests: a small corpus and the tiny config's training options.
#include <fmt/format.h>

#include <string>

#include "data.h"
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

}  // namespace nax::testing
