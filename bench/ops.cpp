// bench_ops: the CPU op layer against what it sits on.
//  (a) nax::dot against cblas_sgemm called directly on the same f32 inputs, in the same run, one
//      BLAS thread: square M=N=K GEMMs, an attention-score contraction that dot must do with
//      strided GEMMs and no copy (compared with one cblas_sgemm per (batch, head) on the same
//      strides), and an MLP projection. Reports GFLOP/s (median of repetitions, nax and cblas
//      interleaved) and the ratio nax / cblas.
//  (b) the fixed cost of one eager op on tiny tensors: a + b on 16 f32, and for context dot of
//      [4] x [4, 4] and sum over a 16-element axis; median over batches of calls, in us per op.
// Everything runs on device 0 of Runtime::local(x=1) with blas_threads = 1.
//
//   build-bench/bin/bench_ops [--json FILE]
#include <cblas.h>
#include <nax/nax.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "bench_util.h"

namespace {

constexpr double kDotGoalRatio = 0.90;
constexpr double kGoalFlops = 2.0 * 1024 * 1024 * 1024;  // the dot goal holds from 1024^3 up
constexpr double kOverheadGoalUs = 3.0;
constexpr double kFlopsPerCase = 4e10;  // sets the repetitions of a GEMM case
constexpr int kMinReps = 7, kMaxReps = 200;
constexpr int kOverheadBatches = 2000, kOverheadBatchSize = 100;  // 200k calls per op

// --- (a) dot against cblas_sgemm ---

// The same contraction written two ways: nax::dot(a, b, contract), and direct cblas calls that
// write the result in dot's output layout.
struct GemmCase {
  std::string name;
  std::string shapes;
  nax::Tensor a, b;
  std::string contract;
  double flops = 0;
  std::function<void(const float* a, const float* b, float* out)> cblas;
};

void sgemm(CBLAS_TRANSPOSE trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}

nax::Tensor random_input(const nax::Shape& shape, std::string_view name) { return nax::random_normal(shape, 42, name); }

GemmCase square_case(int size) {
  const std::int64_t s = size;
  GemmCase c{fmt::format("square {}", size), fmt::format("[m={0},k={0}] . [k={0},n={0}]", size),
             random_input({{"m", s}, {"k", s}}, "a"), random_input({{"k", s}, {"n", s}}, "b"), "k", 2.0 * size * size * size, {}};
  c.cblas = [size](const float* a, const float* b, float* out) { sgemm(CblasNoTrans, size, size, size, a, size, b, size, out, size); };
  return c;
}

// q[batch, seq, heads, head_dim] . k[batch, kseq, heads, head_dim] over head_dim: one GEMM per
// (batch, head) on strided rows of q and k, into scores[batch, heads, seq, kseq].
GemmCase attention_case() {
  constexpr int kBatch = 4, kSeq = 512, kHeads = 8, kHeadDim = 64;
  GemmCase c{"attention scores", "q[batch=4,seq=512,heads=8,head_dim=64] . k[batch=4,kseq=512,heads=8,head_dim=64]",
             random_input({{"batch", kBatch}, {"seq", kSeq}, {"heads", kHeads}, {"head_dim", kHeadDim}}, "q"),
             random_input({{"batch", kBatch}, {"kseq", kSeq}, {"heads", kHeads}, {"head_dim", kHeadDim}}, "k"),
             "head_dim", 2.0 * kBatch * kHeads * kSeq * kSeq * kHeadDim, {}};
  c.cblas = [](const float* q, const float* k, float* out) {
    constexpr int row_stride = kHeads * kHeadDim;
    for (int b = 0; b < kBatch; ++b)
      for (int h = 0; h < kHeads; ++h) {
        const std::ptrdiff_t in_offset = static_cast<std::ptrdiff_t>(b) * kSeq * row_stride + h * kHeadDim;
        float* scores = out + (static_cast<std::ptrdiff_t>(b) * kHeads + h) * kSeq * kSeq;
        sgemm(CblasTrans, kSeq, kSeq, kHeadDim, q + in_offset, row_stride, k + in_offset, row_stride, scores, kSeq);
      }
  };
  return c;
}

GemmCase mlp_case() {
  constexpr int kTokens = 2048, kEmbed = 1024, kMlp = 4096;
  GemmCase c{"mlp projection", "x[tokens=2048,embed=1024] . w[embed=1024,mlp=4096]",
             random_input({{"tokens", kTokens}, {"embed", kEmbed}}, "x"), random_input({{"embed", kEmbed}, {"mlp", kMlp}}, "w"),
             "embed", 2.0 * kTokens * kEmbed * kMlp, {}};
  c.cblas = [](const float* x, const float* w, float* out) { sgemm(CblasNoTrans, kTokens, kMlp, kEmbed, x, kEmbed, w, kMlp, out, kMlp); };
  return c;
}

struct GemmRow {
  std::string name, shapes;
  double flops = 0;
  int reps = 0;
  double nax_gflops = 0, cblas_gflops = 0;
  double max_abs_diff = 0;  // between the two results
  double ratio() const { return nax_gflops / cblas_gflops; }
};

double max_abs_diff(const nax::Tensor& t, const float* reference) {
  const float* values = t.data<float>();
  double worst = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) worst = std::max(worst, std::abs(static_cast<double>(values[i]) - reference[i]));
  return worst;
}

