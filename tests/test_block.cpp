// The GPT-J block (parallel residual, one psum) and the Megatron-style block (two psums): on one
// device, output and parameter gradients against an independent float64 host implementation (plain
// loops, gradients by central differences); on mp=1, 2, 4 and dp=2,mp=2, the same output and
// gradients as on one device: 1e-6 relative in f64, 1e-4 in f32. With sequence parallelism (x cut
// along seq over mp) both blocks give the one-device results too, and the GPT-J block trades its
// all-reduces for one reduce-scatter and one all-gather each way.
#include <cmath>
#include <functional>

#include "block.h"
#include "helpers.h"

using namespace nax;

namespace {

const gptj::BlockConfig kConfig{.d_model = 16, .n_heads = 4, .head_dim = 4, .d_ff = 32, .rotary_dims = 2};
const Shape kInput{{"batch", 2}, {"seq", 6}, {"embed", 16}};

struct Result {
  std::vector<double> output;
  std::vector<std::vector<double>> grads;
  std::vector<std::vector<double>> params;  // gathered, in the order of block_parameter_shapes
  std::vector<double> x, w;                  // the input and the loss weights, gathered
};

// --- the float64 host reference: plain loops over the global, row-major layouts ---

using Vec = std::vector<double>;
constexpr std::int64_t kBatch = 2, kSeq = 6;

// [rows, d] LayerNorm over the last axis (biased variance), then scale and shift.
Vec host_layer_norm(const Vec& x, const Vec& scale, const Vec& bias, double eps) {
  const std::int64_t d = kConfig.d_model, rows = static_cast<std::int64_t>(x.size()) / d;
  Vec out(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (std::int64_t e = 0; e < d; ++e) mean += x[r * d + e] / d;
    for (std::int64_t e = 0; e < d; ++e) var += (x[r * d + e] - mean) * (x[r * d + e] - mean) / d;
    for (std::int64_t e = 0; e < d; ++e) out[r * d + e] = (x[r * d + e] - mean) / std::sqrt(var + eps) * scale[e] + bias[e];
  }
  return out;
}

// h [batch, seq, embed] times a [heads, head_dim, embed] weight: [batch, seq, heads, head_dim].
Vec host_project(const Vec& h, const Vec& weight) {
  const std::int64_t d = kConfig.d_model, hd = kConfig.n_heads * kConfig.head_dim, rows = kBatch * kSeq;
  Vec out(static_cast<std::size_t>(rows * hd));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < hd; ++o)
      for (std::int64_t e = 0; e < d; ++e) out[r * hd + o] += h[r * d + e] * weight[o * d + e];
  return out;
}

// GPT-J's rotate_every_two on the first rotary_dims of head_dim, base 10000, positions from 0.
void host_rotary(Vec& t) {
  const std::int64_t heads = kConfig.n_heads, hd = kConfig.head_dim, rot = kConfig.rotary_dims;
  for (std::int64_t b = 0; b < kBatch; ++b)
    for (std::int64_t p = 0; p < kSeq; ++p)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t pair = 0; pair < rot / 2; ++pair) {
          double* v = &t[static_cast<std::size_t>(((b * kSeq + p) * heads + h) * hd + 2 * pair)];
          const double angle = static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(pair) / static_cast<double>(rot));
          const double x0 = v[0], x1 = v[1];
          v[0] = x0 * std::cos(angle) - x1 * std::sin(angle);
          v[1] = x1 * std::cos(angle) + x0 * std::sin(angle);
        }
}

// Causal softmax attention per (batch, head), scale 1/sqrt(head_dim), then the output projection.
Vec host_attention(const Vec& h, const std::vector<Vec>& p) {
  Vec q = host_project(h, p[2]), k = host_project(h, p[3]), v = host_project(h, p[4]);
  host_rotary(q);
  host_rotary(k);
  const std::int64_t heads = kConfig.n_heads, hd = kConfig.head_dim, d = kConfig.d_model;
  auto at = [&](std::int64_t b, std::int64_t s, std::int64_t head, std::int64_t j) { return static_cast<std::size_t>(((b * kSeq + s) * heads + head) * hd + j); };
  Vec mixed(q.size());
  for (std::int64_t b = 0; b < kBatch; ++b)
    for (std::int64_t head = 0; head < heads; ++head)
      for (std::int64_t i = 0; i < kSeq; ++i) {
        Vec score(static_cast<std::size_t>(i + 1));
        double top = -INFINITY, total = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          for (std::int64_t c = 0; c < hd; ++c) score[j] += q[at(b, i, head, c)] * k[at(b, j, head, c)] / std::sqrt(static_cast<double>(hd));
          top = std::max(top, score[j]);
        }
        for (double& sc : score) total += sc = std::exp(sc - top);
        for (std::int64_t j = 0; j <= i; ++j)
          for (std::int64_t c = 0; c < hd; ++c) mixed[at(b, i, head, c)] += score[j] / total * v[at(b, j, head, c)];
      }
  Vec out(static_cast<std::size_t>(kBatch * kSeq * d));  // out_proj: [embed, heads, head_dim]
  for (std::int64_t r = 0; r < kBatch * kSeq; ++r)
    for (std::int64_t e = 0; e < d; ++e)
      for (std::int64_t o = 0; o < heads * hd; ++o) out[r * d + e] += mixed[r * heads * hd + o] * p[5][e * heads * hd + o];
  return out;
}

