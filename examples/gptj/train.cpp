#include "train.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
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

struct Checkpoint {
  std::vector<Tensor> params, adam;  // global host tensors
  std::int64_t step = 0, adam_steps = 0;
};

void save_checkpoint(Shard& s, const std::string& dir, const Config& c, const nn::Parameters& params, const nn::AdamW& opt,
                     std::int64_t step, const TrainOptions& o) {
  const NamedTensors model = gather_hf_parameters(s, params);
  NamedTensors state;
  const auto& specs = params.specs();
  auto moments = opt.state();
  for (std::size_t i = 0; i < moments.size(); ++i)
    state.push_back({fmt::format("{}.{}", i < specs.size() ? "m" : "v", specs[i % specs.size()].name), to_hf_layout(s.gather(moments[i]))});
  if (s.device() != 0) return;
  std::filesystem::create_directories(dir);
  save_safetensors(dir + "/model.safetensors", model, {{"format", "pt"}});
  save_safetensors(dir + "/optimizer.safetensors", state, {{"adam_steps", std::to_string(opt.steps())}});
  write_file_atomically(dir + "/config.json", hf_config_json(c));
  nlohmann::json trainer = {{"step", step}, {"seed", o.seed}, {"batch", o.batch}, {"seq", o.seq}, {"config", c.name}};
  write_file_atomically(dir + "/trainer.json", trainer.dump(2) + "\n");
}

Checkpoint load_checkpoint(const std::string& dir, const Config& c, const std::vector<nn::ParamSpec>& specs) {
  Checkpoint ck;
  auto trainer = nlohmann::json::parse(read_file(dir + "/trainer.json"), nullptr, false);
  if (trainer.is_discarded() || !trainer.contains("step")) fail("checkpoint", "'{}/trainer.json' is corrupt", dir);
  if (trainer.value("config", std::string()) != c.name)
    fail("checkpoint", "'{}' was trained with config '{}', not '{}'", dir, trainer.value("config", std::string("?")), c.name);
  ck.step = trainer["step"].get<std::int64_t>();
  const auto model = load_safetensors(dir + "/model.safetensors");
  std::map<std::string, std::string> meta;
  const auto state = load_safetensors(dir + "/optimizer.safetensors", &meta);
  ck.adam_steps = std::stoll(meta.at("adam_steps"));
  for (const auto& spec : specs) ck.params.push_back(from_hf_layout(model, spec.name, spec.global, dir + "/model.safetensors"));
  for (const char* kind : {"m", "v"})
    for (const auto& spec : specs)
      ck.adam.push_back(from_hf_layout(state, fmt::format("{}.{}", kind, spec.name), spec.global, dir + "/optimizer.safetensors"));
  return ck;
}


}  // namespace

RuntimeOptions runtime_options(Backend backend) {
  RuntimeOptions options;
  options.backend = backend;
  return options;
}

TrainResult train(const TrainOptions& o, const TextData& data) {
  const Mesh mesh = Mesh::parse(o.mesh);
  const Config config = with_vocab_at_least(padded_for(config_by_name(o.config), mesh), data.vocab_size(), mesh);
  check_fits(config, mesh, o.batch);
  check_sharding(o.sharding);
  check_compute_dtype(o.dtype);
  if (o.micro_batches < 1 || (o.batch / mesh.axis_size("dp")) % o.micro_batches != 0)
    fail("train", "--micro-batches {} does not divide the per-device batch {}", o.micro_batches, o.batch / mesh.axis_size("dp"));
  if (o.seq > config.max_seq) fail("train", "--seq {} exceeds the config's maximum {}", o.seq, config.max_seq);
  const auto specs = parameter_specs(config);
  Checkpoint resume;
  if (o.resume) {
    if (o.ckpt_dir.empty()) fail("train", "--resume needs --ckpt-dir");
    resume = load_checkpoint(o.ckpt_dir, config, specs);
  }
  std::ofstream metrics;
  const bool lead_process = process_index() == 0;  // under mpirun, process 0 alone reports and writes
  if (!o.metrics.empty() && lead_process) {
    metrics.open(o.metrics, o.resume ? std::ios::app : std::ios::trunc);
    if (!metrics) fail("train", "cannot write metrics to '{}'", o.metrics);
  }

  TrainResult result;
  result.peak_gflops = peak_gflops(o, mesh.size());
  const double flops_per_step = flops_per_token(config, o.seq) * static_cast<double>(o.batch * o.seq);
  Runtime rt = Runtime::from_env(mesh, runtime_options(o.backend));  // one process per device under mpirun, threads otherwise
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
    if (o.resume) {
      std::vector<Tensor> values, moments;
      for (const auto& p : resume.params) values.push_back(s.shard(p, rules));
      for (const auto& m : resume.adam) moments.push_back(s.shard(m, rules));
      model.params().assign(values);
      opt.load_state(moments, resume.adam_steps);
      first = resume.step;
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
    std::vector<double> rates, forward, backward, optimizer;
    const auto start = Clock::now();
    const std::int64_t last = o.stop_after > 0 ? std::min(o.stop_after, o.steps) : o.steps;
    for (std::int64_t step = first; step < last; ++step) {
      const auto t0 = Clock::now();
      const auto comm_before = s.comm_stats();
      const double lr = nn::warmup_cosine(step, o.warmup, o.steps, o.lr);
      trace::Span step_span("step", "step", [&] { return fmt::format("\"step\": {}, \"sharding\": {}", step, trace::quote(o.sharding)); });
      auto [inputs, targets] = data.batch(TextData::Split::train, step, o.batch, o.seq, o.seed);
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
        save_checkpoint(s, o.ckpt_dir, config, model.params(), opt, step + 1, o);
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