// Times dot and the cblas calls alternately (so that drift on a noisy machine hits both alike).
GemmRow time_gemm_case(const GemmCase& c) {
  const int reps = std::clamp(static_cast<int>(kFlopsPerCase / c.flops), kMinReps, kMaxReps);
  nax::Tensor result = nax::dot(c.a, c.b, c.contract);  // warm-up, and the result to compare
  // cblas writes into memory from the same allocator as dot's result, so both write alike.
  nax::Tensor reference_tensor = nax::Tensor::empty(result.shape(), nax::DType::f32);
  float* reference = reference_tensor.mutable_data<float>();
  const float *a = c.a.data<float>(), *b = c.b.data<float>();
  c.cblas(a, b, reference);
  std::vector<double> nax_times, cblas_times;
  for (int r = 0; r < reps; ++r) {
    nax_times.push_back(bench::seconds_of([&] { result = nax::dot(c.a, c.b, c.contract); }));
    cblas_times.push_back(bench::seconds_of([&] { c.cblas(a, b, reference); }));
  }
  GemmRow row{c.name, c.shapes, c.flops, reps};
  row.nax_gflops = c.flops / bench::median(nax_times) / 1e9;
  row.cblas_gflops = c.flops / bench::median(cblas_times) / 1e9;
  row.max_abs_diff = max_abs_diff(result, reference);
  return row;
}

std::vector<GemmRow> run_gemm_cases() {
  openblas_set_num_threads(1);
  std::vector<GemmRow> rows;
  for (int size : {256, 512, 1024, 2048}) rows.push_back(time_gemm_case(square_case(size)));
  rows.push_back(time_gemm_case(attention_case()));
  rows.push_back(time_gemm_case(mlp_case()));
  return rows;
}

// --- (b) per-op overhead ---

struct OverheadRow {
  std::string op;
  double us_per_op = 0;
};

// Median over batches of the mean time of one call within a batch, in microseconds.
OverheadRow time_tiny_op(std::string op, const std::function<nax::Tensor()>& fn) {
  nax::Tensor keep;
  for (int i = 0; i < kOverheadBatchSize * 50; ++i) keep = fn();  // warm-up: allocator caches, branch predictors
  std::vector<double> per_call;
  per_call.reserve(kOverheadBatches);
  for (int batch = 0; batch < kOverheadBatches; ++batch) {
    const auto start = bench::Clock::now();
    for (int i = 0; i < kOverheadBatchSize; ++i) keep = fn();
    per_call.push_back(bench::seconds_between(start, bench::Clock::now()) / kOverheadBatchSize);
  }
  return {std::move(op), bench::median(std::move(per_call)) * 1e6};
}

std::vector<OverheadRow> run_overhead_cases() {
  const nax::Tensor a = random_input({{"i", 16}}, "a"), b = random_input({{"i", 16}}, "b");
  const nax::Tensor v = random_input({{"k", 4}}, "v"), m = random_input({{"k", 4}, {"n", 4}}, "m");
  return {time_tiny_op("a + b  (f32[i=16] + f32[i=16])", [&] { return a + b; }),
          time_tiny_op("dot(f32[k=4], f32[k=4,n=4], k)", [&] { return nax::dot(v, m, "k"); }),
          time_tiny_op("sum(f32[i=16], i)", [&] { return nax::sum(a, "i"); })};
}

// --- output ---

void print_gemm_table(const std::vector<GemmRow>& rows) {
  fmt::print("(a) dot vs cblas_sgemm, f32, 1 BLAS thread (GFLOP/s, median of reps)\n");
  fmt::print("{:<18}{:>8}{:>6}{:>12}{:>14}{:>11}{:>12}   {}\n", "case", "GFLOP", "reps", "nax GF/s", "cblas GF/s",
             "nax/cblas", "max|diff|", "shapes");
  for (const auto& r : rows)
    fmt::print("{:<18}{:>8.3f}{:>6}{:>12.1f}{:>14.1f}{:>10.1f}%{:>12.2e}   {}\n", r.name, r.flops / 1e9, r.reps, r.nax_gflops,
               r.cblas_gflops, 100 * r.ratio(), r.max_abs_diff, r.shapes);
}

