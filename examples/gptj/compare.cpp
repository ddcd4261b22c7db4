#include "compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <nax/io/json.h>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "export.h"
#include "learner.h"
#include "progress.h"

#ifndef NAX_SOURCE_DIR
#define NAX_SOURCE_DIR "."
#endif

namespace gptj {

using namespace nax;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Bytes held by a learner between steps: parameters and optimizer moments.
std::size_t resident_bytes(Learner& l) {
  std::size_t bytes = 0;
  for (const auto& p : l.model().params().values()) bytes += p.nbytes();
  return bytes + l.optimizer().state_bytes();
}

// What one learner saw: its losses, step times, last step's communication and its peak memory.
struct Track {
  std::vector<double> losses, step_s, pipeline_idle;
  std::map<std::string, CommStats> last_comm;
  std::size_t peak = 0;
};

// `other`: the learner compared with, whose parameters and moments are not this one's peak (null
// when the hand-coded model runs alone).
void step_and_track(Shard& s, Learner& learner, Learner* other, Track& track, const Tensor& x, const Tensor& y, double lr,
                    std::int64_t step) {
  const std::size_t others = other != nullptr ? resident_bytes(*other) : 0;
  s.device_ptr()->allocator().reset_peak();
  const auto comm_before = s.comm_stats();
  const auto t0 = Clock::now();
  trace::Span step_span("step", "step", [&] {
    return fmt::format("\"step\": {}, \"sharding\": {}", step, trace::quote(learner.sharding()));
  });
  const auto stats = learner.step(x, y, lr);
  step_span.close();
  track.step_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  track.last_comm = s.comm_stats_since(comm_before);
  track.losses.push_back(stats.loss);
  if (stats.pipeline_s > 0) track.pipeline_idle.push_back(1 - stats.pipeline_busy_s / stats.pipeline_s);
  const std::size_t peak = s.memory().peak_bytes_in_use;
  track.peak = std::max(track.peak, peak > others ? peak - others : 0);
}

CompareRow row_of(const std::string& sharding, const Track& t, const CompareOptions& o) {
  CompareRow row;
  row.sharding = sharding;
  row.losses = t.losses;
  row.first_loss = t.losses.front();
  row.final_loss = t.losses.back();
  std::vector<double> timed(t.step_s.begin() + std::min<std::ptrdiff_t>(o.timing_skip, static_cast<std::ptrdiff_t>(t.step_s.size()) - 1),
                            t.step_s.end());
  row.tokens_per_s = static_cast<double>(o.train.batch * o.train.seq) / median(timed);
  for (const auto& [axes, stats] : t.last_comm) {
    if (total_calls(stats) == 0) continue;  // a group that did not communicate in that step
    row.comm_per_step[axes] = stats;
    row.bytes_by_axes[axes] = static_cast<double>(total_bytes(stats));
    row.bytes_per_step += static_cast<double>(total_bytes(stats));
    row.collectives_per_step += static_cast<double>(total_calls(stats));
  }
  row.peak_bytes = t.peak;
  const Mesh mesh = model_mesh(o.train.mesh);
  if (pipeline_stages(mesh) > 1) {
    row.bubble = bubble_fraction(timetable(parse_schedule(o.train.schedule), pipeline_stages(mesh), o.train.micro_batches));
    const auto skip = std::min<std::ptrdiff_t>(o.timing_skip, static_cast<std::ptrdiff_t>(t.pipeline_idle.size()) - 1);
    row.pipeline_idle = median(std::vector<double>(t.pipeline_idle.begin() + std::max<std::ptrdiff_t>(skip, 0), t.pipeline_idle.end()));
  }
  return row;
}

// bench/jax_baseline.py on the same run, through scripts/jax_baseline.sh; nullopt when JAX is
// missing (the script says why).
std::optional<CompareRow> run_jax(const CompareOptions& o, const TextData& data, double expected_first_loss) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("nax_compare_jax_{}", ::getpid());
  std::filesystem::remove_all(dir);
  export_run({o.train, dir.string()}, data);
  const std::string json = (dir / "jax.json").string();
  const std::string command =
      fmt::format("bash '{}/scripts/jax_baseline.sh' {} --export '{}' --mesh '{}' --steps {} --json '{}' --expect-loss {:.17g}", NAX_SOURCE_DIR,
                  o.install_jax ? "--install" : "", dir.string(), o.train.mesh, o.train.steps, json, expected_first_loss);
  fmt::print(stderr, "compare: running the JAX baseline: {}\n", command);
  const int status = std::system(command.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 77) {
    fmt::print(stderr, "compare: no JAX here, its row is left out (add --install-jax to install it from PyPI)\n");
    return std::nullopt;
  }
  if (code != 0) fail("compare", "the JAX baseline failed (exit {}): {}", code, command);
  const io::JsonValue rows = io::read_json(json, io::kResultRowsCaps, "compare");
  const io::JsonValue j = rows.is_array() && rows.size() > 0 ? rows.at(std::size_t{0}) : rows;
  if (!j.is_object()) j.fail("is {}, not the JAX baseline's row", j.brief());
  CompareRow row;
  row.sharding = "jax";
  row.tokens_per_s = j.at("tokens_per_s").number(0, 1e300);
  if (const auto v = j.given("first_loss")) row.first_loss = v->number(-1e300, 1e300);
  if (const auto v = j.given("final_loss")) row.final_loss = v->number(-1e300, 1e300);
  if (const auto losses = j.given("losses")) losses->for_each_element([&](const io::JsonValue& l) { row.losses.push_back(l.number(-1e300, 1e300)); });
  if (const auto v = j.given("peak_bytes")) row.peak_bytes = static_cast<std::size_t>(v->integer(0, INT64_MAX));
  row.measured_comm = false;
  std::filesystem::remove_all(dir);
  return row;
}

