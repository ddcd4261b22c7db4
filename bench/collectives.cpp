// bench_collectives: time, bandwidth and bus bandwidth of the raw Communicator collectives of the
// local (thread) backend, the way nccl-tests reports them, against single-thread memcpy bandwidth.
//
// For each rank count n, a mesh x=n runs one thread per device; each collective (all_reduce sum
// f32, all_gather, reduce_scatter, all_to_all, permute as the ring r -> r+1, broadcast from 0) is
// timed for message sizes S doubling from --min-bytes to --max-bytes, where S is the byte size of
// the full result buffer. A rank's time is its mean over `iters` calls timed after a barrier; a
// trial's time is the slowest rank's, and a row's time the median of 3 trials. algbw = S / time,
// busbw = algbw * the nccl-tests factor. The results are also checked against their known values.
// Note that the buffers are reused, so sizes that fit in the caches can beat the memcpy figure,
// which is measured on 256 MiB (DRAM).
//
// Under mpirun (or with --backend mpi) the MPI communicator is timed too, one process per rank on
// a mesh x=<processes>: each size gets a threads row (process 0 running that many threads) and an
// mpi row beside it, in the same layout; a trial's time is still its slowest rank's. Process 0
// alone prints and writes the JSON.
//
//   build-bench/bin/bench_collectives [--ranks 2,4,8] [--min-bytes 1024] [--max-bytes 67108864]
//                                     [--iters N] [--json FILE]
//   mpirun --bind-to none -np 2 build-bench/bin/bench_collectives [--no-signature-check] [...]
#include <nax/nax.h>

#include <fmt/format.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "bench_util.h"

namespace {

using nax::CollectiveKind;

constexpr std::array kKinds = {CollectiveKind::all_reduce, CollectiveKind::all_gather, CollectiveKind::reduce_scatter,
                               CollectiveKind::all_to_all, CollectiveKind::permute,    CollectiveKind::broadcast};
constexpr std::size_t kFloat = sizeof(float);
constexpr std::int64_t kMiB = 1 << 20;
// Large messages get fewer timed calls: at most this many bytes of results per (collective, size).
constexpr std::int64_t kBytesPerSize = 512 * kMiB;
constexpr int kMinIters = 3;
// Each size is timed this many times (a barrier before each); a row reports the median trial.
constexpr int kTrials = 3;

struct Options {
  std::vector<std::int64_t> ranks = {2, 4, 8};
  std::int64_t min_bytes = 1024;
  std::int64_t max_bytes = 64 * kMiB;
  int iters = 100;
  std::string json_path;
  bool mpi = false;              // also time the MPI communicator (one process per rank)
  bool signature_check = true;   // MPI: the group agrees on each call's signature first
};

// The element counts one call of a collective uses for a result of about `bytes` bytes.
struct Layout {
  std::size_t count = 0;        // the `count` argument of the Communicator call
  std::size_t send_floats = 0;  // per rank
  std::size_t recv_floats = 0;  // per rank
  std::int64_t bytes() const { return static_cast<std::int64_t>(std::max(send_floats, recv_floats) * kFloat); }
};

Layout layout_for(CollectiveKind kind, std::int64_t bytes, int n) {
  const auto ranks = static_cast<std::size_t>(n);
  const std::size_t whole = static_cast<std::size_t>(bytes) / kFloat, block = whole / ranks;
  switch (kind) {
    case CollectiveKind::all_gather: return {block, block, block * ranks};
    case CollectiveKind::reduce_scatter: return {block, block * ranks, block};
    case CollectiveKind::all_to_all: return {block, block * ranks, block * ranks};
    default: return {whole, whole, whole};  // all_reduce, permute, broadcast
  }
}

// nccl-tests' factor from algorithm bandwidth to bus bandwidth.
double bus_factor(CollectiveKind kind, int n) {
  switch (kind) {
    case CollectiveKind::all_reduce: return 2.0 * (n - 1) / n;
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_to_all: return static_cast<double>(n - 1) / n;
    default: return 1.0;  // permute, broadcast
  }
}

std::vector<std::pair<int, int>> ring_pairs(int n) {
  std::vector<std::pair<int, int>> pairs;
  for (int r = 0; r < n; ++r) pairs.emplace_back(r, (r + 1) % n);
  return pairs;
}

void call_collective(CollectiveKind kind, nax::Communicator& c, const float* send, float* recv, std::size_t count,
                     const std::vector<std::pair<int, int>>& ring) {
  using nax::DType;
  switch (kind) {
    case CollectiveKind::all_reduce: return c.all_reduce(send, recv, count, DType::f32, nax::ReduceOp::sum);
    case CollectiveKind::all_gather: return c.all_gather(send, recv, count, DType::f32);
    case CollectiveKind::reduce_scatter: return c.reduce_scatter(send, recv, count, DType::f32, nax::ReduceOp::sum);
    case CollectiveKind::all_to_all: return c.all_to_all(send, recv, count, DType::f32);
    case CollectiveKind::permute: return c.permute(send, recv, count, DType::f32, ring);
    case CollectiveKind::broadcast: return c.broadcast(send, recv, count, DType::f32, 0);
    case CollectiveKind::barrier: return c.barrier();
  }
}

// Every rank sends the value rank + 1; what element i of rank `rank`'s result must then hold.
float expected_value(CollectiveKind kind, int rank, int n, std::size_t i, std::size_t count) {
  switch (kind) {
    case CollectiveKind::all_reduce:
    case CollectiveKind::reduce_scatter: return static_cast<float>(n * (n + 1) / 2);
    case CollectiveKind::all_gather:
    case CollectiveKind::all_to_all: return static_cast<float>(i / count + 1);  // block j came from rank j
    case CollectiveKind::permute: return static_cast<float>((rank + n - 1) % n + 1);
    default: return 1.0f;  // broadcast from rank 0
  }
}

bool result_is_correct(CollectiveKind kind, int rank, int n, const Layout& layout, std::span<const float> recv) {
  for (std::size_t i = 0; i < layout.recv_floats; ++i)
    if (recv[i] != expected_value(kind, rank, n, i, layout.count)) return false;
  return true;
}

std::vector<std::int64_t> message_sizes(const Options& options) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t s = options.min_bytes; s <= options.max_bytes; s *= 2) sizes.push_back(s);
  return sizes;
}

