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

// The mesh's f32 GEMM peak in GFLOP/s: one thread's sgemm rate on 1024^3 (a simulated device is
// one thread) times the devices that can run at once (at most the cores).
double measure_peak_gflops(int devices) {
  const bool tracing = trace::enabled();  // a calibration on a runtime of its own: not part of the run's timeline
  trace::stop();
  Runtime rt = Runtime::local(Mesh::parse("x=1"), {.blas_threads = 1});
  double best = 0;
  rt.run([&](Shard&) {
    Tensor a = random_normal(Shape{{"m", 1024}, {"k", 1024}}, 1, "a"), b = random_normal(Shape{{"k", 1024}, {"n", 1024}}, 1, "b");
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
  if (o.backend == Backend::cpu) return measure_peak_gflops(devices);
  const int gpus = std::max(1, std::min(devices, cuda_gpu_count()));
  return gpus * gpu_peak_flops(o.dtype) * 1e-9;
}

namespace ckpt = nax::checkpoint;

// What defines a run's trajectory, stored in every checkpoint and compared on --resume. The mesh
// and the sharding are not in it: a checkpoint resumes on any mesh.
nlohmann::json run_record(const TrainOptions& o) {
  // unpadded: the padding follows the mesh
  const Config c = o.init_from.empty() ? config_by_name(o.config) : open_model(o.init_from, nonfinite_policy(o.allow_nonfinite)).config;
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
  r.optimizer.emplace(folder + "/optimizer.safetensors", ckpt::ChecksumPolicy::required, nonfinite_policy(o.allow_nonfinite));
  expect_exactly(*r.optimizer, optimizer_reads(specs));
  const auto& meta = r.optimizer->metadata();
  if (auto it = meta.find("adam_steps"); it == meta.end() || it->second != std::to_string(r.step->trainer.adam_steps))
    fail("checkpoint", "'{}': metadata adam_steps differs from '{}' field 'adam_steps' = {}", r.optimizer->path(), r.step->trainer.path,
         r.step->trainer.adam_steps);
  return r;
}

// Collective: device 0 writes (with `folder`), every device takes part in the gathers.
void save_checkpoint(Shard& s, ckpt::RunFolder* folder, const Config& c, const nn::Parameters& params, const nn::AdamW& opt,
                     std::int64_t step, const TrainOptions& o, const nlohmann::json& run) {
  std::vector<ckpt::ShardedTensor> model, state;
  const auto& specs = params.specs();
  for (std::size_t i = 0; i < specs.size(); ++i) model.push_back({specs[i].name, params[i], specs[i].global, hf_dims(specs[i].global)});
  const auto moments = opt.state();
  for (std::size_t i = 0; i < moments.size(); ++i) {
    const auto& spec = specs[i % specs.size()];
    state.push_back({fmt::format("{}.{}", i < specs.size() ? "m" : "v", spec.name), moments[i], spec.global, hf_dims(spec.global)});
  }
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
  range("--keep", o.keep, 0, kBillion);
  if (static_cast<std::int64_t>(o.seed) < 0) fail("gptj", "--seed must be at least 0, got {}", static_cast<std::int64_t>(o.seed));
  if (!std::isfinite(o.lr) || o.lr <= 0 || o.lr > 10) fail("gptj", "--lr must be a finite number in (0, 10], got {}", o.lr);
  if (o.resume && o.ckpt_dir.empty()) fail("train", "--resume needs --ckpt-dir");
  if (o.allow_extend_steps && !o.resume) fail("train", "--allow-extend-steps goes with --resume");
  if (o.remat && o.sharding != "hand") fail("train", "--remat needs --sharding hand (the global view has no checkpointing yet)");
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
// the devices together is the global rows [m B/M, (m+1) B/M), in order, whatever dp is (each device
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

// What --deterministic cannot make mesh-independent is refused, naming the flag.
void check_deterministic(const TrainOptions& o) {
  if (!o.deterministic) return;
  if (o.dtype == DType::bf16)
    fail("train", "--deterministic needs --dtype f32: bf16 rounds each device's partial sums before their psum, so the bits would "
         "depend on the mesh");
}

RuntimeOptions runtime_options(Backend backend, bool deterministic) {
  RuntimeOptions options;
  options.backend = backend;
  options.deterministic = deterministic;
  return options;
}

TrainResult train(const TrainOptions& o, const TextData& data) {
  check_options(o);
  const Mesh mesh = Mesh::parse(o.mesh);
  std::optional<ModelFiles> pretrained;  // --init-from: its config and weights
  if (!o.init_from.empty()) pretrained.emplace(open_model(o.init_from, nonfinite_policy(o.allow_nonfinite)));
  if (pretrained && data.vocab_size() > pretrained->config.vocab)
    fail("train", "--init-from '{}': the data's tokenizer has {} ids, more than the model's vocab_size {}", o.init_from, data.vocab_size(),
         pretrained->config.vocab);
  const Config config =
      pretrained ? pretrained->config : with_vocab_at_least(padded_for(config_by_name(o.config), mesh), data.vocab_size(), mesh);
  check_fits(config, mesh, o.batch);
  check_memory(config, o.batch, o.seq);
  check_sharding(o.sharding);
  check_compute_dtype(o.dtype);
  if (o.micro_batches < 1 || (o.batch / mesh.axis_size("dp")) % o.micro_batches != 0)
    fail("train", "--micro-batches {} does not divide the per-device batch {}", o.micro_batches, o.batch / mesh.axis_size("dp"));
  if (o.seq > config.max_seq) fail("train", "--seq {} exceeds the config's maximum {}", o.seq, config.max_seq);
  check_deterministic(o);
  const auto specs = parameter_specs(config);
  if (o.resume && o.ckpt_dir.empty()) fail("train", "--resume needs --ckpt-dir");
  std::optional<ckpt::RunFolder> folder;  // process 0 writes the checkpoints, holding the folder's lock
  if (!o.ckpt_dir.empty() && process_index() == 0) {
    folder.emplace(o.ckpt_dir);
    if (!o.resume) check_fresh(o.ckpt_dir);
  }
  const nlohmann::json run = run_record(o);
  ResumePoint resume;
  if (o.resume) resume = open_resume(o, config, specs, run);
  std::ofstream metrics;
  const bool lead_process = process_index() == 0;  // under mpirun, process 0 alone reports and writes
  if (!o.metrics.empty() && lead_process) {
    metrics.open(o.metrics, o.resume ? std::ios::app : std::ios::trunc);
    if (!metrics) fail("train", "--metrics: cannot write '{}'", o.metrics);
  }

  TrainResult result;
  result.peak_gflops = peak_gflops(o, mesh.size());
  const double flops_per_step = flops_per_token(config, o.seq) * static_cast<double>(o.batch * o.seq);
  Runtime rt = Runtime::from_env(mesh, runtime_options(o.backend, o.deterministic));  // one process per device under mpirun, threads otherwise
  const AxisRules rules = axis_rules(mesh);
  Progress progress(o.quiet || !lead_process, o.steps);
  progress.message(fmt::format("gptj train: config {} ({:.2f}M parameters), mesh {}, batch {} x seq {}, {} steps, {} compute, "
                               "peak {:.0f} GFLOP/s",
                               config.name, static_cast<double>(parameter_count(config)) * 1e-6, mesh.str(), o.batch, o.seq, o.steps,
                               dtype_name(o.dtype), result.peak_gflops));

  rt.run([&](Shard& s) {
    const bool lead = s.device() == 0;
    Learner learner(s, config, rules, o);
    Model& model = learner.model();
    nn::AdamW& opt = learner.optimizer();
    std::int64_t first = 0, last_saved = -1;
    if (o.resume) {  // one global tensor at a time, each device keeping its block
      model.params().assign(ckpt::load_sharded(s, resume.step->weights, model_reads(specs), rules, DType::f32));
      opt.load_state(ckpt::load_sharded(s, *resume.optimizer, optimizer_reads(specs), rules), resume.step->trainer.adam_steps);
      first = last_saved = resume.step->trainer.step;
    } else if (pretrained) {
      model.params().assign(ckpt::load_sharded(s, pretrained->weights, model_reads(specs), rules, DType::f32));
    }
    auto heldout_loss = [&] {
      NoGrad no_grad;
      double total = 0;
      for (std::int64_t i = 0; i < o.eval_batches; ++i) {
        auto [x, y] = data.batch(TextData::Split::heldout, i, o.batch, o.seq, o.seed);
        total += learner.loss(s.shard(x, rules), s.shard(y, rules)).item();
      }
      return total / static_cast<double>(o.eval_batches);
    };
    const double initial_heldout = pretrained && !o.resume ? heldout_loss() : 0.0;
    if (lead) result.initial_heldout_loss = initial_heldout;
    std::vector<double> rates, forward, backward, optimizer;
    const auto start = Clock::now();
    const std::int64_t last = o.stop_after > 0 ? std::min(o.stop_after, o.steps) : o.steps;
    for (std::int64_t step = first; step < last; ++step) {
      const auto t0 = Clock::now();
      const auto comm_before = s.comm_stats();
      const double lr = nn::warmup_cosine(step, o.warmup, o.steps, o.lr);
      trace::Span step_span("step", "step", [&] { return fmt::format("\"step\": {}, \"sharding\": {}", step, trace::quote(o.sharding)); });
      auto [inputs, targets] = data.batch(TextData::Split::train, step, o.batch, o.seq, o.seed);
      if (o.deterministic) {
        inputs = micro_major(inputs, mesh.axis_size("dp"), o.micro_batches);
        targets = micro_major(targets, mesh.axis_size("dp"), o.micro_batches);
      }
      Tensor x = s.shard(inputs, rules), y = s.shard(targets, rules);
      const auto stats = learner.step(x, y, lr);
      const double loss = stats.loss;
      if (!std::isfinite(loss)) stop_nonfinite("the loss", loss, step, last_saved);  // the same on every device: all stop
      if (step > first) {
        forward.push_back(stats.forward_s), backward.push_back(stats.backward_s), optimizer.push_back(stats.optimizer_s);
      }
      const double step_s = seconds_since(t0);
      step_span.close();
      nlohmann::json comm_bytes = nlohmann::json::object(), comm_kinds = nlohmann::json::object();
      std::size_t calls = 0;
      for (const auto& [axes, step_stats] : s.comm_stats_since(comm_before)) {
        comm_bytes[axes] = total_bytes(step_stats);
        calls += total_calls(step_stats);
        for (int k = 0; k < kCollectiveKinds; ++k)
          if (const auto n = step_stats.calls[static_cast<std::size_t>(k)]; n > 0)
            comm_kinds[axes][collective_name(static_cast<CollectiveKind>(k))] = {{"calls", n}, {"bytes", step_stats.bytes[static_cast<std::size_t>(k)]}};
      }
      const double tokens_per_s = static_cast<double>(o.batch * o.seq) / step_s;
      const double mfu = flops_per_step / step_s / (result.peak_gflops * 1e9);
      if (step > first) rates.push_back(tokens_per_s);
      // Evaluation and checkpoints are collective: every device takes part, device 0 reports.
      const bool eval_now = o.eval_every > 0 && (step + 1) % o.eval_every == 0;
      const double heldout = eval_now ? heldout_loss() : 0.0;
      if (!std::isfinite(heldout)) stop_nonfinite("the held-out loss", heldout, step, last_saved);
      if (!o.ckpt_dir.empty() && ((o.save_every > 0 && (step + 1) % o.save_every == 0) || step + 1 == last)) {
        // A finite loss with a non-finite gradient has just made the weights non-finite.
        if (const double norm = stats.grad_norm.item(); !std::isfinite(norm)) stop_nonfinite("the gradient norm", norm, step, last_saved);
        save_checkpoint(s, lead && folder ? &*folder : nullptr, config, model.params(), opt, step + 1, o, run);
        last_saved = step + 1;
      }
      if (!lead) continue;
      result.losses.push_back(loss);
      result.collectives_per_step = static_cast<double>(calls);
      for (const auto& [axes, bytes] : comm_bytes.items()) result.bytes_per_step[axes] = bytes.get<double>();
      const double eta = seconds_since(start) / static_cast<double>(step - first + 1) * static_cast<double>(o.steps - step - 1);
      progress.update(step, fmt::format("step {}/{} | loss {:.4f} | {:.0f} tok/s | MFU {:.1f}% | ETA {:.0f}s", step + 1, o.steps, loss,
                                        tokens_per_s, 100 * mfu, eta));
      if (metrics)
        metrics << nlohmann::json{{"step", step}, {"loss", loss}, {"dtype", dtype_name(o.dtype)}, {"lr", lr}, {"grad_norm", stats.grad_norm.item()},
                                  {"tokens_per_s", tokens_per_s}, {"mfu", mfu}, {"step_s", step_s}, {"comm_bytes", comm_bytes},
                                  {"comm", comm_kinds}, {"collectives", calls}}.dump()
                << "\n";
      if (eval_now) {
        progress.message(fmt::format("step {}: held-out loss {:.4f}", step + 1, heldout));
        if (metrics) metrics << nlohmann::json{{"step", step}, {"heldout_loss", heldout}}.dump() << "\n";
      }
      metrics.flush();
      if (!o.metrics.empty() && !metrics) fail("train", "--metrics: writing '{}' failed (at step {})", o.metrics, step + 1);
    }
    const double final_heldout = heldout_loss();
    if (!lead) return;
    result.heldout_loss = final_heldout;
    result.peak_bytes = s.memory().peak_bytes_in_use;
    auto median = [](std::vector<double> v) {
      if (v.empty()) return 0.0;
      std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
      return v[v.size() / 2];
    };
    result.forward_s = median(forward), result.backward_s = median(backward), result.optimizer_s = median(optimizer);
    if (!rates.empty()) {
      std::nth_element(rates.begin(), rates.begin() + static_cast<std::ptrdiff_t>(rates.size() / 2), rates.end());
      result.tokens_per_s = rates[rates.size() / 2];
      result.mfu = flops_per_token(config, o.seq) * result.tokens_per_s / (result.peak_gflops * 1e9);
    }
  });
  return result;
}

}  // namespace gptj
