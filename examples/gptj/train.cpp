#include "train.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include <nax/io/output_path.h>

#include "checkpoint.h"
#include "learner.h"
#include "progress.h"
#include "step_files.h"

namespace gptj {

using namespace nax;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The mesh's GEMM peak in the run's compute dtype, in GFLOP/s: one thread's dot rate on 1024^3 (a
// simulated device is one thread; bf16 on the CPU's bf16 instructions where it has them) times the
// devices that can run at once (at most the cores).
double measure_peak_gflops(int devices, DType dtype) {
  const bool tracing = trace::enabled();  // a calibration on a runtime of its own: not part of the run's timeline
  trace::stop();
  Runtime rt = Runtime::local(Mesh::parse("x=1"), {.blas_threads = 1});
  double best = 0;
  rt.run([&](Shard&) {
    const Tensor a = cast(random_normal(Shape{{"m", 1024}, {"k", 1024}}, 1, "a"), dtype);
    const Tensor b = cast(random_normal(Shape{{"k", 1024}, {"n", 1024}}, 1, "b"), dtype);
    for (int i = 0; i < 4; ++i) {
      auto t = Clock::now();
      dot(a, b, "k");
      best = std::max(best, 2.0 * 1024 * 1024 * 1024 / seconds_since(t) * 1e-9);
    }
  });
  if (tracing) trace::resume();
  return best * static_cast<double>(std::min<unsigned>(static_cast<unsigned>(devices), std::max(1u, std::thread::hardware_concurrency())));
}

// The peak MFU is measured against: on GPUs the datasheet's, once per GPU in use (virtual devices
// share theirs), else the CPU's measured sgemm rate.
double peak_gflops(const TrainOptions& o, int devices) {
  if (o.backend == Backend::cpu) return measure_peak_gflops(devices, o.dtype);
  const int gpus = std::max(1, std::min(devices, cuda_gpu_count()));
  return gpus * gpu_peak_flops(o.dtype) * 1e-9;
}

namespace ckpt = nax::checkpoint;

// What defines a run's trajectory, stored in every checkpoint and compared on --resume. The mesh
// and the sharding are not in it: a checkpoint resumes on any mesh.
// `c` is the config before the vocabulary is padded (the padding follows the mesh).
nlohmann::json run_record(const TrainOptions& o, const Config& c) {
  nlohmann::json data = nlohmann::json::array();
  for (const auto& path : o.data) {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(path, ec);
    if (ec) fail("train", "--data '{}': {}", path, ec.message());
    data.push_back({{"bytes", bytes}, {"checksum", nax::io::file_checksum(path)}});
  }
  return {{"config", {{"name", c.name}, {"vocab", c.vocab}, {"d_model", c.d_model}, {"n_layers", c.n_layers}, {"n_heads", c.n_heads},
                      {"d_ff", c.d_ff}, {"rotary_dims", c.rotary_dims}, {"max_seq", c.max_seq}, {"layer_norm_eps", c.layer_norm_eps}}},
          {"steps", o.steps}, {"warmup", o.warmup}, {"lr", o.lr}, {"schedule", "warmup_cosine"}, {"clip", o.clip},
          {"weight_decay", o.weight_decay}, {"batch", o.batch}, {"seq", o.seq}, {"seed", o.seed},
          {"dtype", std::string(dtype_name(o.dtype))}, {"micro_batches", o.micro_batches}, {"data", data},
          {"tokenizer", o.tokenizer.empty() ? std::string("bytes") : nax::io::file_checksum(o.tokenizer)}};
}

// A difference between the checkpoint's run (trainer.json's record, at `path`) and this one is an
// error naming the field, both values and the file; --allow-extend-steps lets --steps grow.
void check_resume(const TrainerState& saved, const nlohmann::json& now, const TrainOptions& o) {
  auto differs = [&](const std::string& field, const nlohmann::json& before, const nlohmann::json& value) {
    fail("train", "--resume: {} differs: the checkpoint's run has {}, this one {} ('{}', field 'run.{}'){}", field, before.dump(), value.dump(),
         saved.path, field, field == "steps" ? " (add --allow-extend-steps to stretch the schedule over more steps)" : "");
  };
  for (const auto& [field, value] : now.items()) {
    if (!saved.run.contains(field)) fail("train", "--resume: '{}' has no field 'run.{}' in its run record", saved.path, field);
    const auto& before = saved.run[field];
    if (before == value) continue;
    if (field == "steps" && o.allow_extend_steps && before.is_number_integer() && value.get<std::int64_t>() > before.get<std::int64_t>())
      continue;
    if (value.is_object() && before.is_object())  // the config: named by its field (this run's record is two levels deep)
      for (const auto& [key, part] : value.items())
        if (!before.contains(key) || before[key] != part) differs(field + "." + key, before.value(key, nlohmann::json()), part);
    differs(field, before, value);
  }
  if (saved.step >= o.steps)
    fail("train", "--resume: the checkpoint '{}' is at step {}, and --steps is {}: nothing left to run", saved.path, saved.step, o.steps);
}

// The step folder's config against the one this run builds (the vocabulary padded for this mesh
// included): the model resumed is the model saved.
void check_same_config(const Config& saved, const std::string& folder, const Config& now) {
  auto differ = [&](const char* field, const auto& a, const auto& b) {
    fail("train", "--resume: '{}/config.json' has {} {}, this run's config {}", folder, field, a, b);
  };
  if (saved.name != now.name) differ("nax_config", saved.name, now.name);
  if (saved.vocab != now.vocab) differ("vocab_size", saved.vocab, now.vocab);
  if (saved.d_model != now.d_model) differ("n_embd", saved.d_model, now.d_model);
  if (saved.n_layers != now.n_layers) differ("n_layer", saved.n_layers, now.n_layers);
  if (saved.n_heads != now.n_heads) differ("n_head", saved.n_heads, now.n_heads);
  if (saved.d_ff != now.d_ff) differ("n_inner", saved.d_ff, now.d_ff);
  if (saved.rotary_dims != now.rotary_dims) differ("rotary_dim", saved.rotary_dims, now.rotary_dims);
  if (saved.max_seq != now.max_seq) differ("n_positions", saved.max_seq, now.max_seq);
  if (saved.layer_norm_eps != now.layer_norm_eps) differ("layer_norm_epsilon", saved.layer_norm_eps, now.layer_norm_eps);
}

struct ResumePoint {
  std::optional<StepFiles> step;
  std::optional<ckpt::SafetensorsReader> optimizer;
};

// The newest committed checkpoint of `dir`, opened as every command opens a step folder, compared
// with this run (`run`, its run_record) before any work.
ResumePoint open_resume(const TrainOptions& o, const Config& config, const std::vector<nn::ParamSpec>& specs, const nlohmann::json& run) {
  const auto steps = ckpt::committed_steps(o.ckpt_dir);
  if (steps.empty()) fail("train", "--resume: '{}' holds no committed checkpoint (step_NNNNNN/)", o.ckpt_dir);
  ResumePoint r;
  const std::string folder = ckpt::step_folder(o.ckpt_dir, steps.back());
  r.step.emplace(open_step(folder, nonfinite_policy(o.allow_nonfinite)));
  if (r.step->config.name != config.name)
    fail("checkpoint", "'{}/config.json' was trained with config '{}' (field 'nax_config'), not '{}'", folder, r.step->config.name, config.name);
  check_resume(r.step->trainer, run, o);
  check_same_config(r.step->config, folder, config);
  expect_exactly(r.step->weights.file_of(specs.front().name), model_reads(specs));
  r.optimizer.emplace(folder + "/optimizer.safetensors", ckpt::ChecksumPolicy::verified, nonfinite_policy(o.allow_nonfinite));  // by open_step
  expect_exactly(*r.optimizer, optimizer_reads(specs));
  const auto& meta = r.optimizer->metadata();
  if (auto it = meta.find("adam_steps"); it == meta.end() || it->second != std::to_string(r.step->trainer.adam_steps))
    fail("checkpoint", "'{}': metadata adam_steps differs from '{}' field 'adam_steps' = {}", r.optimizer->path(), r.step->trainer.path,
         r.step->trainer.adam_steps);
  return r;
}

// Collective: device 0 writes (with `folder`), every device takes part in the gathers.
// Where the tensors of parameter `name` live: the pp stage holding it (every device without pp).
ckpt::HeldBy held_by(const Config& c, const Mesh& mesh, const std::string& name) {
  const int stages = pipeline_stages(mesh);
  return stages > 1 ? ckpt::HeldBy{"pp", stage_holding(c, stages, name)} : ckpt::HeldBy{};
}

void save_checkpoint(Shard& s, ckpt::RunFolder* folder, const Config& c, const nn::Parameters& params, const nn::AdamW& opt,
                     std::int64_t step, const TrainOptions& o, const nlohmann::json& run) {
  // Every parameter of the model, each from the pipeline stage that holds it (all of them without
  // pp): this stage's parameters are a subsequence of the model's, in its order.
  const auto specs = parameter_specs(c);
  const auto moments = opt.state();  // this stage's first moments, then its second moments
  std::vector<std::ptrdiff_t> mine(specs.size(), -1);  // the index of each parameter among this stage's
  for (std::size_t k = 0, next = 0; k < specs.size(); ++k)
    if (next < params.size() && params.specs()[next].name == specs[k].name) mine[k] = static_cast<std::ptrdiff_t>(next++);
  auto block = [&](std::size_t k, std::size_t offset, const std::vector<Tensor>& values) {
    return mine[k] < 0 ? Tensor() : values[offset + static_cast<std::size_t>(mine[k])];
  };
  std::vector<ckpt::ShardedTensor> model, state;
  for (std::size_t k = 0; k < specs.size(); ++k)
    model.push_back({specs[k].name, block(k, 0, params.values()), specs[k].global, hf_dims(specs[k].global), held_by(c, s.mesh(), specs[k].name)});
  for (std::size_t kind = 0; kind < 2; ++kind)
    for (std::size_t k = 0; k < specs.size(); ++k)
      state.push_back({fmt::format("{}.{}", kind == 0 ? "m" : "v", specs[k].name), block(k, kind * params.size(), moments), specs[k].global,
                       hf_dims(specs[k].global), held_by(c, s.mesh(), specs[k].name)});
  const std::string tmp = folder != nullptr ? folder->begin_step(step) : std::string();
  try {
    ckpt::save_sharded(s, tmp + "/model.safetensors", model, {{"format", "pt"}});
    ckpt::save_sharded(s, tmp + "/optimizer.safetensors", state, {{"adam_steps", std::to_string(opt.steps())}});
    if (folder == nullptr) return;
    write_file_atomically(tmp + "/config.json", hf_config_json(c));
    write_file_atomically(tmp + "/trainer.json", trainer_json(step, opt.steps(), run));
    folder->commit_step(tmp, step, o.keep);
  } catch (...) {
    if (folder != nullptr) {
      std::error_code ec;
      std::filesystem::remove_all(tmp, ec);  // the committed steps stay as they were
    }
    throw;
  }
}

// A value training cannot go on from: the run stops at `step` (0-based; reported 1-based as the
// progress line does) before anything of it is saved, so the newest checkpoint stays the last good one.
[[noreturn]] void stop_nonfinite(const char* what, double value, std::int64_t step, std::int64_t last_saved) {
  fail("train", "step {}: {} is {}: training stopped, nothing of this step saved ({})", step + 1, what, value,
       last_saved >= 0 ? fmt::format("the newest checkpoint, step {}, is the last good one", last_saved) : std::string("no checkpoint written"));
}

// A fresh run refuses a folder that holds anything but temporaries (another run's checkpoints
// would be mixed with this one's).
void check_fresh(const std::string& dir) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == ".lock" || name.find(".tmp.") != std::string::npos) continue;
    const auto steps = ckpt::committed_steps(dir);
    if (!steps.empty())
      fail("train", "'{}' already holds checkpoints (newest step {}): add --resume to continue that run, or choose another --ckpt-dir", dir,
           steps.back());
    fail("train", "--ckpt-dir '{}' is not empty (it holds '{}'): choose an empty or new folder", dir, name);
  }
}


}  // namespace