int timed_iterations(const Options& options, std::int64_t bytes) {
  return static_cast<int>(std::max<std::int64_t>(kMinIters, std::min<std::int64_t>(options.iters, kBytesPerSize / bytes)));
}

// What one rank measured for one message size.
struct Sample {
  Layout layout;
  int iters = 0;
  std::vector<double> seconds;  // per call, one value per trial
  bool correct = false;
};

Sample time_one_size(nax::Communicator& c, CollectiveKind kind, const Layout& layout, int iters,
                     std::span<const float> send, std::span<float> recv) {
  const auto ring = ring_pairs(c.size());
  std::fill(recv.begin(), recv.begin() + static_cast<std::ptrdiff_t>(layout.recv_floats), -1.0f);
  const int warmup = std::max(1, iters / 10);
  for (int i = 0; i < warmup; ++i) call_collective(kind, c, send.data(), recv.data(), layout.count, ring);
  std::vector<double> seconds;
  for (int trial = 0; trial < kTrials; ++trial) {
    c.barrier();
    const auto start = bench::Clock::now();
    for (int i = 0; i < iters; ++i) call_collective(kind, c, send.data(), recv.data(), layout.count, ring);
    seconds.push_back(bench::seconds_between(start, bench::Clock::now()) / iters);
  }
  const bool correct = result_is_correct(kind, c.rank(), c.size(), layout, recv);
  return {layout, iters, std::move(seconds), correct};
}

struct HostFloats {
  explicit HostFloats(std::size_t count)
      : allocator(nax::make_caching_host_allocator()),
        data(static_cast<float*>(allocator->allocate(std::max<std::size_t>(count, 1) * kFloat)), count) {}
  ~HostFloats() { allocator->deallocate(data.data(), std::max<std::size_t>(data.size(), 1) * kFloat); }
  HostFloats(const HostFloats&) = delete;
  HostFloats& operator=(const HostFloats&) = delete;
  std::shared_ptr<nax::Allocator> allocator;
  std::span<float> data;
};