void print_overhead_table(const std::vector<OverheadRow>& rows) {
  fmt::print("\n(b) per-op overhead on tiny tensors (median over {} batches of {} calls)\n", kOverheadBatches, kOverheadBatchSize);
  fmt::print("{:<36}{:>10}\n", "op", "us/op");
  for (const auto& r : rows) fmt::print("{:<36}{:>10.3f}\n", r.op, r.us_per_op);
}

struct Goals {
  double min_dot_ratio = INFINITY;
  std::vector<std::string> dot_cases;  // the rows the dot goal covers
  double add_us = 0;
  bool dot_met() const { return !dot_cases.empty() && min_dot_ratio >= kDotGoalRatio; }
  bool add_met() const { return add_us <= kOverheadGoalUs; }
};

Goals check_goals(const std::vector<GemmRow>& gemm, const std::vector<OverheadRow>& overhead) {
  Goals goals;
  for (const auto& r : gemm)
    if (r.flops >= kGoalFlops) {
      goals.min_dot_ratio = std::min(goals.min_dot_ratio, r.ratio());
      goals.dot_cases.push_back(r.name);
    }
  goals.add_us = overhead.front().us_per_op;
  return goals;
}

void print_goals(const Goals& g) {
  fmt::print("\ndot >= 90% of cblas_sgemm from 1024^3 up ({}): min {:.1f}%: {}\n", fmt::join(g.dot_cases, ", "),
             100 * g.min_dot_ratio, g.dot_met() ? "MET" : "NOT MET");
  fmt::print("a + b on 16 f32 <= 3 us per op: {:.3f} us: {}\n", g.add_us, g.add_met() ? "MET" : "NOT MET");
}

void write_json(const std::string& path, const std::vector<GemmRow>& gemm, const std::vector<OverheadRow>& overhead, const Goals& g) {
  std::vector<bench::JsonObject> gemm_json, overhead_json;
  for (const auto& r : gemm)
    gemm_json.push_back(bench::JsonObject()
                            .add("case", r.name)
                            .add("shapes", r.shapes)
                            .add("flops", r.flops)
                            .add("reps", r.reps)
                            .add("nax_gflops", r.nax_gflops)
                            .add("cblas_gflops", r.cblas_gflops)
                            .add("ratio", r.ratio())
                            .add("max_abs_diff", r.max_abs_diff));
  for (const auto& r : overhead) overhead_json.push_back(bench::JsonObject().add("op", r.op).add("us_per_op", r.us_per_op));
  bench::JsonObject goals;
  goals.add("dot_min_ratio_from_1024_cubed", g.min_dot_ratio).add("dot_goal_ratio", kDotGoalRatio).add("dot_met", g.dot_met());
  goals.add("add_us_per_op", g.add_us).add("add_goal_us", kOverheadGoalUs).add("add_met", g.add_met());
  bench::write_text_file(path, fmt::format("{{\n  \"where\": \"device 0 of Runtime::local(x=1), blas_threads=1\",\n"
                                           "  \"goals\": {},\n  \"gemm\": {},\n  \"overhead\": {}\n}}\n",
                                           goals.str(), bench::json_array(gemm_json), bench::json_array(overhead_json)));
}

void print_help() {
  fmt::print(
      "usage: bench_ops [--json FILE]\n"
      "(a) nax::dot against direct cblas_sgemm on the same inputs (square 256..2048, an attention-score\n"
      "    contraction with batch axes, an MLP projection), one BLAS thread, GFLOP/s and ratio;\n"
      "(b) the per-op overhead of a + b, a tiny dot and a tiny sum, in microseconds.\n"
      "Runs on device 0 of Runtime::local(x=1) with blas_threads = 1.\n"
      "  --json FILE also write the results as JSON\n");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string json_path;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") return print_help(), 0;
      if (arg == "--json") json_path = bench::flag_value(argc, argv, i);
      else throw nax::Error(fmt::format("unknown argument '{}' (try --help)", arg));
    }
    nax::Runtime rt = nax::Runtime::local(nax::Mesh::parse("x=1"), {.blas_threads = 1});
    fmt::print("nax ops on device 0 of Runtime::local(x=1), blas_threads = 1; cblas called on the same thread\n\n");
    const auto gemm = rt.run([](nax::Shard&) { return run_gemm_cases(); })[0];
    print_gemm_table(gemm);
    std::fflush(stdout);
    const auto overhead = rt.run([](nax::Shard&) { return run_overhead_cases(); })[0];
    print_overhead_table(overhead);
    const Goals goals = check_goals(gemm, overhead);
    print_goals(goals);
    if (!json_path.empty()) write_json(json_path, gemm, overhead, goals);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_ops: {}\n", e.what());
    return 2;
  }
}