void check_options(const TrainOptions& o) {
  constexpr std::int64_t kBillion = 1'000'000'000;
  auto range = [](const char* flag, std::int64_t v, std::int64_t lo, std::int64_t hi) {
    if (v < lo || v > hi) fail("gptj", "{} must be in [{}, {}], got {}", flag, lo, hi, v);
  };
  range("--steps", o.steps, 1, kBillion);
  range("--batch", o.batch, 1, 1 << 24);
  range("--seq", o.seq, 1, 1 << 20);
  range("--warmup", o.warmup, 0, kBillion);
  range("--micro-batches", o.micro_batches, 1, 1 << 24);
  range("--save-every", o.save_every, 0, kBillion);
  range("--stop-after", o.stop_after, 0, kBillion);
  range("--eval-every", o.eval_every, 0, kBillion);
  range("--overlap-pieces", o.overlap_pieces, 1, 1 << 24);
  if (!(o.bucket_mb >= 0 && o.bucket_mb <= 1 << 20)) fail("gptj", "--bucket-mb must be in [0, {}], got {}", 1 << 20, o.bucket_mb);
  range("--keep", o.keep, 0, kBillion);
  if (static_cast<std::int64_t>(o.seed) < 0) fail("gptj", "--seed must be at least 0, got {}", static_cast<std::int64_t>(o.seed));
  if (!std::isfinite(o.lr) || o.lr <= 0 || o.lr > 10) fail("gptj", "--lr must be a finite number in (0, 10], got {}", o.lr);
  if (o.resume && o.ckpt_dir.empty()) fail("train", "--resume needs --ckpt-dir");
  if (o.allow_extend_steps && !o.resume) fail("train", "--allow-extend-steps goes with --resume");
  if (o.sharding != "hand" && o.sharding != "auto") fail("train", "--sharding expects hand or auto, got '{}'", o.sharding);
  if (o.dtype != DType::bf16 && o.dtype != DType::f32) fail("train", "--dtype expects bf16 or f32, got '{}'", dtype_name(o.dtype));
  if (o.remat && o.sharding != "hand") fail("train", "--remat needs --sharding hand (the global view has no checkpointing yet)");
  if (o.sequence_parallel && o.deterministic && o.sharding == "auto")
    fail("train", "--sequence-parallel --deterministic needs --sharding hand: the global view's placement of the sequence sums the "
         "LayerNorms' gradients over rows cut along seq, which the mode refuses; the hand-coded block makes those sums whole "
         "(docs/determinism.md)");
  if (o.deterministic && o.dtype == DType::bf16)
    fail("train", "--deterministic needs --dtype f32: bf16 rounds each device's partial sums before their psum, so the bits would "
         "depend on the mesh");
  parse_schedule(o.schedule);
  if (!o.metrics.empty()) io::check_writable(o.metrics, "--metrics");
}