// One device's part: every message size of one collective, in order (sizes too small for this
// many ranks are left out, the same way on every rank).
std::vector<Sample> time_collective(nax::Shard& shard, CollectiveKind kind, const Options& options) {
  nax::Communicator& c = shard.comm("x");
  const int n = c.size();
  std::vector<Layout> layouts;
  std::size_t send_floats = 0, recv_floats = 0;
  for (std::int64_t bytes : message_sizes(options)) {
    Layout layout = layout_for(kind, bytes, n);
    if (layout.count == 0) continue;
    layouts.push_back(layout);
    send_floats = std::max(send_floats, layout.send_floats);
    recv_floats = std::max(recv_floats, layout.recv_floats);
  }
  // From the host allocator, as tensors are (large blocks on huge pages).
  HostFloats send(send_floats), recv(recv_floats);
  std::fill(send.data.begin(), send.data.end(), static_cast<float>(c.rank() + 1));
  std::vector<Sample> samples;
  for (const Layout& layout : layouts)
    samples.push_back(time_one_size(c, kind, layout, timed_iterations(options, layout.bytes()), send.data, recv.data));
  return samples;
}

struct Row {
  CollectiveKind kind = CollectiveKind::all_reduce;
  std::string_view backend = "threads";
  int ranks = 0;
  std::int64_t bytes = 0;
  std::size_t count = 0;
  int iters = 0;
  double seconds = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  double pct_of_memcpy = 0;
  bool correct = false;
};

// A trial's time is its slowest rank's; a size's time is the median over trials.
double median_trial_seconds(const std::vector<std::vector<Sample>>& per_rank, std::size_t size_index) {
  std::vector<double> trials;
  for (int trial = 0; trial < kTrials; ++trial) {
    double slowest = 0;
    for (const auto& samples : per_rank) slowest = std::max(slowest, samples[size_index].seconds[static_cast<std::size_t>(trial)]);
    trials.push_back(slowest);
  }
  return bench::median(std::move(trials));
}

// Combines the ranks' samples of each size on `n` ranks; a size is correct only if it was on every
// rank. (Under MPI, one process's samples already hold every trial's slowest rank.)
std::vector<Row> combine_ranks(CollectiveKind kind, std::string_view backend, int n, const std::vector<std::vector<Sample>>& per_rank,
                               double ceiling_gbps) {
  std::vector<Row> rows;
  for (std::size_t i = 0; i < per_rank[0].size(); ++i) {
    const Sample& first = per_rank[0][i];
    Row row{kind, backend, n, first.layout.bytes(), first.layout.count, first.iters};
    row.seconds = median_trial_seconds(per_rank, i);
    row.correct = std::all_of(per_rank.begin(), per_rank.end(), [i](const auto& samples) { return samples[i].correct; });
    row.algbw_gbps = static_cast<double>(row.bytes) / row.seconds / 1e9;
    row.busbw_gbps = row.algbw_gbps * bus_factor(kind, n);
    row.pct_of_memcpy = 100.0 * row.busbw_gbps / ceiling_gbps;
    rows.push_back(row);
  }
  return rows;
}

// Single-thread memcpy of 256 MiB: bytes copied per second (one direction), median of 5.
double measure_memcpy_gbps() {
  constexpr std::size_t kBytes = 256 * kMiB;
  std::vector<char> from(kBytes, 1), to(kBytes, 0);  // filled, so that no page fault is timed
  std::memcpy(to.data(), from.data(), kBytes);
  const double seconds = bench::median_seconds(5, [&] { std::memcpy(to.data(), from.data(), kBytes); });
  return static_cast<double>(kBytes) / seconds / 1e9;
}

void print_header() {
  fmt::print("{:<15}{:>8}{:>6}{:>12}{:>8}{:>13}{:>12}{:>12}{:>11}\n", "collective", "backend", "ranks", "bytes", "iters", "time_us",
             "algbw GB/s", "busbw GB/s", "% memcpy");
}

