// bench_attention: the fused causal_attention (forward + backward) against what it sits on.
// For batch 1, heads 8, head_dim 64 and each sequence length, in f32 with one BLAS thread:
//  - nax: forward alone (no tape), and forward + backward (grad of a weighted sum of the output);
//    GFLOP/s with the causal count, 4 T^2 D heads / 2 for the forward GEMMs and twice that for the
//    backward ones;
//  - cblas: the same six GEMMs per head done by cblas_sgemm on the full, unmasked [T x T]
//    matrices (scores, p v; dv, dp, dq, dk), as the rate BLAS gives these shapes; GFLOP/s with the
//    full count, and the ratio of the times nax / cblas (the causal op could reach 0.5);
//  - the peak bytes the device allocator held during forward + backward above the inputs, against
//    one [heads x T x T] f32 tensor of scores.
// Timings are medians of repetitions, nax and cblas interleaved.
//
//   build/bin/bench_attention [--seq 256,512,1024] [--json FILE]
#include <cblas.h>
#include <nax/nax.h>

#include <fmt/format.h>

#include <vector>

#include "bench_util.h"

namespace {

constexpr std::int64_t kBatch = 1, kHeads = 8, kHeadDim = 64;
constexpr double kFlopsPerCase = 2e10;  // sets the repetitions
constexpr int kMinReps = 9, kMaxReps = 100;

struct Row {
  std::int64_t seq = 0;
  int reps = 0;
  double forward_s = 0, total_s = 0, cblas_s = 0;
  double causal_flops = 0, full_flops = 0;  // forward + backward
  double peak_bytes = 0, scores_bytes = 0;
  double nax_gflops() const { return causal_flops / total_s / 1e9; }
  double cblas_gflops() const { return full_flops / cblas_s / 1e9; }
  double ratio() const { return total_s / cblas_s; }
};

// The six GEMMs of attention's forward and backward for every head on full [T x T] matrices,
// reading q, k, v and dout in the [seq, heads, head_dim] layout the nax op gets.
struct CblasAttention {
  std::int64_t seq;
  std::vector<float> q, k, v, dout, out, dq, dk, dv, scores, dscores;

  explicit CblasAttention(std::int64_t t)
      : seq(t), q(size(t)), k(size(t)), v(size(t)), dout(size(t)), out(size(t)), dq(size(t)), dk(size(t)), dv(size(t)),
        scores(static_cast<std::size_t>(t * t)), dscores(scores.size()) {
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = k[i] = v[i] = dout[i] = static_cast<float>(i % 7) * 0.01f;
    for (std::size_t i = 0; i < scores.size(); ++i) scores[i] = dscores[i] = static_cast<float>(i % 5) * 0.001f;
  }
  static std::size_t size(std::int64_t t) { return static_cast<std::size_t>(kBatch * t * kHeads * kHeadDim); }

