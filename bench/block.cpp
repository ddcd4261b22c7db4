// Forward+backward time of one GPT-J block (examples/gptj/block.h) on one device, against the time
// of just its GEMMs done with cblas_sgemm on the same sizes in the same run: the overhead ratio of
// everything that is not a GEMM (goal <= 1.4x at d_model >= 512, seq >= 256). Also the peak memory
// of forward+backward against the parameters, their gradients and the activations that must be
// kept for the backward pass.
//
//   build/bin/bench_block [--reps N] [--json FILE]
#include <cblas.h>
#include <fmt/format.h>

#include "block.h"
#include "bench_util.h"

using namespace nax;

namespace {

struct Case {
  std::string name;
  gptj::BlockConfig config;
  std::int64_t batch, seq;
};

struct Gemm {
  std::int64_t m, n, k, count;
};

// The GEMMs of one block's forward and backward (attention on the full, unmasked matrices).
std::vector<Gemm> block_gemms(const Case& c) {
  const auto& b = c.config;
  const std::int64_t tokens = c.batch * c.seq, inner = b.n_heads * b.head_dim, heads = c.batch * b.n_heads;
  std::vector<Gemm> forward = {{tokens, inner, b.d_model, 3}, {tokens, b.d_model, inner, 1}, {tokens, b.d_ff, b.d_model, 1},
                               {tokens, b.d_model, b.d_ff, 1}, {c.seq, c.seq, b.head_dim, heads}, {c.seq, b.head_dim, c.seq, heads}};
  std::vector<Gemm> all;
  for (const auto& g : forward) {
    all.push_back(g);
    all.push_back({g.m, g.n, g.k, 2 * g.count});  // backward: one GEMM per operand
  }
  all.push_back({c.seq, c.seq, b.head_dim, heads});  // the backward recomputes the scores
  return all;
}

double gemm_seconds(const std::vector<Gemm>& gemms, int reps) {
  double total = 0;
  for (const auto& g : gemms) {
    std::vector<float> a(static_cast<std::size_t>(g.m * g.k), 0.5f), b(static_cast<std::size_t>(g.k * g.n), 0.25f),
        c(static_cast<std::size_t>(g.m * g.n));
    auto one = [&] {
      for (std::int64_t i = 0; i < g.count; ++i)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k),
                    1.0f, a.data(), static_cast<int>(g.k), b.data(), static_cast<int>(g.n), 0.0f, c.data(), static_cast<int>(g.n));
    };
    one();
    total += bench::median_seconds(reps, one);
  }
  return total;
}

double gemm_flops(const std::vector<Gemm>& gemms) {
  double f = 0;
  for (const auto& g : gemms) f += 2.0 * static_cast<double>(g.m * g.n * g.k * g.count);
  return f;
}

// Bytes of what the backward pass must find: parameters and gradients, and the activations
// x, ln(x), q, k, v, the attention output, the MLP pre-activation and GELU output, row stats.
double needed_bytes(const Case& c) {
  const auto& b = c.config;
  const double tokens = static_cast<double>(c.batch * c.seq), inner = static_cast<double>(b.n_heads * b.head_dim);
  double params = 0;
  for (const auto& [name, shape] : gptj::block_parameter_shapes(b)) params += static_cast<double>(shape.numel());
  const double activations = tokens * (2.0 * static_cast<double>(b.d_model) + 4 * inner + 2.0 * static_cast<double>(b.d_ff) + 3);
  return 4.0 * (2 * params + activations);
}

struct Measured {
  double block_s, gemm_s, peak_bytes;
};

Measured measure(const Case& c, int reps) {
  Runtime rt = Runtime::local(Mesh::parse("dp=1,mp=1"), {.blas_threads = 1});
  openblas_set_num_threads(1);
  const Shape input{{"batch", c.batch}, {"seq", c.seq}, {"embed", c.config.d_model}};
  return rt.run([&](Shard& s) {
    const AxisRules rules = gptj::block_rules(s.mesh());
    std::vector<Tensor> params;
    for (const auto& [name, shape] : gptj::block_parameter_shapes(c.config))
      params.push_back(parameter(s.random_normal(shape, rules, 1, name, 0.02)));
    Tensor x = s.random_normal(input, rules, 2, "x");
    auto step = [&] {
      Tensor y = gptj::block(gptj::BlockParams::from(params), x, c.config);
      auto grads = grad(sum(y, {"batch", "seq", "embed"}), params, {.allow_varying_loss = true});  // timing only
    };
    step();
    const auto before = s.memory().bytes_in_use;
    s.device_ptr()->allocator().reset_peak();
    step();
    const double peak = static_cast<double>(s.memory().peak_bytes_in_use - before) + static_cast<double>(before);
    const double block_s = bench::median_seconds(reps, step);
    return Measured{block_s, gemm_seconds(block_gemms(c), reps), peak};
  })[0];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int reps = 5;
    std::string json_path;
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        fmt::print("usage: bench_block [--reps N] [--json FILE]\n"
                   "Times forward+backward of one GPT-J block against just its GEMMs (cblas_sgemm), one thread.\n");
        return 0;
      }
      if (arg == "--reps") reps = static_cast<int>(bench::parse_integer(bench::flag_value(argc, argv, i), "--reps"));
      else if (arg == "--json") json_path = bench::flag_value(argc, argv, i);
      else fail("bench_block", "unknown argument '{}' (try --help)", arg);
    }
    const std::vector<Case> cases = {
        {"small", {.d_model = 256, .n_heads = 4, .head_dim = 64, .d_ff = 1024, .rotary_dims = 32}, 1, 128},
        {"medium", {.d_model = 512, .n_heads = 8, .head_dim = 64, .d_ff = 2048, .rotary_dims = 32}, 1, 256},
        {"medium-long", {.d_model = 512, .n_heads = 8, .head_dim = 64, .d_ff = 2048, .rotary_dims = 32}, 1, 512},
    };
    fmt::print("{:<12} {:>8} {:>6} {:>10} {:>10} {:>9} {:>10} {:>12} {:>12} {:>8}\n", "case", "d_model", "seq", "block_ms", "gemm_ms",
               "overhead", "GEMM GF/s", "peak MiB", "needed MiB", "ratio");
    std::vector<bench::JsonObject> rows;
    for (const auto& c : cases) {
      Measured m = measure(c, reps);
      const double flops = gemm_flops(block_gemms(c)), need = needed_bytes(c);
      fmt::print("{:<12} {:>8} {:>6} {:>10.2f} {:>10.2f} {:>8.2f}x {:>10.1f} {:>12.1f} {:>12.1f} {:>7.2f}x\n", c.name, c.config.d_model, c.seq,
                 m.block_s * 1e3, m.gemm_s * 1e3, m.block_s / m.gemm_s, flops / m.gemm_s * 1e-9, m.peak_bytes / 1048576.0,
                 need / 1048576.0, m.peak_bytes / need);
      rows.push_back(bench::JsonObject()
                         .add("case", c.name)
                         .add("d_model", c.config.d_model)
                         .add("seq", c.seq)
                         .add("block_s", m.block_s)
                         .add("gemm_s", m.gemm_s)
                         .add("overhead", m.block_s / m.gemm_s)
                         .add("peak_bytes", m.peak_bytes)
                         .add("needed_bytes", need));
    }
    fmt::print("goal: overhead <= 1.4x at d_model >= 512, seq >= 256\n");
    if (!json_path.empty()) bench::write_text_file(json_path, bench::json_array(rows) + "\n");
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
