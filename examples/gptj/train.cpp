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

#include "checkpoint.h"
#include "learner.h"
#include "progress.h"

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
  const Config c = o.init_from.empty() ? config_by_name(o.config) : open_model(o.init_from).config;
  nlohmann::json data = nlohmann::json::array();
  for (const auto& path : o.data) {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(path, ec);
    if (ec) fail("train", "--data '{}': {}", path, ec.message());
    data.push_back({{"bytes", bytes}, {"checksum", ckpt::file_checksum(path)}});
  }
  return {{"config", {{"name", c.name}, {"vocab", c.vocab}, {"d_model", c.d_model}, {"n_layers", c.n_layers}, {"n_heads", c.n_heads},
                      {"d_ff", c.d_ff}, {"rotary_dims", c.rotary_dims}, {"max_seq", c.max_seq}, {"layer_norm_eps", c.layer_norm_eps}}},
          {"steps", o.steps}, {"warmup", o.warmup}, {"lr", o.lr}, {"schedule", "warmup_cosine"}, {"clip", o.clip},
          {"weight_decay", o.weight_decay}, {"batch", o.batch}, {"seq", o.seq}, {"seed", o.seed},
          {"dtype", std::string(dtype_name(o.dtype))}, {"micro_batches", o.micro_batches}, {"data", data},
          {"tokenizer", o.tokenizer.empty() ? std::string("bytes") : ckpt::file_checksum(o.tokenizer)}};
}

// A difference between the checkpoint's run and this one is an error naming the field and both
// values; --allow-extend-steps lets --steps grow.
void check_resume(const nlohmann::json& saved, const nlohmann::json& now, const TrainOptions& o, std::int64_t step, const std::string& path) {
  for (const auto& [field, value] : now.items()) {
    if (!saved.contains(field)) fail("train", "--resume: '{}' has no field '{}' in its run record", path, field);
    const auto& before = saved[field];
    if (before == value) continue;
    if (field == "steps" && o.allow_extend_steps && before.is_number_integer() && value.get<std::int64_t>() > before.get<std::int64_t>())
      continue;
    fail("train", "--resume: {} differs: the checkpoint's run has {}, this one {}{}", field, before.dump(), value.dump(),
         field == "steps" ? " (add --allow-extend-steps to stretch the schedule over more steps)" : "");
  }
  if (step >= o.steps) fail("train", "--resume: the checkpoint '{}' is at step {}, and --steps is {}: nothing left to run", path, step, o.steps);
}

struct ResumePoint {
  std::string folder;
  TrainerState trainer;
  std::optional<ckpt::SafetensorsReader> model, optimizer;
};

// The newest committed checkpoint of `dir`, verified and compared with this run (`run`, its
// run_record) before any work.
ResumePoint open_resume(const TrainOptions& o, const Config& config, const std::vector<nn::ParamSpec>& specs, const nlohmann::json& run) {
  const auto steps = ckpt::committed_steps(o.ckpt_dir);
  if (steps.empty()) fail("train", "--resume: '{}' holds no committed checkpoint (step_NNNNNN/)", o.ckpt_dir);
  ResumePoint r;
  r.folder = ckpt::step_folder(o.ckpt_dir, steps.back());
  ckpt::verify_step_folder(r.folder);
  const std::string config_path = r.folder + "/config.json", trainer_path = r.folder + "/trainer.json";
  const Config saved = config_from_json(read_file(config_path), config_path);
  if (saved.name != config.name) fail("checkpoint", "'{}' was trained with config '{}', not '{}'", r.folder, saved.name, config.name);
  r.trainer = trainer_state_from_json(read_file(trainer_path), trainer_path);
  if (r.trainer.step != steps.back()) fail("checkpoint", "'{}': field 'step' is {}, the folder's name says {}", trainer_path, r.trainer.step, steps.back());
  check_resume(r.trainer.run, run, o, r.trainer.step, r.folder);
  r.model.emplace(r.folder + "/model.safetensors");
  expect_exactly(*r.model, model_reads(specs));
  r.optimizer.emplace(r.folder + "/optimizer.safetensors");
  expect_exactly(*r.optimizer, optimizer_reads(specs));
  const auto& meta = r.optimizer->metadata();
  if (auto it = meta.find("adam_steps"); it == meta.end() || it->second != std::to_string(r.trainer.adam_steps))
    fail("checkpoint", "'{}': metadata adam_steps differs from trainer.json's {}", r.optimizer->path(), r.trainer.adam_steps);
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
}

void check_memory(const Config& config, std::int64_t batch, std::int64_t seq) {
  const double need = training_bytes_lower_bound(config, batch, seq);
  const double have = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE)) * process_count();
  if (need > have)
    fail("train", "config {} at batch {} x seq {} needs at least {:.1f} GB (parameters, gradients, AdamW state and activations), "
         "more than this machine's {:.1f} GB of memory",
         config.name, batch, seq, need * 1e-9, have * 1e-9);
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
  if (!o.init_from.empty()) pretrained.emplace(open_model(o.init_from));
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
    if (!metrics) fail("train", "cannot write metrics to '{}'", o.metrics);
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
    std::int64_t first = 0;
    if (o.resume) {  // one global tensor at a time, each device keeping its block
      model.params().assign(ckpt::load_sharded(s, *resume.model, model_reads(specs), rules));
      opt.load_state(ckpt::load_sharded(s, *resume.optimizer, optimizer_reads(specs), rules), resume.trainer.adam_steps);
      first = resume.trainer.step;
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
      if (!o.ckpt_dir.empty() && ((o.save_every > 0 && (step + 1) % o.save_every == 0) || step + 1 == last))
        save_checkpoint(s, lead && folder ? &*folder : nullptr, config, model.params(), opt, step + 1, o, run);
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
