#pragma once
// The GPT-J-style model written per shard, mesh-transformer-jax style: a
// vocab-parallel embedding (masked lookup + psum), parallel-residual blocks with one psum each, a
// final LayerNorm, a vocab-parallel output head with bias and the vocab-parallel cross-entropy.
// Logits are never gathered for training. With sequence parallelism the psums become psum_scatters
// along seq and the stream between them is cut along seq over mp (block.h). On a pp mesh a Model
// holds one pipeline stage's layers and runs them with stage_forward (pipeline.h).
#include <nax/nax.h>

#include <optional>

#include "block.h"
#include "config.h"
#include "pipeline.h"

namespace gptj {

// Parameter names and layouts follow Hugging Face's GPTJForCausalLM.
std::vector<nax::nn::ParamSpec> parameter_specs(const Config& c);

// vocab, heads and mlp over mp; batch over dp.
nax::AxisRules axis_rules(const nax::Mesh& mesh);

BlockConfig block_config(const Config& c);

class Model {
 public:
  // compute: bf16 casts the parameters where they are used (for_compute in config.h); f32 computes in
  // the parameters' dtype.
  // stage: the layers whose parameters `params` holds (stage_specs); by default every layer.
  Model(Config config, nax::nn::Parameters params, nax::DType compute = nax::DType::f32, std::optional<Stage> stage = std::nullopt)
      : config_(std::move(config)), params_(std::move(params)), compute_(compute),
        stage_(stage ? *stage : stage_of(config_, 0, 1)) {}

  // ids: i32 [batch, seq], batch cut over dp. Result: [batch, seq, vocab|mp], in the compute dtype.
  nax::Tensor logits(const nax::Tensor& ids, std::vector<KVCache>* caches = nullptr) const;
  // Mean next-token cross-entropy over the global batch: Invariant on every device.
  nax::Tensor loss(const nax::Tensor& ids, const nax::Tensor& targets) const;
  // A pipeline stage's part of loss(), reading `values` (the stage's parameters, or vjp's fresh
  // leaves of them): from ids (stage 0) or the previous stage's activation `input`, to the
  // activation the next stage reads or, on the last stage, the loss of `targets`.
  nax::Tensor stage_forward(const std::vector<nax::Tensor>& values, const nax::Tensor& input, const nax::Tensor& ids,
                            const nax::Tensor& targets) const;
  const Stage& stage() const { return stage_; }
  // Zeros shaped as the stream a stage passes on for a micro-batch of `ids`: [batch, seq, embed]
  // in the compute dtype, cut as the ids are and, with sequence parallelism, seq over mp too;
  // Varying over pp.
  nax::Tensor stage_activation_zeros(const nax::Tensor& ids) const;

  // Activation checkpointing per block (nax::remat): each block keeps only its input for backward,
  // which runs the block's forward again. Training only: generation with a KV cache ignores it.
  void set_remat(bool on) { remat_ = on; }
  bool remat() const { return remat_; }

  // Sequence parallelism (Megatron-LM's, over mp): the embedding's sum is reduce-scattered along
  // seq, the blocks and the final LayerNorm run on this device's block of the sequence, and the
  // head reads it gathered. The same parameters and results; seq must divide by mp. Training
  // only: generation with a KV cache ignores it.
  void set_sequence_parallel(bool on) { sequence_parallel_ = on; }
  void set_overlap_pieces(std::int64_t pieces) { overlap_pieces_ = pieces; }
  bool sequence_parallel() const { return sequence_parallel_; }

  const Config& config() const { return config_; }
  nax::nn::Parameters& params() { return params_; }
  const nax::nn::Parameters& params() const { return params_; }

 private:
  std::vector<nax::Tensor> stored_block(const std::vector<nax::Tensor>& values, std::int64_t i) const;
  nax::Tensor block_forward(const std::vector<nax::Tensor>& values, std::int64_t i, const nax::Tensor& x, const BlockConfig& bc,
                            KVCache* cache) const;
  // The stage's blocks in order; under FSDP without remat, block i+1's parameters are gathered
  // while block i computes (and backward, reduce-scattered while block i's backward runs).
  nax::Tensor stage_blocks(const std::vector<nax::Tensor>& values, nax::Tensor x, const BlockConfig& bc) const;
  std::vector<nax::Pending<nax::Tensor>> start_gathers(const std::vector<nax::Tensor>& values, std::int64_t i) const;
  nax::Tensor param(const std::vector<nax::Tensor>& values, const std::string& name) const;
  BlockConfig block_config_for(bool generating) const;
  nax::Tensor embed(const std::vector<nax::Tensor>& values, const nax::Tensor& ids, const BlockConfig& bc) const;
  nax::Tensor head(const std::vector<nax::Tensor>& values, const nax::Tensor& x, const BlockConfig& bc) const;
  nax::Tensor mean_loss(const nax::Tensor& logits, const nax::Tensor& targets) const;
  nax::Tensor targets_for(const nax::Tensor& targets, const BlockConfig& bc) const;
  void require_whole(const char* what) const;  // refuses a model that holds one pipeline stage

  Config config_;
  nax::nn::Parameters params_;
  nax::DType compute_;
  Stage stage_;
  bool remat_ = false;
  bool sequence_parallel_ = false;
  std::int64_t overlap_pieces_ = 2;
};

}  // namespace gptj