std::string megabytes(double bytes) { return fmt::format("{:.2f}", bytes * 1e-6); }

// Every device of the mesh gets here before any goes on (an all-reduce over every axis).
void barrier(const Mesh& mesh) {
  NoGrad no_grad;
  const std::vector<std::string> axes = mesh.axis_names();
  static_cast<void>(psum(pvary(scalar(0.0), axes), axes));
}

// The cores the devices of a CPU run share: the machine's (a replay lets more devices than that
// compute only at a share of a core each); 0 on GPUs, a device each.
int shared_cores(Backend backend) { return backend == Backend::cpu ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) : 0; }

// The row's traced step (`step`, each device's "step" slice of this sharding) as timelines, the
// links fitted to its collectives, its measured time and its replay on them. On GPUs a device's
// work is its wall time: its host thread's CPU time is the launches'.
void attach_replay(CompareRow& row, const std::vector<trace::RecordedSlice>& slices, const Mesh& mesh, std::int64_t step, Backend backend) {
  std::vector<trace::RecordedSlice> windows(static_cast<std::size_t>(mesh.size()));
  for (auto& w : windows) w.duration_ns = -1;
  for (const auto& s : slices) {
    if (s.category != "step" || s.transfers || s.device < 0 || s.device >= mesh.size()) continue;
    const auto args = nlohmann::json::parse("{" + s.args + "}");
    if (args.value("sharding", "") == row.sharding && args.value("step", std::int64_t{-1}) == step)
      windows[static_cast<std::size_t>(s.device)] = s;
  }
  double measured = 0;
  for (const auto& w : windows) {
    if (w.duration_ns < 0) return;  // a device's step is not in the trace
    measured = std::max(measured, 1e-9 * static_cast<double>(w.duration_ns));
  }
  try {
    row.timelines = timelines_of(slices, windows);
    if (backend != Backend::cpu)
      for (auto& timeline : row.timelines)
        for (auto& e : timeline) e.cpu_seconds = -1;
    row.fitted_links = fit_links(row.timelines, mesh);
    row.traced_step_s = measured;
    row.replayed_step_s = replay(row.timelines, mesh, measured_costs(row.fitted_links, mesh, shared_cores(backend)));
  } catch (const Error& e) {  // a timeline the replay cannot follow: the rows stand without it
    fmt::print(stderr, "compare: the {} row's step is not replayed: {}\n", row.sharding, e.what());
    row.timelines.clear(), row.fitted_links.clear(), row.traced_step_s = row.replayed_step_s = 0;
  }
}

}  // namespace