void check_host_memory(const std::string& op, const std::string& what, double need) {
  const double have = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE)) * process_count();
  if (need > have) fail(op, "{} needs at least {:.1f} GB of memory, more than this machine's {:.1f} GB", what, need * 1e-9, have * 1e-9);
}

void check_memory(const Config& config, std::int64_t batch, std::int64_t seq) {
  check_host_memory("train", fmt::format("config {} at batch {} x seq {}", config.name, batch, seq), training_bytes_lower_bound(config, batch, seq));
}

// Deterministic mode with micro-batches: the global batch's rows reordered so that micro-batch m of
// the devices together is the global rows [m B/M, (m+1) B/M), in order, whatever dp (x fsdp) is (each device
// takes its micro-batches from its own contiguous block): the accumulated gradient is then the
// same sum of the same micro-batches on every mesh.
Tensor micro_major(const Tensor& batch, std::int64_t dp, std::int64_t micro) {
  if (micro == 1 || dp == 1) return batch;
  const std::int64_t rows = batch.size("batch"), row = batch.numel() / rows, n = rows / (dp * micro);
  const auto in = batch.to_vector<std::int32_t>();
  std::vector<std::int32_t> out(in.size());
  for (std::int64_t d = 0; d < dp; ++d)
    for (std::int64_t m = 0; m < micro; ++m)
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t to = d * (rows / dp) + m * n + i, from = m * (rows / micro) + d * n + i;
        std::copy_n(in.begin() + from * row, row, out.begin() + to * row);
      }
  return from_vector(batch.shape(), out, batch.dtype());
}