void print_row(const Row& row) {
  fmt::print("{:<15}{:>8}{:>6}{:>12}{:>8}{:>13.2f}{:>12.3f}{:>12.3f}{:>10.1f}%{}\n", nax::collective_name(row.kind), row.backend,
             row.ranks, row.bytes, row.iters, row.seconds * 1e6, row.algbw_gbps, row.busbw_gbps, row.pct_of_memcpy,
             row.correct ? "" : "  WRONG RESULT");
  std::fflush(stdout);
}

struct GoalCheck {
  bool measured = false;
  double min_busbw_gbps = 0;
  double pct_of_memcpy = 0;
  bool met = false;
};

// The goal: all_reduce busbw at 2 ranks is at least half of memcpy bandwidth from 4 MiB up.
GoalCheck check_goal(const std::vector<Row>& rows, double memcpy_ceiling) {
  GoalCheck goal;
  for (const Row& row : rows) {
    if (row.kind != CollectiveKind::all_reduce || row.backend != "threads" || row.ranks != 2 || row.bytes < 4 * kMiB) continue;
    goal.min_busbw_gbps = goal.measured ? std::min(goal.min_busbw_gbps, row.busbw_gbps) : row.busbw_gbps;
    goal.measured = true;
  }
  goal.pct_of_memcpy = 100.0 * goal.min_busbw_gbps / memcpy_ceiling;
  goal.met = goal.measured && goal.pct_of_memcpy >= 50.0;
  return goal;
}

void print_goal(const GoalCheck& goal) {
  if (!goal.measured) {
    fmt::print("goal check skipped: it needs 2 in --ranks and --max-bytes >= 4 MiB\n");
    return;
  }
  fmt::print("all_reduce busbw at 2 ranks from 4 MiB up: min {:.2f} GB/s = {:.1f}% of memcpy (goal >= 50%): {}\n",
             goal.min_busbw_gbps, goal.pct_of_memcpy, goal.met ? "MET" : "NOT MET");
}

// Under mpirun: MPI's all_reduce busbw over the threads' at each size from 4 MiB up (issue goal: >= 0.6).
void print_mpi_ratios(const std::vector<Row>& rows) {
  std::vector<std::string> ratios;
  double least = 0;
  for (const Row& mpi : rows) {
    if (mpi.kind != CollectiveKind::all_reduce || mpi.backend != "mpi" || mpi.bytes < 4 * kMiB) continue;
    for (const Row& threads : rows) {
      if (threads.kind != mpi.kind || threads.backend != "threads" || threads.ranks != mpi.ranks || threads.bytes != mpi.bytes) continue;
      const double ratio = mpi.busbw_gbps / threads.busbw_gbps;
      least = ratios.empty() ? ratio : std::min(least, ratio);
      ratios.push_back(fmt::format("{} MiB {:.2f}", mpi.bytes / kMiB, ratio));
    }
  }
  if (ratios.empty()) return;
  fmt::print("all_reduce busbw MPI / threads from 4 MiB up: {} (least {:.2f})\n", fmt::join(ratios, ", "), least);
}

void write_json(const std::string& path, double memcpy_ceiling, const std::vector<Row>& rows, const GoalCheck& goal) {
  std::vector<bench::JsonObject> items;
  for (const Row& row : rows) {
    items.push_back(bench::JsonObject()
                        .add("collective", nax::collective_name(row.kind))
                        .add("backend", row.backend)
                        .add("ranks", row.ranks)
                        .add("bytes", row.bytes)
                        .add("count", static_cast<std::int64_t>(row.count))
                        .add("iters", row.iters)
                        .add("time_us", row.seconds * 1e6)
                        .add("algbw_gbps", row.algbw_gbps)
                        .add("busbw_gbps", row.busbw_gbps)
                        .add("pct_of_memcpy", row.pct_of_memcpy)
                        .add("correct", row.correct));
  }
  bench::JsonObject goal_json;
  goal_json.add("what", "all_reduce busbw at 2 ranks from 4 MiB up >= 50% of memcpy").add("measured", goal.measured);
  if (goal.measured) goal_json.add("min_busbw_gbps", goal.min_busbw_gbps).add("pct_of_memcpy", goal.pct_of_memcpy);
  goal_json.add("met", goal.met);
  bench::write_text_file(path, fmt::format("{{\n  \"memcpy_gbps\": {},\n  \"trials\": {},\n  \"goal\": {},\n  \"rows\": {}\n}}\n",
                                           bench::json_number(memcpy_ceiling), kTrials, goal_json.str(), bench::json_array(items)));
}

