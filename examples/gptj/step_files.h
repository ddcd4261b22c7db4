#pragma once
// A run's step folder read as one unit, by one loader for every command that reads one (sample,
// logits, convert, train --init-from and --resume): so an edit to any of its files changes what
// all of them do, or (as it does) none, since the edit is refused.
#include <nax/nax.h>
#include <nax/io/json.h>

#include <nlohmann/json.hpp>
#include <string>

#include "config.h"

namespace gptj {

// trainer.json, validated: the step, the optimizer's steps, the run record and the config it
// records for the run (its dimensions, layer_norm_epsilon, and the vocabulary before padding).
struct TrainerState {
  std::string path;
  std::int64_t step = 0, adam_steps = 0;
  nlohmann::json run;
  Config config;
};
TrainerState trainer_state_from_json(const std::string& text, const std::string& path);
TrainerState trainer_state_from_file(const std::string& path);  // capped at 4 MiB
std::string trainer_json(std::int64_t step, std::int64_t adam_steps, const nlohmann::json& run);

// Whether `dir` is a nax step folder, to be read only through open_step: it looks like a run's
// step folder (nax::checkpoint::looks_like_step_folder), or it holds trainer.json or
// optimizer.safetensors. A Hugging Face folder is none of these.
bool is_step_folder(const std::string& dir);

// A step folder, verified against its manifest (a folder without one is refused: it was never
// committed); config.json and trainer.json read, and the run's config that trainer.json records
// checked against config.json field by field (an edit of one of them alone is refused naming
// both files); trainer.json's step checked against the folder's name; the model's tensors checked.
struct StepFiles {
  std::string folder;
  Config config;
  TrainerState trainer;
  nax::checkpoint::SafetensorsFolder weights;  // model.safetensors, checksummed
};
StepFiles open_step(const std::string& folder, nax::checkpoint::NonFinitePolicy nonfinite);

}  // namespace gptj
