#pragma once
// `gptj export`: what an external baseline (bench/jax_baseline.py) needs to train the very same
// run as `gptj train`: the initial parameters, the config, the batches of the first steps and the
// optimizer's hyperparameters, written as files.
#include <string>

#include "checkpoint.h"
#include "data.h"
#include "train.h"

namespace gptj {

struct ExportOptions {
  // config, mesh, seed, batch, seq, steps (the number of batches written and the schedule's
  // total), lr and warmup are read; the optimizer's other settings are the trainer's defaults.
  TrainOptions train;
  std::string out;  // the folder written
};

// Writes into options.out:
//   model.safetensors    the parameters as `gptj train` initialises them for that config (vocab
//                        padded for the mesh), mesh and seed: Hugging Face names and layouts, as in
//                        the trainer's checkpoints;
//   config.json          as in the trainer's checkpoints;
//   batches.safetensors  i32 ids.{k} and targets.{k} [batch, seq], the training batches of steps
//                        k = 0 .. steps-1;
//   export.json          config name and dimensions, mesh, seed, batch, seq, steps and the
//                        optimizer's hyperparameters (lr, warmup, total steps, weight decay, clip,
//                        Adam betas and eps, final lr ratio of the schedule).
void export_run(const ExportOptions& options, const TextData& data);

// The parameters as `gptj train` initialises them for (config, mesh, seed), gathered to global
// host tensors in Hugging Face layout, in parameter_specs order, named as in checkpoints.
NamedTensors initial_parameters(const Config& config, const nax::Mesh& mesh, std::uint64_t seed);

}  // namespace gptj
