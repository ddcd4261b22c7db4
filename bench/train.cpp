// Training throughput of the GPT-J example: tokens/s and MFU (PaLM's 6N + 12 L H Q T FLOPs per
// token) of one config on several meshes of simulated devices, with the machine's GEMM peak in the run's dtype
// measured in the same run. Goals on 2 cores: 1x2 and 2x1 reach >= 1.6x the tokens/s of 1x1, and
// MFU at 1x1 is >= 50% of the measured GEMM rate (sgemm, or the bf16 GEMM with --dtype bf16). With --backend cuda the devices are GPUs
// (virtual ones when the mesh has more devices than GPUs) and MFU is against the GPU's datasheet
// peak (989 TFLOP/s dense bf16 on H100/H200; goal for 1.3b at seq 2048 in bf16: >= 40%).
//
//   build/bin/bench_train [--config small] [--meshes dp=1,mp=1;dp=1,mp=2;...] [--steps N] [--json FILE]
//                         [--backend cpu|cuda] [--dtype f32|bf16] [--batch B] [--seq T] [--trace FILE] [--remat] [--zero]
//                         [--sequence-parallel] [--micro-batches M] [--schedule 1f1b|gpipe]
// On meshes with pp (--micro-batches M, --schedule) it also prints the schedule's bubble and device 0's
// measured idle fraction of it.
// --trace FILE writes each mesh's timeline (nax/trace/trace.h): FILE itself for one mesh, else FILE with
// the mesh before the extension (run.json -> run.dp=1_mp=2.json). --modes default,deterministic
// runs each mesh in both modes one after the other (RuntimeOptions::deterministic,
// docs/determinism.md) and prints the deterministic mode's tokens/s as a ratio of the default's.
#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "bench_util.h"
#include "learner.h"
#include "train.h"