// Context parallelism: in zigzag order for ring attention; in deterministic mode the blocks are
// contiguous (the model gathers the sequence in every block, block.h).
Tensor device_tokens(Shard& s, const Tensor& tokens, const AxisRules& rules) {
  return s.shard(s.deterministic() ? tokens : zigzag_order(tokens, context_devices(s.mesh())), rules);
}

std::pair<Tensor, Tensor> device_batch(Shard& s, const TextData& data, const TrainOptions& o, const AxisRules& rules, std::int64_t step) {
  auto [inputs, targets] = data.batch(TextData::Split::train, step, o.batch, o.seq, o.seed);
  if (o.deterministic) {
    inputs = micro_major(inputs, data_parallel_devices(s.mesh()), o.micro_batches);
    targets = micro_major(targets, data_parallel_devices(s.mesh()), o.micro_batches);
  }
  return {device_tokens(s, inputs, rules), device_tokens(s, targets, rules)};
}

RuntimeOptions runtime_options(Backend backend, bool deterministic) {
  RuntimeOptions options;
  options.backend = backend;
  options.deterministic = deterministic;
  return options;
}

namespace {

// Everything a run decides before its devices start: the model's shape, where it starts from (a
// fresh init, --init-from's weights or --resume's checkpoint), the run folder it writes.
struct RunPlan {
  Mesh mesh;
  Config config;
  std::vector<nn::ParamSpec> specs;
  std::optional<ModelFiles> pretrained;
  std::optional<ckpt::RunFolder> folder;  // process 0 writes the checkpoints, holding the folder's lock
  nlohmann::json run;                     // run_record: compared on --resume
  ResumePoint resume;
};

Config config_of_run(const TrainOptions& o, const TextData& data, const Mesh& mesh, const std::optional<ModelFiles>& pretrained) {
  if (!pretrained) return with_vocab_at_least(padded_for(config_by_name(o.config), mesh), data.vocab_size(), mesh);
  if (data.vocab_size() > pretrained->config.vocab)
    fail("train", "--init-from '{}': the data's tokenizer has {} ids, more than the model's vocab_size {}", o.init_from, data.vocab_size(),
         pretrained->config.vocab);
  return pretrained->config;
}

}  // namespace