// gelu(h fc_in^T + b_in) fc_out^T, GELU in its tanh form; without fc_out's bias.
Vec host_mlp(const Vec& h, const std::vector<Vec>& p) {
  const std::int64_t d = kConfig.d_model, ff = kConfig.d_ff, rows = kBatch * kSeq;
  Vec out(static_cast<std::size_t>(rows * d));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t m = 0; m < ff; ++m) {
      double u = p[7][m];
      for (std::int64_t e = 0; e < d; ++e) u += h[r * d + e] * p[6][m * d + e];
      const double g = 0.5 * u * (1 + std::tanh(std::sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)));
      for (std::int64_t e = 0; e < d; ++e) out[r * d + e] += g * p[8][e * ff + m];
    }
  return out;
}

Vec host_block(const std::vector<Vec>& p, const Vec& x, bool megatron) {
  const std::int64_t d = kConfig.d_model;
  auto add = [&](Vec a, const Vec& b) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    return a;
  };
  auto plus_bias = [&](Vec a) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] += p[9][i % static_cast<std::size_t>(d)];
    return a;
  };
  auto ln = [&](const Vec& v) { return host_layer_norm(v, p[0], p[1], kConfig.layer_norm_eps); };
  if (!megatron) {
    const Vec h = ln(x);
    return plus_bias(add(add(x, host_attention(h, p)), host_mlp(h, p)));
  }
  const Vec a = add(x, host_attention(ln(x), p));
  return plus_bias(add(a, host_mlp(ln(a), p)));
}

double host_loss(const std::vector<Vec>& p, const Vec& x, const Vec& w, bool megatron) {
  const Vec y = host_block(p, x, megatron);
  double loss = 0;
  for (std::size_t i = 0; i < y.size(); ++i) loss += y[i] * w[i];
  return loss;
}

// The one-device result against the host reference: the output to rounding, every element of
// every parameter's gradient against a central difference of the host loss.
void require_matches_host(const Result& got, bool megatron) {
  nax::testing::require_close(got.output, host_block(got.params, got.x, megatron), 1e-12);
  for (std::size_t j = 0; j < got.params.size(); ++j) {
    INFO("gradient of " << gptj::block_parameter_shapes(kConfig)[j].first);
    std::vector<Vec> p = got.params;
    Vec fd(p[j].size());
    for (std::size_t i = 0; i < p[j].size(); ++i) {
      const double step = 1e-5 * std::max(1.0, std::abs(got.params[j][i]));
      p[j][i] = got.params[j][i] + step;
      const double up = host_loss(p, got.x, got.w, megatron);
      p[j][i] = got.params[j][i] - step;
      const double down = host_loss(p, got.x, got.w, megatron);
      p[j][i] = got.params[j][i];
      fd[i] = (up - down) / (2 * step);
    }
    nax::testing::require_close(got.grads[j], fd, 1e-6);
  }
}

using BlockFn = Tensor (*)(const gptj::BlockParams&, const Tensor&, const gptj::BlockConfig&, gptj::KVCache*);

// The block's parameters, and with sequence parallelism its input and output, cut along seq over mp.
AxisRules input_rules(const Mesh& mesh, bool sequence_parallel) {
  AxisRules rules = gptj::block_rules(mesh);
  if (sequence_parallel) rules.set("seq", {"mp"});
  return rules;
}

