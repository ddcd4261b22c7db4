#pragma once
// The GPT-J-style model written per shard, mesh-transformer-jax style (DESIGN.md §8): a
// vocab-parallel embedding (masked lookup + psum), parallel-residual blocks with one psum each, a
// final LayerNorm, a vocab-parallel output head with bias and the vocab-parallel cross-entropy.
// Logits are never gathered for training.
#include <nax/nax.h>

#include "block.h"
#include "config.h"

namespace gptj {

// Parameter names and layouts follow Hugging Face's GPTJForCausalLM.
std::vector<nax::nn::ParamSpec> parameter_specs(const Config& c);

// vocab, heads and mlp over mp; batch over dp.
nax::AxisRules axis_rules(const nax::Mesh& mesh);

BlockConfig block_config(const Config& c);

class Model {
 public:
  Model(Config config, nax::nn::Parameters params) : config_(std::move(config)), params_(std::move(params)) {}

  // ids: i32 [batch, seq], batch cut over dp. Result: [batch, seq, vocab|mp].
  nax::Tensor logits(const nax::Tensor& ids, std::vector<KVCache>* caches = nullptr) const;
  // Mean next-token cross-entropy over the global batch: Invariant on every device.
  nax::Tensor loss(const nax::Tensor& ids, const nax::Tensor& targets) const;

  const Config& config() const { return config_; }
  nax::nn::Parameters& params() { return params_; }
  const nax::nn::Parameters& params() const { return params_; }

 private:
  BlockParams layer(std::int64_t i) const;

  Config config_;
  nax::nn::Parameters params_;
};

}  // namespace gptj
