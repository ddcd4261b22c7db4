// Mesh independence at block level: the GPT-J block (parallel residual, one psum) and the
// Megatron-style block (two psums) give the same output and the same parameter gradients on
// mp=1, 2, 4 and dp=2,mp=2 as on one device: 1e-6 relative in f64, 1e-4 in f32.
#include "block.h"
#include "helpers.h"

using namespace nax;

namespace {

const gptj::BlockConfig kConfig{.d_model = 16, .n_heads = 4, .head_dim = 4, .d_ff = 32, .rotary_dims = 2};
const Shape kInput{{"batch", 2}, {"seq", 6}, {"embed", 16}};

struct Result {
  std::vector<double> output;
  std::vector<std::vector<double>> grads;
};

using BlockFn = Tensor (*)(const gptj::BlockParams&, const Tensor&, const gptj::BlockConfig&, gptj::KVCache*);

// Runs the block on `spec` and returns the gathered output and parameter gradients of
// loss = sum(output * weights).
Result run_block(const std::string& spec, DType dtype, BlockFn fn) {
  Runtime rt = Runtime::local(Mesh::parse(spec));
  const AxisRules rules = gptj::block_rules(rt.mesh());
  const auto shapes = gptj::block_parameter_shapes(kConfig);
  return rt.run([&](Shard& s) {
    std::vector<Tensor> params;
    for (const auto& [name, shape] : shapes) {
      const bool is_scale = name == "ln_1.weight";
      Tensor p = s.random_normal(shape, rules, 5, name, is_scale ? 0.1 : 0.3, dtype);
      params.push_back(parameter(is_scale ? p + 1.0 : p));
    }
    Tensor x = s.random_normal(kInput, rules, 6, "x", 1.0, dtype);
    Tensor y = fn(gptj::BlockParams::from(params), x, kConfig, nullptr);
    Tensor w = s.random_normal(kInput, rules, 7, "w", 1.0, dtype);
    Tensor loss = sum(y * w, {"batch", "seq", "embed"});
    if (rt.mesh().has("dp")) loss = psum(loss, "dp");
    auto grads = grad(loss, params);
    Result r{s.gather(y).to_vector<double>(), {}};
    for (const auto& g : grads) r.grads.push_back(s.gather(g).to_vector<double>());
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

// Both block layouts, f64 and f32: every mesh against the 1x1 mesh.
void require_mesh_independent(BlockFn fn) {
  for (auto [dtype, tol] : {std::pair{DType::f64, 1e-6}, std::pair{DType::f32, 1e-4}}) {
    Result serial = run_block("dp=1,mp=1", dtype, fn);
    for (const std::string spec : {"dp=1,mp=2", "dp=1,mp=4", "dp=2,mp=2"}) {
      INFO("mesh " << spec << " dtype " << dtype_name(dtype));
      require_same(run_block(spec, dtype, fn), serial, tol);
    }
  }
}

TEST_CASE("the GPT-J block gives the same output and gradients on every mesh", "[grad][block][mesh]") {
  require_mesh_independent(gptj::block);
}

TEST_CASE("the Megatron-style block agrees with its serial reference", "[grad][block][mesh]") {
  require_mesh_independent(gptj::megatron_block);
}

TEST_CASE("the GPT-J block all-reduces once forward and once backward", "[grad][block][mesh]") {
  // mesh-transformer-jax's count: the block's psum, and in the backward one psum of the gradient
  // of ln(x), which feeds q, k, v and the MLP (the implicit pvary's transpose, summed once).
  Runtime rt = Runtime::local(Mesh::parse("dp=1,mp=2"));
  const AxisRules rules = gptj::block_rules(rt.mesh());
  auto count = [&] {  // over mp (the dp group of one device sums the weights' gradients, a copy)
    auto by_axes = rt.comm_stats_by_axes(0);
    return by_axes.count("mp") ? by_axes.at("mp").calls[static_cast<int>(CollectiveKind::all_reduce)] : 0;
  };
  const auto before = count();
  rt.run([&](Shard& s) {
    std::vector<Tensor> params;
    for (const auto& [name, shape] : gptj::block_parameter_shapes(kConfig)) params.push_back(parameter(s.random_normal(shape, rules, 5, name, 0.3)));
    Tensor x = s.random_normal(kInput, rules, 6, "x");
    Tensor y = gptj::block(gptj::BlockParams::from(params), x, kConfig, nullptr);
    grad(sum(y, {"batch", "seq", "embed"}), params, {.allow_varying_loss = true});  // a per-device loss: counts only
  });
  REQUIRE(count() - before == 2);
}