  void run() {
    const int t = static_cast<int>(seq), d = static_cast<int>(kHeadDim), ld = static_cast<int>(kHeads * kHeadDim);
    auto gemm = [&](CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int kk, const float* a, int lda, const float* b, int ldb,
                    float* c, int ldc) { cblas_sgemm(CblasRowMajor, ta, tb, m, n, kk, 1.0f, a, lda, b, ldb, 0.0f, c, ldc); };
    const auto N = CblasNoTrans, T = CblasTrans;
    for (std::int64_t h = 0; h < kHeads; ++h) {
      const std::ptrdiff_t at = h * kHeadDim;
      gemm(N, T, t, t, d, q.data() + at, ld, k.data() + at, ld, scores.data(), t);         // scores = q k^T
      gemm(N, N, t, d, t, scores.data(), t, v.data() + at, ld, out.data() + at, ld);       // out = p v
      gemm(T, N, t, d, t, scores.data(), t, dout.data() + at, ld, dv.data() + at, ld);     // dv = p^T do
      gemm(N, T, t, t, d, dout.data() + at, ld, v.data() + at, ld, dscores.data(), t);     // dp = do v^T
      gemm(N, N, t, d, t, dscores.data(), t, k.data() + at, ld, dq.data() + at, ld);       // dq = ds k
      gemm(T, N, t, d, t, dscores.data(), t, q.data() + at, ld, dk.data() + at, ld);       // dk = ds^T q
    }
  }
};

Row time_case(nax::Shard& shard, std::int64_t seq) {
  const nax::Shape shape{{"batch", kBatch}, {"seq", seq}, {"heads", kHeads}, {"head_dim", kHeadDim}};
  const nax::Tensor q = nax::parameter(nax::random_normal(shape, 1, "q")), k = nax::parameter(nax::random_normal(shape, 2, "k"));
  const nax::Tensor v = nax::parameter(nax::random_normal(shape, 3, "v")), w = nax::random_normal(shape, 4, "w");
  auto forward = [&] {
    nax::NoGrad no_grad;
    return nax::causal_attention(q, k, v, "seq", "head_dim");
  };
  auto forward_backward = [&] {
    const nax::Tensor out = nax::causal_attention(q, k, v, "seq", "head_dim");
    return nax::grad(nax::sum(out * w, out.shape().names()), {q, k, v});
  };
  CblasAttention cblas(seq);

  Row row;
  row.seq = seq;
  const double gemm_flops = 2.0 * static_cast<double>(seq * seq * kHeadDim * kHeads * kBatch);  // one full T x T x D GEMM per head
  row.full_flops = 6 * gemm_flops;
  row.causal_flops = row.full_flops / 2;
  row.scores_bytes = static_cast<double>(kBatch * kHeads * seq * seq) * sizeof(float);
  row.reps = std::clamp(static_cast<int>(kFlopsPerCase / row.full_flops), kMinReps, kMaxReps);

  forward_backward(), cblas.run();  // warm-up: allocator caches, BLAS buffers
  const std::size_t inputs = shard.memory().bytes_in_use;
  shard.device_ptr()->allocator().reset_peak();
  forward_backward();
  row.peak_bytes = static_cast<double>(shard.memory().peak_bytes_in_use - inputs);

  std::vector<double> forward_times, total_times, cblas_times;
  for (int r = 0; r < row.reps; ++r) {
    forward_times.push_back(bench::seconds_of(forward));
    total_times.push_back(bench::seconds_of(forward_backward));
    cblas_times.push_back(bench::seconds_of([&] { cblas.run(); }));
  }
  row.forward_s = bench::median(forward_times);
  row.total_s = bench::median(total_times);
  row.cblas_s = bench::median(cblas_times);
  return row;
}

void print_table(const std::vector<Row>& rows) {
  fmt::print("causal_attention f32, batch {}, heads {}, head_dim {}, 1 BLAS thread (medians)\n", kBatch, kHeads, kHeadDim);
  fmt::print("{:>6}{:>6}{:>10}{:>14}{:>12}{:>15}{:>13}{:>11}{:>11}{:>12}\n", "seq", "reps", "fwd ms", "fwd+bwd ms", "nax GF/s",
             "cblas full ms", "cblas GF/s", "nax/cblas", "peak MiB", "scores MiB");
  for (const auto& r : rows)
    fmt::print("{:>6}{:>6}{:>10.2f}{:>14.2f}{:>12.1f}{:>15.2f}{:>13.1f}{:>11.2f}{:>11.2f}{:>12.2f}\n", r.seq, r.reps, 1e3 * r.forward_s,
               1e3 * r.total_s, r.nax_gflops(), 1e3 * r.cblas_s, r.cblas_gflops(), r.ratio(), r.peak_bytes / (1 << 20),
               r.scores_bytes / (1 << 20));
  fmt::print("nax GF/s counts the causal half (4 T^2 D heads / 2 forward, twice that backward); cblas GF/s the full GEMMs it ran.\n"
             "nax/cblas: time of fused forward+backward over the time of the six full GEMMs per head.\n"
             "peak: allocator bytes above the inputs during forward+backward; scores: one [heads x T x T] f32 tensor.\n");
}

void write_json(const std::string& path, const std::vector<Row>& rows) {
  std::vector<bench::JsonObject> items;
  for (const auto& r : rows)
    items.push_back(bench::JsonObject()
                        .add("seq", r.seq)
                        .add("batch", kBatch)
                        .add("heads", kHeads)
                        .add("head_dim", kHeadDim)
                        .add("reps", r.reps)
                        .add("forward_s", r.forward_s)
                        .add("forward_backward_s", r.total_s)
                        .add("causal_flops", r.causal_flops)
                        .add("nax_gflops", r.nax_gflops())
                        .add("cblas_full_gemms_s", r.cblas_s)
                        .add("full_flops", r.full_flops)
                        .add("cblas_gflops", r.cblas_gflops())
                        .add("time_ratio_nax_over_cblas", r.ratio())
                        .add("peak_bytes_above_inputs", r.peak_bytes)
                        .add("scores_bytes", r.scores_bytes));
  bench::write_text_file(path, fmt::format("{{\n  \"where\": \"device 0 of Runtime::local(x=1), blas_threads=1, f32\",\n"
                                           "  \"attention\": {}\n}}\n",
                                           bench::json_array(items)));
}

void print_help() {
  fmt::print(
      "usage: bench_attention [--seq 256,512,1024] [--json FILE]\n"
      "Forward and forward+backward time of nax::causal_attention (batch 1, heads 8, head_dim 64, f32)\n"
      "against cblas_sgemm running its six GEMMs per head on full [T x T] matrices, one BLAS thread;\n"
      "GFLOP/s, the time ratio, and the allocator's peak bytes during forward+backward.\n"
      "  --seq LIST  sequence lengths (default 256,512,1024)\n"
      "  --json FILE also write the results as JSON\n");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string json_path;
    std::vector<std::int64_t> seqs = {256, 512, 1024};
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") return print_help(), 0;
      if (arg == "--json") json_path = bench::flag_value(argc, argv, i);
      else if (arg == "--seq") seqs = bench::parse_integer_list(bench::flag_value(argc, argv, i), "--seq");
      else throw nax::Error(fmt::format("unknown argument '{}' (try --help)", arg));
    }
    for (auto s : seqs)
      if (s < 1) throw nax::Error(fmt::format("--seq: lengths must be positive, got {}", s));
    nax::Runtime rt = nax::Runtime::local(nax::Mesh::parse("x=1"), {.blas_threads = 1});
    const auto rows = rt.run([&](nax::Shard& shard) {
      std::vector<Row> out;
      for (auto seq : seqs) out.push_back(time_case(shard, seq));
      return out;
    })[0];
    print_table(rows);
    if (!json_path.empty()) write_json(json_path, rows);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_attention: {}\n", e.what());
    return 2;
  }
}
