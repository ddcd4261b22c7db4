#pragma once
// The same GPT-J-style model in nax's global view (docs/architecture.md, Global view): written as if on one device, in
// Hugging Face GPTJForCausalLM's order of operations, with the same parameter names, global shapes
// and init as the per-shard model (model.h). Sharding comes only from the axis rules that cut the
// parameters and the inputs; sharding propagation decides the communication.
#include <nax/nax.h>

#include "config.h"

namespace gptj {

class GlobalModel {
 public:
  // Reads the per-shard parameter blocks (nn::Parameters cut by axis_rules) as global tensors; they
  // may be replaced (by the optimizer) between calls. compute: as for Model (model.h).
  GlobalModel(Config config, const nax::nn::Parameters& params, nax::DType compute = nax::DType::f32)
      : config_(std::move(config)), params_(params), compute_(compute) {}

  // ids: i32 [batch, seq]. Result: [batch, seq, vocab], placed wherever propagation put it.
  nax::GlobalTensor logits(const nax::GlobalTensor& ids) const;
  // Mean next-token cross-entropy over the global batch, replicated.
  nax::GlobalTensor loss(const nax::GlobalTensor& ids, const nax::GlobalTensor& targets) const;
  // The same from per-shard blocks, as the trainer holds them: an Invariant scalar.
  nax::Tensor loss(const nax::Tensor& ids, const nax::Tensor& targets) const;

  // Sequence parallelism as a placement: the residual stream between blocks (the embedding's
  // output, each block's) constrained to [batch as the data, seq over mp, embed whole]; propagation
  // chooses the collectives around it (gptj --sharding auto --sequence-parallel).
  void set_sequence_parallel(bool on) { sequence_parallel_ = on; }

 private:
  nax::GlobalTensor param(const std::string& name) const { return for_compute(nax::GlobalTensor::from_local(params_[name]), compute_); }
  nax::GlobalTensor block(std::int64_t layer, const nax::GlobalTensor& x) const;
  nax::GlobalTensor placed(const nax::GlobalTensor& x, bool seq_cut) const;

  Config config_;
  const nax::nn::Parameters& params_;
  nax::DType compute_;
  bool sequence_parallel_ = false;
};

}  // namespace gptj