// Runs the block on `spec` and returns the gathered output and parameter gradients of
// loss = sum(output * weights).
Result run_block(const std::string& spec, DType dtype, BlockFn fn, bool sequence_parallel = false, bool deterministic = false) {
  RuntimeOptions options;
  options.deterministic = deterministic;
  Runtime rt = Runtime::local(Mesh::parse(spec), options);
  const AxisRules rules = input_rules(rt.mesh(), sequence_parallel);
  gptj::BlockConfig config = kConfig;
  config.sequence_parallel = sequence_parallel;
  config.deterministic = deterministic;
  const auto shapes = gptj::block_parameter_shapes(kConfig);
  return rt.run([&](Shard& s) {
    std::vector<Tensor> params;
    for (const auto& [name, shape] : shapes) {
      const bool is_scale = name == "ln_1.weight";
      Tensor p = s.random_normal(shape, rules, 5, name, is_scale ? 0.1 : 0.3, dtype);
      params.push_back(parameter(is_scale ? p + 1.0 : p));
    }
    Tensor x = s.random_normal(kInput, rules, 6, "x", 1.0, dtype);
    Tensor w = s.random_normal(kInput, rules, 7, "w", 1.0, dtype);
    // the gradients of loss = sum(y * w): the pullback of w (no sum over rows cut along seq, which
    // deterministic mode refuses)
    const Vjp block = vjp([&](const std::vector<Tensor>& p) { return std::vector<Tensor>{fn(gptj::BlockParams::from(p), x, config, nullptr)}; },
                          params);
    const Tensor& y = block.outputs[0];
    const std::vector<Tensor> grads = block.pullback({w});
    Result r{s.gather(y).to_vector<double>(), {}, {}, s.gather(x).to_vector<double>(), s.gather(w).to_vector<double>()};
    for (const auto& g : grads) r.grads.push_back(s.gather(g).to_vector<double>());
    for (const auto& p : params) r.params.push_back(s.gather(p).to_vector<double>());
    return r;
  })[0];
}

void require_same(const Result& got, const Result& want, double tol) {
  REQUIRE(nax::testing::max_rel_error(got.output, want.output) <= tol);
  for (std::size_t i = 0; i < want.grads.size(); ++i) {
    INFO("gradient of " << gptj::block_parameter_shapes(kConfig)[i].first);
    REQUIRE(nax::testing::max_rel_error(got.grads[i], want.grads[i]) <= tol);
  }
}

}  // namespace

// Both block layouts, f64 and f32: the 1x1 mesh against the host reference (f64), every mesh
// against the 1x1 mesh (with sequence parallelism: the meshes whose mp divides seq = 6).
void require_mesh_independent(BlockFn fn, bool megatron, bool sequence_parallel = false) {
  const std::vector<std::string> meshes = sequence_parallel ? std::vector<std::string>{"dp=1,mp=1", "dp=1,mp=2", "dp=2,mp=2"}
                                                            : std::vector<std::string>{"dp=1,mp=2", "dp=1,mp=4", "dp=2,mp=2"};
  for (auto [dtype, tol] : {std::pair{DType::f64, 1e-6}, std::pair{DType::f32, 1e-4}}) {
    Result serial = run_block("dp=1,mp=1", dtype, fn);
    if (dtype == DType::f64) require_matches_host(serial, megatron);
    for (const std::string& spec : meshes) {
      INFO("mesh " << spec << " dtype " << dtype_name(dtype) << (sequence_parallel ? " sequence parallel" : ""));
      require_same(run_block(spec, dtype, fn, sequence_parallel), serial, tol);
    }
  }
}

TEST_CASE("the GPT-J block matches a float64 host reference and gives the same output and gradients on every mesh", "[grad][block][mesh]") {
  require_mesh_independent(gptj::block, false);
}

TEST_CASE("the Megatron-style block matches a float64 host reference and agrees on every mesh", "[grad][block][mesh]") {
  require_mesh_independent(gptj::megatron_block, true);
}

TEST_CASE("with sequence parallelism the GPT-J block matches the host reference on every mesh", "[grad][block][mesh]") {
  require_mesh_independent(gptj::block, false, true);
}

TEST_CASE("with sequence parallelism the Megatron-style block matches the host reference on every mesh", "[grad][block][mesh]") {
  require_mesh_independent(gptj::megatron_block, true, true);
}