void print_help() {
  fmt::print(
      "usage: bench_collectives [--ranks 2,4,8] [--min-bytes 1024] [--max-bytes 67108864] [--iters N] [--json FILE]\n"
      "Times the local communicator's collectives (all_reduce sum f32, all_gather, reduce_scatter,\n"
      "all_to_all, permute as a ring, broadcast from rank 0) on a mesh x=<ranks> of threads, for\n"
      "sizes doubling from --min-bytes to --max-bytes (the bytes of the full result buffer), and\n"
      "prints time, algbw and busbw (nccl-tests factors) against single-thread memcpy bandwidth.\n"
      "Under mpirun (mpirun --bind-to none -np N bench_collectives), the MPI communicator is timed\n"
      "too on N processes, each size beside the threads' row for N ranks; process 0 prints.\n"
      "  --iters N   timed calls per size for small sizes (default 100); large sizes use fewer\n"
      "  --json FILE also write the results as JSON\n"
      "  --backend threads|mpi  mpi: time MPI too (the default under mpirun)\n"
      "  --no-signature-check   MPI: skip the per-call signature agreement (to measure its cost)\n");
}

bool launched_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

bool parse_backend(const std::string& value) {
  if (value == "mpi") return true;
  if (value == "threads") return false;
  nax::fail("--backend", "expects threads or mpi, got '{}'", value);
}

Options parse_options(int argc, char** argv) {
  Options options;
  options.mpi = launched_by_mpirun();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--ranks") options.ranks = bench::parse_integer_list(bench::flag_value(argc, argv, i), arg);
    else if (arg == "--min-bytes") options.min_bytes = bench::parse_integer(bench::flag_value(argc, argv, i), arg);
    else if (arg == "--max-bytes") options.max_bytes = bench::parse_integer(bench::flag_value(argc, argv, i), arg);
    else if (arg == "--iters") options.iters = static_cast<int>(bench::parse_integer(bench::flag_value(argc, argv, i), arg));
    else if (arg == "--json") options.json_path = bench::flag_value(argc, argv, i);
    else if (arg == "--backend") options.mpi = parse_backend(bench::flag_value(argc, argv, i));
    else if (arg == "--no-signature-check") options.signature_check = false;
    else throw nax::Error(fmt::format("unknown argument '{}' (try --help)", arg));
  }
  for (std::int64_t n : options.ranks)
    if (n < 1 || n > 256) nax::fail("--ranks", "{} ranks is out of range [1, 256]", n);
  if (options.min_bytes < 4 || options.max_bytes < options.min_bytes)
    throw nax::Error(fmt::format("need 4 <= --min-bytes <= --max-bytes (got {} and {})", options.min_bytes, options.max_bytes));
  if (options.iters < 1) nax::fail("--iters", "needs at least 1 (got {})", options.iters);
  if (options.mpi) options.ranks = {nax::process_count()};  // one rank per process; threads as many
  return options;
}

std::vector<Row> run_all(const Options& options, double memcpy_ceiling) {
  std::vector<Row> rows;
  for (std::int64_t n : options.ranks) {
    nax::Runtime rt = nax::Runtime::local(nax::Mesh::parse(fmt::format("x={}", n)));
    for (CollectiveKind kind : kKinds) {
      auto per_rank = rt.run([&](nax::Shard& s) { return time_collective(s, kind, options); });
      for (const Row& row : combine_ranks(kind, "threads", static_cast<int>(n), per_rank, memcpy_ceiling)) {
        print_row(row);
        rows.push_back(row);
      }
    }
  }
  return rows;
}