std::vector<Cluster> declared_clusters() {
  const Link nvlink{"nvlink", 5e-6, 350e9}, infiniband{"infiniband", 10e-6, 45e9};
  // Within a node: tensor, context and fully sharded data parallelism; between nodes: the
  // data-parallel replicas and the pipeline's stages (their traffic is the smallest).
  return {
      {"8 GPUs, one node, NVLink", 8, kGpuPeakBf16Flops,
       {{"mp", nvlink}, {"cp", nvlink}, {"fsdp", nvlink}, {"pp", nvlink}, {"dp", nvlink}}},
      {"64 GPUs, 8 nodes, InfiniBand between nodes", 64, kGpuPeakBf16Flops,
       {{"mp", nvlink}, {"cp", nvlink}, {"fsdp", nvlink}, {"pp", infiniband}, {"dp", infiniband}}},
  };
}

namespace {

// The cluster's mesh under weak scaling: every axis of the run but dp at its size, dp the rest.
std::map<std::string, int> cluster_sizes(const Mesh& run, const Cluster& cluster) {
  std::map<std::string, int> sizes;
  int kept = 1;
  for (const auto& axis : run.axis_names())
    if (axis != "dp") kept *= sizes[axis] = run.axis_size(axis);
  sizes["dp"] = std::max(1, cluster.devices / kept);
  return sizes;
}

// Seconds of one collective over the group of `axes` on the cluster: its size there, on the
// slowest of the axes' links.
double cluster_price(const Cluster& cluster, const std::map<std::string, int>& sizes, CollectiveKind kind, std::size_t bytes,
                     const std::vector<std::string>& axes) {
  int n = 1;
  Link link = cluster.links.at("mp");
  for (const auto& m : axes) {
    n *= sizes.count(m) ? sizes.at(m) : 1;
    if (cluster.links.count(m) && cluster.links.at(m).bandwidth_Bps < link.bandwidth_Bps) link = cluster.links.at(m);
  }
  return CostModel::seconds(kind, bytes, n, link);
}

// A group of the communication counts ("dp,mp") as its mesh axes.
std::vector<std::string> axes_of_group(const std::string& group) {
  std::vector<std::string> axes;
  std::stringstream names(group);
  for (std::string m; std::getline(names, m, ',');) axes.push_back(m);
  return axes;
}

}  // namespace

// Weak scaling onto a cluster: every mesh axis but dp keeps its size in the run, dp takes the rest
// of the devices, and each data-parallel device keeps its share of the batch. A replica's compute
// is split over mp, cp and pp; a pipeline's stages idle for its bubble.
Projection project(const CompareRow& row, const Cluster& cluster, const CompareOptions& o) {
  const Mesh run = model_mesh(o.train.mesh);
  const Config config = padded_for(config_by_name(o.train.config), run);
  const std::map<std::string, int> sizes = cluster_sizes(run, cluster);
  const int splitting = (sizes.count("mp") ? sizes.at("mp") : 1) * context_devices(run) * pipeline_stages(run);
  const double tokens_per_replica = static_cast<double>(o.train.batch * o.train.seq) / data_parallel_devices(run);
  const double tokens_per_step = tokens_per_replica * sizes.at("dp") * fsdp_devices(run);
  Projection p{cluster.name, row.sharding};
  const double flops_s = flops_per_token(config, o.train.seq) * tokens_per_replica / splitting / (cluster.peak_flops * o.projected_mfu);
  p.compute_s = row.bubble > 0 ? flops_s / (1 - row.bubble) : flops_s;
  for (const auto& [group, stats] : row.comm_per_step)
    for (int k = 0; k < kCollectiveKinds; ++k) {
      const std::size_t calls = stats.calls[static_cast<std::size_t>(k)], bytes = stats.bytes[static_cast<std::size_t>(k)];
      if (calls > 0)
        p.comm_s += static_cast<double>(calls) * cluster_price(cluster, sizes, static_cast<CollectiveKind>(k), bytes / calls, axes_of_group(group));
    }
  p.step_s = p.compute_s + p.comm_s;
  p.tokens_per_s = tokens_per_step / p.step_s;
  if (!row.timelines.empty()) {
    // The replay's compute is the run's, scaled so that the busiest device computes flops_s (the
    // pipeline's idle ticks are in the timelines already, as waits).
    const double measured_compute = busiest_compute_s(row.timelines);
    const ReplayCosts costs{measured_compute > 0 ? flops_s / measured_compute : 0.0,
                            [&](CollectiveKind kind, std::size_t bytes, const std::vector<std::string>& axes) {
                              return cluster_price(cluster, sizes, kind, bytes, axes);
                            }};
    p.replayed_step_s = replay(row.timelines, run, costs);
    p.replayed_tokens_per_s = p.replayed_step_s > 0 ? tokens_per_step / p.replayed_step_s : 0;
  }
  return p;
}