void check_run(const Config& config, const Mesh& mesh, const TrainOptions& o, const char* command) {
  check_fits(config, mesh, o.batch);
  check_sequence_layout(mesh, o.seq, o.sequence_parallel, o.deterministic, config);
  if (o.sharding == "auto" && !placed_automatically(mesh)) check_dp_mp_only(mesh, "--sharding auto (the global view)");
  if (pipeline_stages(mesh) > 1 && o.micro_batches < pipeline_stages(mesh) && !o.quiet && process_index() == 0)
    fmt::print(stderr, "gptj {}: --micro-batches {} on pp={}: the stages mostly wait (bubble {:.0f}%); use at least {} micro-batches\n",
               command, o.micro_batches, pipeline_stages(mesh),
               100 * bubble_fraction(timetable(parse_schedule(o.schedule), pipeline_stages(mesh), o.micro_batches)), pipeline_stages(mesh));
  check_memory(config, o.batch, o.seq);
  check_micro_batches(mesh, o.batch, o.micro_batches, command);
  if (o.seq > config.max_seq) fail(command, "--seq {} exceeds the config's maximum {}", o.seq, config.max_seq);
}

namespace {

void plan_run(RunPlan& plan, const TrainOptions& o, const TextData& data) {
  plan.mesh = model_mesh(o.mesh);
  if (!o.init_from.empty()) plan.pretrained.emplace(open_model(o.init_from, nonfinite_policy(o.allow_nonfinite)));
  plan.config = config_of_run(o, data, plan.mesh, plan.pretrained);
  const Config& config = plan.config;
  check_run(config, plan.mesh, o, "train");
  plan.specs = parameter_specs(config);
  if (!o.ckpt_dir.empty() && process_index() == 0) {
    plan.folder.emplace(o.ckpt_dir);
    if (!o.resume) check_fresh(o.ckpt_dir);
  }
  plan.run = run_record(o, plan.pretrained ? plan.pretrained->config : config_by_name(o.config));
  if (o.resume) plan.resume = open_resume(o, config, plan.specs, plan.run);
}

// The --metrics file, one JSON line per record, written by process 0 alone.
class MetricsLog {
 public:
  explicit MetricsLog(const TrainOptions& o) : path_(o.metrics) {
    if (path_.empty() || process_index() != 0) return;
    file_.open(path_, o.resume ? std::ios::app : std::ios::trunc);
    if (!file_) fail("train", "--metrics: cannot write '{}'", path_);
  }
  void write(const nlohmann::json& record) {
    if (!file_.is_open()) return;
    file_ << record.dump() << "\n";
  }
  void flush(std::int64_t step) {
    if (!file_.is_open()) return;
    file_.flush();
    if (!file_) fail("train", "--metrics: writing '{}' failed (at step {})", path_, step + 1);
  }