// Deterministic mode: with sequence parallelism each block layout gives one device's bits (its
// output and every gradient), as its sums over rows run over whole rows (block.h: normalized,
// output_bias).
TEST_CASE("with sequence parallelism in deterministic mode both blocks give one device's bits on every mesh", "[grad][block][mesh][deterministic]") {
  for (auto [fn, name] : {std::pair{BlockFn{gptj::block}, "gpt-j"}, std::pair{BlockFn{gptj::megatron_block}, "megatron"}}) {
    const Result serial = run_block("dp=1,mp=1", DType::f32, fn, false, true);  // the plain block
    for (const std::string spec : {"dp=1,mp=1", "dp=1,mp=2", "dp=2,mp=2"}) {
      INFO(name << " block on " << spec);
      const Result cut = run_block(spec, DType::f32, fn, true, true);
      nax::testing::require_close(cut.output, serial.output, 0.0);  // to the bit (a NaN anywhere fails)
      for (std::size_t i = 0; i < serial.grads.size(); ++i) {
        INFO("gradient of " << gptj::block_parameter_shapes(kConfig)[i].first);
        nax::testing::require_close(cut.grads[i], serial.grads[i], 0.0);
      }
    }
  }
}

// The collectives over mp (alone or with dp) that device 0 calls in one forward and backward of the
// GPT-J block on dp=1,mp=2 (the dp group of one device sums the weights' gradients, a copy).
CommStats block_calls_over_mp(bool sequence_parallel, std::int64_t overlap_pieces = 1) {
  Runtime rt = Runtime::local(Mesh::parse("dp=1,mp=2"));
  const AxisRules rules = input_rules(rt.mesh(), sequence_parallel);
  gptj::BlockConfig config = kConfig;
  config.sequence_parallel = sequence_parallel;
  config.overlap_pieces = overlap_pieces;
  auto over_mp = [&] {
    CommStats total;
    for (const auto& [axes, stats] : rt.comm_stats_by_axes(0))
      if (axes == "mp" || axes == "dp,mp") total += stats;
    return total;
  };
  const CommStats before = over_mp();
  rt.run([&](Shard& s) {
    std::vector<Tensor> params;
    for (const auto& [name, shape] : gptj::block_parameter_shapes(kConfig)) params.push_back(parameter(s.random_normal(shape, rules, 5, name, 0.3)));
    Tensor x = s.random_normal(kInput, rules, 6, "x");
    Tensor y = gptj::block(gptj::BlockParams::from(params), x, config, nullptr);
    grad(sum(y, {"batch", "seq", "embed"}), params, {.allow_varying_loss = true});  // a per-device loss: counts only
  });
  return over_mp() - before;
}

std::size_t calls_of(const CommStats& stats, CollectiveKind kind) { return stats.calls[static_cast<std::size_t>(kind)]; }

TEST_CASE("the GPT-J block all-reduces once forward and once backward", "[grad][block][mesh]") {
  // mesh-transformer-jax's count: the block's psum, and in the backward one psum of the gradient
  // of ln(x), which feeds q, k, v and the MLP (the implicit pvary's transpose, summed once).
  const CommStats calls = block_calls_over_mp(false);
  REQUIRE(calls_of(calls, CollectiveKind::all_reduce) == 2);
  REQUIRE(total_calls(calls) == 2);
}

TEST_CASE("with sequence parallelism the GPT-J block reduce-scatters and all-gathers once each way, or once per piece", "[grad][block][mesh]") {
  // Forward: the all_gather of ln(x) along seq and the psum_scatter of attention + MLP; backward,
  // their transposes. One all-reduce is left: the gradients of the LayerNorm and of the output
  // bias, which each device now sums over its block of seq only, summed over dp and mp in one bucket.
  const CommStats calls = block_calls_over_mp(true);
  INFO("all_reduce " << calls_of(calls, CollectiveKind::all_reduce) << ", reduce_scatter " << calls_of(calls, CollectiveKind::reduce_scatter)
                     << ", all_gather " << calls_of(calls, CollectiveKind::all_gather));
  REQUIRE(calls_of(calls, CollectiveKind::all_gather) == 2);
  REQUIRE(calls_of(calls, CollectiveKind::reduce_scatter) == 2);
  REQUIRE(calls_of(calls, CollectiveKind::all_reduce) == 1);
  REQUIRE(total_calls(calls) == 5);
  // In pieces of the batch (the default mode's overlap): a gather and a reduce-scatter per piece
  // each way, the same bytes.
  const CommStats pieces = block_calls_over_mp(true, 2);
  REQUIRE(calls_of(pieces, CollectiveKind::all_gather) == 4);
  REQUIRE(calls_of(pieces, CollectiveKind::reduce_scatter) == 4);
  REQUIRE(calls_of(pieces, CollectiveKind::all_reduce) == 1);
  REQUIRE(pieces.bytes == calls.bytes);
}