std::vector<CompareRow> compare(const CompareOptions& o, const TextData& data) {
  check_options(o.train);
  const Mesh mesh = model_mesh(o.train.mesh);
  const Config config = padded_for(config_by_name(o.train.config), mesh);
  check_run(config, mesh, o.train, "compare");
  // The automatic view places dp, mp and fsdp; pp and cp are hand-written only, so on such a mesh
  // the hand-coded model runs alone.
  const bool with_auto = placed_automatically(mesh);
  if (o.train.steps < 2) fail("compare", "--steps must be at least 2 (the first steps warm up)");
  if (o.with_jax && !dp_mp_only(mesh))
    fail("compare", "--with-jax: the JAX baseline shards over dp and mp only, and mesh {} has a pp, cp or fsdp axis", mesh.str());
  if (o.with_jax && o.train.dtype != DType::f32)
    fail("compare", "--with-jax runs JAX in f32 and checks its first loss against nax's: use it with --dtype f32, not {}",
         dtype_name(o.train.dtype));
  if (!o.cost_model.empty()) set_cost_model(CostModel::from_file(o.cost_model));
  TrainOptions hand = o.train, automatic = o.train;
  hand.sharding = "hand", automatic.sharding = "auto";
  // deterministic sequence parallelism is the hand-coded block's (the global view's is refused)
  if (o.train.deterministic) automatic.sequence_parallel = false;
  if (with_auto && o.train.remat)
    fail("compare", "--remat: the automatic row (the global view) has no checkpointing, so the rows would not compare; use --remat "
         "with gptj train, or on a mesh with a pp, cp or fsdp axis, where the hand-coded model runs alone");
  if (with_auto) check_options(automatic);
  const AxisRules rules = axis_rules(mesh);
  Runtime rt = Runtime::from_env(mesh, runtime_options(o.train.backend, o.train.deterministic));
  Track hand_track, auto_track;
  Progress progress(o.train.quiet || process_index() != 0, o.train.steps);
  // The last step is traced (the whole run is, with --trace) and replayed: in one process, where
  // the trace sees every device.
  const bool replayable = process_count() == 1;
  bool traced_here = false;
  rt.run([&](Shard& s) {
    Learner h(s, config, rules, hand);
    std::optional<Learner> a;
    if (with_auto) a.emplace(s, config, rules, automatic);
    for (std::int64_t step = 0; step < o.train.steps; ++step) {
      const double lr = nn::warmup_cosine(step, o.train.warmup, o.train.steps, o.train.lr);
      auto [x, y] = device_batch(s, data, o.train, rules, step);
      if (replayable && step == o.train.steps - 1) {
        barrier(mesh);
        if (s.device() == 0 && !trace::enabled()) trace::start(), traced_here = true;
        barrier(mesh);
      }
      Track scratch;
      Track& ht = s.device() == 0 ? hand_track : scratch;
      Track& at = s.device() == 0 ? auto_track : scratch;
      // Alternate which goes first, so that neither always follows the other's cache footprint.
      Learner* other = a ? &*a : nullptr;
      if (a && step % 2 == 1) step_and_track(s, *a, &h, at, x, y, lr, step);
      step_and_track(s, h, other, ht, x, y, lr, step);
      if (a && step % 2 == 0) step_and_track(s, *a, &h, at, x, y, lr, step);
      if (s.device() == 0)
        progress.update(step, fmt::format("compare: step {}/{} | hand loss {:.4f} {:.0f} ms{}", step + 1, o.train.steps, ht.losses.back(),
                                          1e3 * ht.step_s.back(),
                                          a ? fmt::format(" | auto loss {:.4f} {:.0f} ms", at.losses.back(), 1e3 * at.step_s.back()) : ""));
    }
  });
  progress.finish();
  std::vector<trace::RecordedSlice> slices;
  if (replayable) slices = trace::recorded();
  if (traced_here) trace::stop();
  std::vector<CompareRow> rows;
  if (process_index() != 0) return rows;
  rows.push_back(row_of("hand", hand_track, o));
  if (with_auto) rows.push_back(row_of("auto", auto_track, o));
  for (auto& row : rows) attach_replay(row, slices, mesh, o.train.steps - 1, o.train.backend);
  if (o.with_jax)
    if (auto jax = run_jax(o, data, rows[0].first_loss)) rows.push_back(*jax);
  return rows;
}