// This process's samples with each trial's time replaced by the slowest process's, and correct
// only if every process was: what every process then knows.
std::vector<Sample> slowest_over_processes(std::vector<Sample> samples) {
  std::vector<double> seconds, correct;
  for (const Sample& s : samples) {
    seconds.insert(seconds.end(), s.seconds.begin(), s.seconds.end());
    correct.push_back(s.correct ? 1 : 0);
  }
  const auto n = static_cast<std::int64_t>(samples.size());
  auto slowest = nax::pmax(nax::pvary(nax::from_vector(nax::Shape{{"size", n}, {"trial", kTrials}}, seconds), "x"), "x").to_vector<double>();
  auto all_correct = nax::pmin(nax::pvary(nax::from_vector(nax::Shape{{"size", n}}, correct), "x"), "x").to_vector<double>();
  for (std::size_t i = 0; i < samples.size(); ++i) {
    for (std::size_t t = 0; t < kTrials; ++t) samples[i].seconds[t] = slowest[i * kTrials + t];
    samples[i].correct = all_correct[i] == 1;
  }
  return samples;
}

// Under mpirun: for each collective, the threads' rows (process 0, as many threads as processes)
// and the MPI communicator's rows (every process), printed side by side by process 0.
std::vector<Row> run_mpi(const Options& options, double memcpy_ceiling) {
  const nax::Mesh mesh = nax::Mesh::parse(fmt::format("x={}", nax::process_count()));
  nax::Runtime mpi = nax::Runtime::mpi(mesh, {.check_collectives = options.signature_check});
  const bool lead = nax::process_index() == 0;
  std::optional<nax::Runtime> threads;
  if (lead) threads.emplace(nax::Runtime::local(mesh));
  std::vector<Row> rows;
  for (CollectiveKind kind : kKinds) {
    std::vector<Row> by_threads;
    if (lead)  // the other processes wait (sleeping) in the MPI run's first collective meanwhile
      by_threads = combine_ranks(kind, "threads", mesh.size(), threads->run([&](nax::Shard& s) { return time_collective(s, kind, options); }),
                                 memcpy_ceiling);
    auto mine = mpi.run([&](nax::Shard& s) { return slowest_over_processes(time_collective(s, kind, options)); });
    const auto by_mpi = combine_ranks(kind, "mpi", mesh.size(), {mine[static_cast<std::size_t>(mpi.local_devices().front())]}, memcpy_ceiling);
    for (std::size_t i = 0; i < by_mpi.size(); ++i) {
      if (!lead) continue;
      print_row(by_threads[i]);
      print_row(by_mpi[i]);
      rows.push_back(by_threads[i]);
      rows.push_back(by_mpi[i]);
    }
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    for (int i = 1; i < argc; ++i)
      if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") return print_help(), 0;
    const Options options = parse_options(argc, argv);
    const bool lead = nax::process_index() == 0;  // under mpirun, process 0 measures memcpy and prints
    const double memcpy_ceiling = lead ? measure_memcpy_gbps() : 1.0;
    if (lead) {
      fmt::print("single-thread memcpy of 256 MiB: {:.2f} GB/s (the ceiling; % memcpy = busbw / this)\n\n", memcpy_ceiling);
      print_header();
    }
    const std::vector<Row> rows = options.mpi ? run_mpi(options, memcpy_ceiling) : run_all(options, memcpy_ceiling);
    if (!lead) return 0;
    const GoalCheck goal = check_goal(rows, memcpy_ceiling);
    fmt::print("\n");
    print_goal(goal);
    print_mpi_ratios(rows);
    if (!options.json_path.empty()) write_json(options.json_path, memcpy_ceiling, rows, goal);
    const bool all_correct = std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.correct; });
    if (!all_correct) fmt::print("ERROR: some collectives returned wrong results (rows marked WRONG RESULT)\n");
    return all_correct ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_collectives: {}\n", e.what());
    return 2;
  }
}