int main(int argc, char** argv) {
  try {
    std::string config = "small", json_path, trace_path;
    std::vector<std::string> meshes = {"dp=1,mp=1", "dp=1,mp=2", "dp=2,mp=1", "dp=2,mp=2"};
    std::int64_t steps = 8, batch = 8, seq = 128;
    nax::Backend backend = nax::Backend::cpu;
    nax::DType dtype = nax::DType::f32;
    bool remat = false, zero = false, sequence_parallel = false;
    std::int64_t micro_batches = 1;
    std::string schedule = "1f1b";
    std::vector<std::string> modes = {"default"};
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        fmt::print("usage: bench_train [--config small] [--meshes 'dp=1,mp=1;dp=2,mp=2'] [--steps N] [--batch B] [--seq T] [--json FILE]\n"
                   "                   [--backend cpu|cuda] [--dtype f32|bf16] [--trace FILE] [--remat] [--zero]\n"
                   "                   [--sequence-parallel] [--micro-batches M] [--schedule 1f1b|gpipe] [--modes default,deterministic]\n");
        return 0;
      }
      if (arg == "--config") config = bench::flag_value(argc, argv, i);
      else if (arg == "--meshes") {
        meshes.clear();
        std::string list = bench::flag_value(argc, argv, i);
        for (std::size_t b = 0; b <= list.size();) {
          std::size_t e = std::min(list.find(';', b), list.size());
          meshes.push_back(list.substr(b, e - b));
          b = e + 1;
        }
      } else if (arg == "--steps") steps = bench::parse_integer(bench::flag_value(argc, argv, i), "--steps");
      else if (arg == "--batch") batch = bench::parse_integer(bench::flag_value(argc, argv, i), "--batch");
      else if (arg == "--seq") seq = bench::parse_integer(bench::flag_value(argc, argv, i), "--seq");
      else if (arg == "--json") json_path = bench::flag_value(argc, argv, i);
      else if (arg == "--trace") trace_path = bench::flag_value(argc, argv, i);
      else if (arg == "--backend") backend = nax::parse_backend(bench::flag_value(argc, argv, i));
      else if (arg == "--dtype") dtype = gptj::parse_compute_dtype(bench::flag_value(argc, argv, i));
      else if (arg == "--modes") {
        modes.clear();
        std::string list = bench::flag_value(argc, argv, i);
        for (std::size_t b = 0; b <= list.size();) {
          std::size_t e = std::min(list.find(',', b), list.size());
          modes.push_back(list.substr(b, e - b));
          if (modes.back() != "default" && modes.back() != "deterministic")
            nax::fail("bench_train", "--modes takes default and/or deterministic, got '{}'", modes.back());
          b = e + 1;
        }
      } else if (arg == "--remat") remat = true;
      else if (arg == "--zero") zero = true;
      else if (arg == "--sequence-parallel") sequence_parallel = true;
      else if (arg == "--micro-batches") micro_batches = bench::parse_integer(bench::flag_value(argc, argv, i), "--micro-batches");
      else if (arg == "--schedule") schedule = bench::flag_value(argc, argv, i);
      else nax::fail("bench_train", "unknown argument '{}' (try --help)", arg);
    }
    std::string text;
    for (int i = 0; i < 2000; ++i) text += fmt::format("sentence {} of the benchmark text, with some words to learn.\n", i);
    const auto data = gptj::TextData::from_text(text);

    fmt::print("{:<12} {:<14} {:>10} {:>8} {:>10} {:>8} {:>12}\n", "mesh", "mode", "tokens/s", "vs 1x1", "MFU", "loss", "peak GF/s");
    std::vector<bench::JsonObject> rows;
    double base = 0;
    for (const auto& mesh : meshes) {
      double default_tokens_per_s = 0;
      for (const auto& mode : modes) {
        gptj::TrainOptions o;
        o.deterministic = mode == "deterministic";
        o.config = config, o.mesh = mesh, o.steps = steps, o.batch = batch, o.seq = seq, o.eval_every = 0, o.eval_batches = 1, o.quiet = true;
        o.backend = backend, o.dtype = dtype, o.warmup = std::min<std::int64_t>(o.warmup, steps);
        o.remat = remat, o.zero = zero, o.sequence_parallel = sequence_parallel, o.micro_batches = micro_batches, o.schedule = schedule;
        std::string mesh_trace = trace_path;
        if (!trace_path.empty() && meshes.size() > 1) {
          std::string tag = mesh;
          std::replace(tag.begin(), tag.end(), ',', '_');
          const std::size_t dot = trace_path.find_last_of('.'), slash = trace_path.find_last_of('/');
          const bool extension = dot != std::string::npos && (slash == std::string::npos || dot > slash);
          mesh_trace = extension ? fmt::format("{}.{}{}", trace_path.substr(0, dot), tag, trace_path.substr(dot)) : trace_path + "." + tag;
        }
        const nax::trace::Scope trace(mesh_trace, "bench_train " + mesh);
        o.time_phases = true;  // a queue drain at each phase boundary: microseconds against steps of 100s of ms
        auto r = gptj::train(o, data);
        if (base == 0) base = r.tokens_per_s;
        if (mode == "default") default_tokens_per_s = r.tokens_per_s;
        const std::string ratio = mode == "deterministic" && default_tokens_per_s > 0
                                      ? fmt::format(" ({:.2f}x of default)", r.tokens_per_s / default_tokens_per_s)
                                      : "";
        fmt::print("{:<12} {:<14} {:>10.0f} {:>7.2f}x {:>9.1f}% {:>8.4f} {:>12.0f}{}\n", mesh, mode, r.tokens_per_s, r.tokens_per_s / base,
                   100 * r.mfu, r.losses.back(), r.peak_gflops, ratio);
        rows.push_back(bench::JsonObject()
                           .add("mesh", mesh)
                           .add("mode", mode)
                           .add("config", config)
                           .add("backend", std::string(nax::backend_name(backend)))
                           .add("dtype", std::string(nax::dtype_name(dtype)))
                           .add("remat", remat)
                           .add("zero", zero)
                           .add("sequence_parallel", sequence_parallel)
                           .add("micro_batches", static_cast<double>(micro_batches))
                           .add("schedule", schedule)
                           .add("bubble", r.bubble)
                           .add("measured_bubble", r.measured_bubble)
                           .add("batch", static_cast<double>(batch))
                           .add("seq", static_cast<double>(seq))
                           .add("tokens_per_s", r.tokens_per_s)
                           .add("speedup_vs_first", r.tokens_per_s / base)
                           .add("mfu", r.mfu)
                           .add("peak_gflops", r.peak_gflops)
                           .add("final_loss", r.losses.back())
                           .add("first_loss", r.losses.front())
                           .add("peak_device_bytes", static_cast<double>(r.peak_bytes))
                           .add("forward_s", r.forward_s)
                           .add("backward_s", r.backward_s)
                           .add("optimizer_s", r.optimizer_s));
        fmt::print("{:<12} peak memory {:.2f} GiB; per step: forward {:.3f} s, backward {:.3f} s, optimizer {:.3f} s\n", "",
                   static_cast<double>(r.peak_bytes) / (1 << 30), r.forward_s, r.backward_s, r.optimizer_s);
        if (r.in_flight > 0)
          fmt::print("{:<12} pipeline {} over {} micro-batches: bubble {:.1f}% of stage-ticks, device 0 idle {:.1f}% of the schedule\n", "",
                     schedule, micro_batches, 100 * r.bubble, 100 * r.measured_bubble);
      }
    }
    if (backend == nax::Backend::cpu)
      fmt::print("MFU is against the one-thread sgemm rate times min(devices, {} cores); goals: 1x2 and 2x1 >= 1.6x of 1x1, MFU at 1x1 >= 50%\n",
                 std::max(1u, std::thread::hardware_concurrency()));
    else
      fmt::print("MFU is against the datasheet peak of the GPUs in use ({:.0f} TFLOP/s each in {}); goal: 1.3b at seq 2048 in bf16 >= 40%\n",
                 gptj::gpu_peak_flops(dtype) * 1e-12, nax::dtype_name(dtype));
    if (!json_path.empty()) bench::write_text_file(json_path, bench::json_array(rows) + "\n");
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