void print_comparison(const std::vector<CompareRow>& rows, const CompareOptions& o) {
  if (rows.empty()) return;
  const double hand_rate = rows[0].tokens_per_s;
  const bool alone = rows.size() == 1;
  fmt::print("\nhand-coded{}{}: config {}, mesh {}, batch {} x seq {}, {} steps, {} compute (tokens/s: median after {} warm-up steps)\n",
             o.train.sequence_parallel ? " (--sequence-parallel)" : "", alone ? "" : " vs automatic sharding", o.train.config, o.train.mesh,
             o.train.batch, o.train.seq, o.train.steps, dtype_name(o.train.dtype), o.timing_skip);
  if (alone)
    fmt::print("(no automatic row: the automatic view places dp, mp and fsdp, and this mesh's pp or cp axis is hand-written only, "
               "docs/parallelism.md)\n");
  fmt::print("{:<8} {:>10} {:>10} {:>34} {:>12} {:>10} {:>11} {:>11}\n", "sharding", "tokens/s", "hand/this", "MB/step/device by axes",
             "collectives", "peak MiB", "first loss", "final loss");
  for (const auto& r : rows) {
    std::vector<std::string> axes;
    for (const auto& [a, b] : r.bytes_by_axes) axes.push_back(fmt::format("{} {}", a, megabytes(b)));
    const std::string comm = r.measured_comm ? fmt::format("{}", fmt::join(axes, ", ")) : "(not counted)";
    fmt::print("{:<8} {:>10.0f} {:>10.2f} {:>34} {:>12} {:>10.1f} {:>11.5f} {:>11.5f}\n", r.sharding, r.tokens_per_s, hand_rate / r.tokens_per_s,
               comm, r.measured_comm ? fmt::format("{:.0f}", r.collectives_per_step) : "-", static_cast<double>(r.peak_bytes) / (1 << 20),
               r.first_loss, r.final_loss);
  }
  if (rows[0].bubble > 0)
    fmt::print("pipeline: {} schedule, {} micro-batches: bubble {:.1f}% of the stage-ticks, device 0 idle {:.1f}% of the schedule\n",
               o.train.schedule, o.train.micro_batches, 100 * rows[0].bubble, 100 * rows[0].pipeline_idle);
  for (const auto& r : rows) {
    if (r.timelines.empty()) continue;
    std::vector<std::string> links;
    for (const auto& [axes, l] : r.fitted_links)
      links.push_back(fmt::format("{} {:.1f} us + {:.2f} GB/s", l.name, l.latency_s * 1e6, l.bandwidth_Bps * 1e-9));
    fmt::print("{}: the last step took {:.1f} ms; its timeline replayed on the links fitted to its own collectives{}{}: {:.1f} ms ({:+.1f}%)\n",
               r.sharding, 1e3 * r.traced_step_s, links.empty() ? "" : " (", fmt::format("{}{}", fmt::join(links, ", "), links.empty() ? "" : ")"),
               1e3 * r.replayed_step_s, 100 * (r.replayed_step_s / r.traced_step_s - 1));
  }
  fmt::print("\nprojected step time on declared clusters (weak scaling: each device keeps its share of the batch; compute at {:.0f}% "
             "MFU of {:.0f} TFLOP/s; collectives priced by the alpha-beta model; 'step ms' adds them up, 'replayed ms' replays the "
             "traced step's timeline, so that what overlapped there overlaps)\n",
             100 * o.projected_mfu, kGpuPeakBf16Flops * 1e-12);
  fmt::print("{:<46} {:<8} {:>11} {:>10} {:>10} {:>12} {:>12} {:>12}\n", "cluster", "sharding", "compute ms", "comm ms", "step ms", "tokens/s",
             "replayed ms", "tokens/s");
  for (const auto& cluster : declared_clusters())
    for (const auto& r : rows) {
      if (!r.measured_comm) continue;
      const Projection p = project(r, cluster, o);
      fmt::print("{:<46} {:<8} {:>11.3f} {:>10.3f} {:>10.3f} {:>12.0f} {:>12} {:>12}\n", p.cluster, p.sharding, 1e3 * p.compute_s, 1e3 * p.comm_s,
                 1e3 * p.step_s, p.tokens_per_s, p.replayed_step_s > 0 ? fmt::format("{:.3f}", 1e3 * p.replayed_step_s) : "-",
                 p.replayed_step_s > 0 ? fmt::format("{:.0f}", p.replayed_tokens_per_s) : "-");
    }
}

