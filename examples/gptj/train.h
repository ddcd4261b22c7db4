#pragma once
// Training and sampling drivers behind the `gptj` command.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data.h"
#include "model.h"

namespace gptj {

struct TrainOptions {
  std::string config = "small";
  std::string mesh = "dp=2,mp=2";
  std::vector<std::string> data;
  std::int64_t steps = 200;
  std::int64_t batch = 8;
  std::int64_t seq = 128;
  double lr = 3e-3;
  std::int64_t warmup = 20;
  std::uint64_t seed = 0;
  double clip = 1.0;
  double weight_decay = 0.1;
  std::int64_t micro_batches = 1;
  std::string schedule = "1f1b";  // with a pp axis: 1f1b or gpipe (pipeline.h)
  std::string ckpt_dir;  // empty: no checkpoints
  bool resume = false;
  std::int64_t save_every = 0;  // 0: only at the end
  std::int64_t keep = 0;        // committed step folders kept (the newest); 0: all
  // --resume may raise --steps: the cosine schedule is then stretched over the new total.
  bool allow_extend_steps = false;
  std::int64_t stop_after = 0;  // stop (and checkpoint) after this step, as if interrupted; 0: run all
  std::int64_t eval_every = 50;
  std::int64_t eval_batches = 4;
  std::string metrics;  // JSON lines
  bool quiet = false;
  nax::Backend backend = nax::Backend::cpu;  // cpu: simulated devices; cuda: GPUs (see nax::RuntimeOptions)
  std::string sharding = "hand";  // hand: the per-shard model (model.h); auto: the global view (global_model.h)
  // Compute dtype. bf16: mixed precision (bf16 parameters and activations in the model, f32 master
  // weights, optimizer state and loss); f32: everything f32.
  nax::DType dtype = nax::DType::f32;
  std::string tokenizer;    // a Hugging Face tokenizer.json; empty: bytes (vocab 256)
  // A model folder to fine-tune (Hugging Face's GPT-J, or a nax step folder): its config.json
  // replaces --config and its weights the initialisation (docs/hf-import.md).
  std::string init_from;
  std::string token_cache;  // where token files go; empty: beside each data file
  // Time forward, backward and optimizer separately (drains the device queue at each boundary).
  bool time_phases = false;
  // Activation checkpointing per block (Model::set_remat; the hand sharding only).
  bool remat = false;
  // ZeRO-1: AdamW's moments cut over dp (nn::AdamWConfig::shard_state_over).
  bool zero = false;
  // The gradients' psums over dp go in buckets of this size, each started as soon as the backward
  // has produced it (nax::GradOptions::bucket_bytes, PyTorch DDP's bucket_cap_mb); 0: all at the end.
  double bucket_mb = 25;
  // Megatron-style sequence parallelism over mp (Model::set_sequence_parallel; the hand sharding only).
  bool sequence_parallel = false;
  // With sequence_parallel, default mode: each block's batch in this many pieces whose gathers and
  // reduce-scatters overlap the other pieces' compute (BlockConfig::overlap_pieces); 1: none.
  std::int64_t overlap_pieces = 2;
  // nax::RuntimeOptions::deterministic: the same bits on every mesh (docs/determinism.md).
  bool deterministic = false;
  // Loads (--init-from, --resume) accept weights holding NaN or infinities, which are refused otherwise.
  bool allow_nonfinite = false;
};

struct TrainResult {
  std::vector<double> losses;  // one per step run
  double heldout_loss = 0;
  double initial_heldout_loss = 0;  // with init_from: the pretrained model's, before any step
  double tokens_per_s = 0;     // median over steps after the first
  double mfu = 0;
  double peak_gflops = 0;
  // Communication of one device in the last step: bytes sent per group of mesh axes, and calls.
  std::map<std::string, double> bytes_per_step;
  double collectives_per_step = 0;
  std::size_t peak_bytes = 0;  // device 0's allocator high-water mark over the run
  // With time_phases: device 0's median seconds per step in each phase (steps after the first).
  double forward_s = 0, backward_s = 0, optimizer_s = 0;
  // With a pp axis: the schedule's bubble (the fraction of stage-ticks idle), the most micro-batches a
  // stage holds at once, and device 0's measured idle fraction of the schedule (median over steps).
  double bubble = 0, measured_bubble = 0;
  std::int64_t in_flight = 0;
};

// Checks the options before any work: every number (ranges, finite, no overflow), the choices
// (--sharding, --dtype) and the flags that do not go together.
void check_options(const TrainOptions& options);

// Refuses a run whose training_bytes_lower_bound exceeds the machine's memory (times the
// processes under mpirun), naming both.
void check_memory(const Config& config, std::int64_t batch, std::int64_t seq);
// Refuses, as `op`, work on `what` that needs more than `need` bytes of this machine's memory (all
// processes' under mpirun): a model folder whose tensors say so is refused before they are read.
void check_host_memory(const std::string& op, const std::string& what, double need);

TrainResult train(const TrainOptions& options, const TextData& data);

// The runtime options of a --backend.
nax::RuntimeOptions runtime_options(nax::Backend backend, bool deterministic = false);

// The checks of a training run's shape that need no data: the mesh fits the config and the batch,
// the sequence's cuts, micro-batches that divide each device's rows, the machine's memory; a
// pipeline with fewer micro-batches than stages is warned about. `command` names the errors.
void check_run(const Config& config, const nax::Mesh& mesh, const TrainOptions& o, const char* command);

// This device's block of [batch, seq] tokens as training feeds them: the sequence in the cp
// devices' zigzag order (ring_attention.h).
nax::Tensor device_tokens(nax::Shard& s, const nax::Tensor& tokens, const nax::AxisRules& rules);
// This device's block of step `step`'s training batch (inputs, targets); in deterministic mode the
// rows in micro-batch-major order (the same micro-batches summed in the same order on every mesh).
std::pair<nax::Tensor, nax::Tensor> device_batch(nax::Shard& s, const TextData& data, const TrainOptions& o, const nax::AxisRules& rules,
                                                 std::int64_t step);

struct SampleOptions {
  nax::Backend backend = nax::Backend::cpu;
  std::string ckpt_dir;
  std::string mesh = "dp=1,mp=1";
  std::string prompt;
  // A batch of prompts for sample_batch, each continued on its own (empty: {prompt}).
  std::vector<std::string> prompts;
  std::int64_t tokens = 100;
  double temperature = 0.8;
  std::int64_t top_k = 40;
  // Nucleus sampling: among the most likely tokens whose probabilities (after temperature and
  // top-k) add up to top_p; 1 keeps them all.
  double top_p = 1.0;
  // With a tokenizer: a continuation ends at the config's eos_token_id (not included).
  bool stop_at_eos = true;
  std::uint64_t seed = 0;
  std::string tokenizer;  // the tokenizer.json the model was trained with; empty: bytes
  bool deterministic = false;  // nax::RuntimeOptions::deterministic
  bool allow_nonfinite = false;  // weights holding NaN or infinities are refused unless set
};

// Checks --tokens, --temperature, --top-k and --top-p.
void check_options(const SampleOptions& options);

// The prompt's continuation (without the prompt).
std::string sample(const SampleOptions& options);

// Each prompt's continuation, in order: the model loaded once, the prompts generated one after
// another (each with its own KV cache and its own draws: prompt k uses seed stream "sample.k").
std::vector<std::string> sample_batch(const SampleOptions& options);

// The prompts of a prompts file: one per line, empty lines skipped (an error names the file if
// it is not a regular file or holds none).
std::vector<std::string> read_prompts(const std::string& path);

// The model's logits for every position of the prompt, [seq][vocab] (for comparisons with other
// implementations, e.g. Hugging Face's GPTJForCausalLM).
std::vector<std::vector<double>> prompt_logits(const SampleOptions& options);

}  // namespace gptj