 private:
  std::string path_;
  std::ofstream file_;
};

// What one device communicated in a step: bytes per group of mesh axes, calls and bytes per
// collective kind, and the calls in all.
struct StepComm {
  nlohmann::json bytes = nlohmann::json::object(), kinds = nlohmann::json::object();
  std::size_t calls = 0;
};

StepComm comm_since(const Shard& s, const std::map<std::string, CommStats>& before) {
  StepComm c;
  for (const auto& [axes, stats] : s.comm_stats_since(before)) {
    c.bytes[axes] = total_bytes(stats);
    c.calls += total_calls(stats);
    for (int k = 0; k < kCollectiveKinds; ++k)
      if (const auto n = stats.calls[static_cast<std::size_t>(k)]; n > 0)
        c.kinds[axes][collective_name(static_cast<CollectiveKind>(k))] = {{"calls", n}, {"bytes", stats.bytes[static_cast<std::size_t>(k)]}};
  }
  return c;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// One device's run: the learner, the data it reads, what it has measured and saved.
class DeviceRun {
 public:
  DeviceRun(Shard& s, const TrainOptions& o, const TextData& data, RunPlan& plan, const AxisRules& rules)
      : s_(s), o_(o), data_(data), plan_(plan), rules_(rules), learner_(s, plan.config, rules, o) {}

  // The parameters and optimizer state the run starts from; returns the first step to run.
  std::int64_t restore() {
    Model& model = learner_.model();
    if (o_.resume) {  // one global tensor at a time, each device keeping its block
      const StepFiles& step = *plan_.resume.step;
      model.params().assign(stage_blocks(ckpt::load_sharded(s_, step.weights, held(model_reads(plan_.specs)), rules_, DType::f32)));
      learner_.optimizer().load_state(stage_blocks(ckpt::load_sharded(s_, *plan_.resume.optimizer, held(optimizer_reads(plan_.specs)), rules_)),
                                      step.trainer.adam_steps);
      return last_saved_ = step.trainer.step;
    }
    if (plan_.pretrained)
      model.params().assign(stage_blocks(ckpt::load_sharded(s_, plan_.pretrained->weights, held(model_reads(plan_.specs)), rules_, DType::f32)));
    return 0;
  }

  // Collective: the mean loss over --eval-batches held-out batches.
  double heldout_loss() {
    NoGrad no_grad;
    double total = 0;
    for (std::int64_t i = 0; i < o_.eval_batches; ++i) {
      auto [x, y] = data_.batch(TextData::Split::heldout, i, o_.batch, o_.seq, o_.seed);
      total += learner_.loss(device_tokens(s_, x, rules_), device_tokens(s_, y, rules_)).item();
    }
    return total / static_cast<double>(o_.eval_batches);
  }

  // The step's batch, this device's block of it.
  std::pair<Tensor, Tensor> batch(std::int64_t step) { return device_batch(s_, data_, o_, rules_, step); }

  Learner::StepStats step(std::int64_t step, double lr) {
    trace::Span span("step", "step", [&] { return fmt::format("\"step\": {}, \"sharding\": {}", step, trace::quote(o_.sharding)); });
    auto [x, y] = batch(step);
    auto stats = learner_.step(x, y, lr);
    if (!std::isfinite(stats.loss)) stop_nonfinite("the loss", stats.loss, step, last_saved_);  // the same on every device: all stop
    return stats;
  }

  // Collective: a checkpoint after `step` when --save-every or the run's end asks for one.
  void maybe_save(std::int64_t step, std::int64_t last, const Tensor& grad_norm) {
    if (o_.ckpt_dir.empty() || !((o_.save_every > 0 && (step + 1) % o_.save_every == 0) || step + 1 == last)) return;
    // A finite loss with a non-finite gradient has just made the weights non-finite.
    if (const double norm = grad_norm.item(); !std::isfinite(norm)) stop_nonfinite("the gradient norm", norm, step, last_saved_);
    ckpt::RunFolder* folder = s_.device() == 0 && plan_.folder ? &*plan_.folder : nullptr;
    save_checkpoint(s_, folder, plan_.config, learner_.model().params(), learner_.optimizer(), step + 1, o_, plan_.run);
    last_saved_ = step + 1;
  }

  const Timetable& schedule() const { return learner_.schedule(); }

  // Collective: the held-out loss after `step` when --eval-every asks for it.
  std::optional<double> maybe_evaluate(std::int64_t step) {
    if (o_.eval_every <= 0 || (step + 1) % o_.eval_every != 0) return std::nullopt;
    const double heldout = heldout_loss();
    if (!std::isfinite(heldout)) stop_nonfinite("the held-out loss", heldout, step, last_saved_);
    return heldout;
  }

 private:
  Shard& s_;
  const TrainOptions& o_;
  const TextData& data_;
  RunPlan& plan_;
  const AxisRules& rules_;
  Learner learner_;
  std::int64_t last_saved_ = -1;

  // With a pp axis each tensor is read by the stage that holds it ("m.NAME" and "v.NAME" by NAME's).
  // With a pp axis each tensor is read by the stage that holds its parameter (reads[i] is one of
  // parameter i % n's tensors: the model's, or m and v in turn).
  std::vector<ckpt::ShardedRead> held(std::vector<ckpt::ShardedRead> reads) const {
    for (std::size_t i = 0; i < reads.size(); ++i) reads[i].held_by = held_by(plan_.config, plan_.mesh, plan_.specs[i % plan_.specs.size()].name);
    return reads;
  }
  // The blocks this device read: its stage's, in the model's order.
  static std::vector<Tensor> stage_blocks(std::vector<Tensor> blocks) {
    std::erase_if(blocks, [](const Tensor& t) { return !t.defined(); });
    return blocks;
  }
};

}  // namespace

TrainResult train(const TrainOptions& o, const TextData& data) {
  check_options(o);
  RunPlan plan;
  plan_run(plan, o, data);
  const Config& config = plan.config;
  MetricsLog metrics(o);
  TrainResult result;
  result.peak_gflops = peak_gflops(o, plan.mesh.size());
  const double tokens_per_step = static_cast<double>(o.batch * o.seq);
  const double flops_per_step = flops_per_token(config, o.seq) * tokens_per_step;
  Runtime rt = Runtime::from_env(plan.mesh, runtime_options(o.backend, o.deterministic));  // one process per device under mpirun
  const AxisRules rules = axis_rules(plan.mesh);
  Progress progress(o.quiet || process_index() != 0, o.steps);
  progress.message(fmt::format("gptj train: config {} ({:.2f}M parameters), mesh {}, batch {} x seq {}, {} steps, {} compute, "
                               "peak {:.0f} GFLOP/s",
                               config.name, static_cast<double>(parameter_count(config)) * 1e-6, plan.mesh.str(), o.batch, o.seq, o.steps,
                               dtype_name(o.dtype), result.peak_gflops));

  rt.run([&](Shard& s) {
    const bool lead = s.device() == 0;  // device 0 reports; every device computes, evaluates and saves
    DeviceRun device(s, o, data, plan, rules);
    const std::int64_t first = device.restore();
    const double initial_heldout = plan.pretrained && !o.resume ? device.heldout_loss() : 0.0;
    std::vector<double> rates, forward, backward, optimizer, idle;
    const auto start = Clock::now();
    const std::int64_t last = o.stop_after > 0 ? std::min(o.stop_after, o.steps) : o.steps;
    for (std::int64_t step = first; step < last; ++step) {
      const auto t0 = Clock::now();
      const auto comm_before = s.comm_stats();
      const double lr = nn::warmup_cosine(step, o.warmup, o.steps, o.lr);
      const auto stats = device.step(step, lr);
      const double step_s = seconds_since(t0);
      const StepComm comm = comm_since(s, comm_before);
      const double tokens_per_s = tokens_per_step / step_s, mfu = flops_per_step / step_s / (result.peak_gflops * 1e9);
      if (step > first) {
        forward.push_back(stats.forward_s), backward.push_back(stats.backward_s), optimizer.push_back(stats.optimizer_s);
        if (stats.pipeline_s > 0) idle.push_back(1 - stats.pipeline_busy_s / stats.pipeline_s);
        rates.push_back(tokens_per_s);
      }
      const std::optional<double> heldout = device.maybe_evaluate(step);
      device.maybe_save(step, last, stats.grad_norm);
      if (!lead) continue;
      result.losses.push_back(stats.loss);
      result.collectives_per_step = static_cast<double>(comm.calls);
      for (const auto& [axes, bytes] : comm.bytes.items()) result.bytes_per_step[axes] = bytes.get<double>();
      const double eta = seconds_since(start) / static_cast<double>(step - first + 1) * static_cast<double>(o.steps - step - 1);
      progress.update(step, fmt::format("step {}/{} | loss {:.4f} | {:.0f} tok/s | MFU {:.1f}% | ETA {:.0f}s", step + 1, o.steps,
                                        stats.loss, tokens_per_s, 100 * mfu, eta));
      nlohmann::json record{{"step", step}, {"loss", stats.loss}, {"dtype", dtype_name(o.dtype)}, {"lr", lr}, {"grad_norm", stats.grad_norm.item()},
                            {"tokens_per_s", tokens_per_s}, {"mfu", mfu}, {"step_s", step_s}, {"comm_bytes", comm.bytes},
                            {"comm", comm.kinds}, {"collectives", comm.calls}};
      if (stats.pipeline_s > 0) record["pipeline_idle"] = 1 - stats.pipeline_busy_s / stats.pipeline_s;  // device 0's share of the schedule
      metrics.write(record);
      if (heldout) {
        progress.message(fmt::format("step {}: held-out loss {:.4f}", step + 1, *heldout));
        metrics.write({{"step", step}, {"heldout_loss", *heldout}});
      }
      metrics.flush(step);
    }
    const double final_heldout = device.heldout_loss();
    if (!lead) return;
    result.initial_heldout_loss = initial_heldout;
    result.heldout_loss = final_heldout;
    result.peak_bytes = s.memory().peak_bytes_in_use;
    result.forward_s = median(forward), result.backward_s = median(backward), result.optimizer_s = median(optimizer);
    result.tokens_per_s = median(rates);
    result.measured_bubble = median(idle);
    if (pipeline_stages(plan.mesh) > 1) {
      const Timetable& t = device.schedule();
      result.bubble = bubble_fraction(t), result.in_flight = most_in_flight(t);
    }
    result.mfu = flops_per_token(config, o.seq) * result.tokens_per_s / (result.peak_gflops * 1e9);
  });
  return result;
}

}  // namespace gptj
