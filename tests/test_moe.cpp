// The MoE example's layer (examples/moe/moe.h: top-k routing with capacity, all_to_all dispatch
// and combine over ep) against the f64 loops of examples/moe/reference.h, and its gradients (to
// the tokens, the router and both expert weights) against finite differences of the whole mesh
// program, for k = 1 and 2 on meshes ep=1, ep=2, ep=4 and dp=2,ep=2. The inputs are fixed so
// that every case drops some assignments over capacity and keeps others.
#include "grad_check.h"
#include "moe/moe.h"
#include "moe/reference.h"

using namespace nax;

namespace {

void check_moe(const std::string& spec, std::int64_t k) {
  INFO("mesh " << spec << ", k = " << k);
  moe::Config c;
  c.experts = 4;
  c.embed = 3;
  c.mlp = 2;
  c.k = k;
  c.capacity = k;
  const Mesh mesh = Mesh::parse(spec);
  const std::int64_t groups = mesh.size(), tokens = 4;
  const Shape x_shape{{"group", groups}, {"tokens", tokens}, {"embed", c.embed}};
  const std::uint64_t seed = 7;
  const Tensor x = random_normal(x_shape, seed, "x", 1.0, DType::f64);
  const Tensor router = random_normal(moe::router_shape(c), seed, "router", 1.0, DType::f64);
  const Tensor w_in = random_normal(moe::w_in_shape(c), seed, "w_in", 1.0, DType::f64);
  const Tensor w_out = random_normal(moe::w_out_shape(c), seed, "w_out", 1.0, DType::f64);
  const Tensor target = random_normal(x_shape, seed, "target", 1.0, DType::f64);
  const AxisRules rules = moe::rules(mesh);

  const auto want = moe::reference_layer(x.to_vector<double>(), groups, tokens, router.to_vector<double>(), w_in.to_vector<double>(),
                                         w_out.to_vector<double>(), c);
  INFO("dropped " << want.dropped << " of " << groups * tokens * k);
  REQUIRE(want.dropped > 0);
  REQUIRE(want.dropped < groups * tokens * k);

  Runtime rt = Runtime::local(mesh);
  const Tensor y = rt.run([&](Shard& s) {
    const Tensor local = moe::layer(s.shard(x, rules), {s.shard(router, rules), s.shard(w_in, rules), s.shard(w_out, rules)}, c);
    for (const auto& m : mesh.axis_names()) NAX_EXPECT(local.vary().kind(m) == Vary::Split);  // y is one group's block
    return s.gather(local);
  })[0];
  REQUIRE(y.shape() == x_shape);
  nax::testing::require_close(y, want.y, 1e-12);

  nax::testing::check_mesh_gradients(rt, [&](Shard& s, const std::vector<Tensor>& p) {
    const Tensor out = moe::layer(p[0], {p[1], p[2], p[3]}, c);
    return psum(sum(out * s.shard(target, rules), out.shape().names()), mesh.axis_names());
  }, {x, router, w_in, w_out}, rules);
}

}  // namespace

TEST_CASE("MoE with top-1 routing matches the f64 loops, gradients match finite differences", "[moe][mesh]") {
  for (const std::string spec : {"ep=1", "ep=2", "ep=4", "dp=2,ep=2"}) check_moe(spec, 1);
}

TEST_CASE("MoE with top-2 routing matches the f64 loops, gradients match finite differences", "[moe][mesh]") {
  for (const std::string spec : {"ep=1", "ep=2", "ep=4", "dp=2,ep=2"}) check_moe(spec, 2);
}