void write_comparison_json(const std::vector<CompareRow>& rows, const CompareOptions& o, const std::string& path) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json row{{"sharding", r.sharding}, {"config", o.train.config}, {"mesh", o.train.mesh}, {"batch", o.train.batch},
                       {"seq", o.train.seq}, {"steps", o.train.steps}, {"dtype", dtype_name(o.train.dtype)}, {"tokens_per_s", r.tokens_per_s},
                       {"first_loss", r.first_loss}, {"final_loss", r.final_loss}, {"losses", r.losses},
                       {"peak_bytes", r.peak_bytes > 0 ? nlohmann::json(r.peak_bytes) : nlohmann::json()}};
    if (r.measured_comm) {
      row["bytes_per_step"] = r.bytes_per_step;
      row["bytes_per_step_by_axes"] = r.bytes_by_axes;
      row["collectives_per_step"] = r.collectives_per_step;
      if (r.bubble > 0) row["pipeline"] = {{"bubble", r.bubble}, {"idle", r.pipeline_idle}, {"schedule", o.train.schedule},
                                          {"micro_batches", o.train.micro_batches}};
      nlohmann::json projections = nlohmann::json::object();
      for (const auto& cluster : declared_clusters()) {
        const Projection p = project(r, cluster, o);
        projections[cluster.name] = {{"compute_s", p.compute_s}, {"comm_s", p.comm_s}, {"step_s", p.step_s}, {"tokens_per_s", p.tokens_per_s}};
        if (p.replayed_step_s > 0)
          projections[cluster.name]["replayed"] = {{"step_s", p.replayed_step_s}, {"tokens_per_s", p.replayed_tokens_per_s}};
      }
      row["projected"] = projections;
      if (!r.timelines.empty()) row["replay"] = {{"traced_step_s", r.traced_step_s}, {"replayed_step_s", r.replayed_step_s}};
    } else {
      row["bytes_per_step"] = nullptr;
      row["bytes_per_step_by_axes"] = nullptr;
      row["collectives_per_step"] = nullptr;
    }
    out.push_back(row);
  }
  write_file_atomically(path, out.dump(2) + "\n");
}

}  // namespace gptj
