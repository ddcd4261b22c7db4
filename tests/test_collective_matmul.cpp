// The collective matmul example (examples/collective_matmul/): the overlapped ppermute ring gives
// the f64 host product and the plain all_gather + dot values; its gradients match finite
// differences of the whole mesh program and the blocking form's gradients.
#include "collective_matmul/collective_matmul.h"
#include "grad_check.h"
#include "helpers.h"

using namespace nax;

namespace {

// This device's block of x's rows (Varying over mp) from the whole x.
Tensor row_block(Shard& s, const Tensor& x_whole) {
  const std::int64_t block = x_whole.shape().size("rows") / axis_size("mp"), r = s.coord("mp");
  return slice(pvary(x_whole, "mp"), "rows", r * block, (r + 1) * block);
}

Tensor loss_of(Shard& s, const std::vector<Tensor>& p, bool overlap) {
  const Tensor x = row_block(s, p[0]);
  const Tensor y = overlap ? collective_matmul::overlapped(x, p[1], "mp", "rows", "embed")
                           : collective_matmul::blocking(x, p[1], "mp", "rows", "embed");
  return psum(sum(y * y, {"rows", "ffn"}), "mp");
}

const AxisRules kRules{{"ffn", "mp"}};

}  // namespace

TEST_CASE("collective matmul: the ring gives the host product", "[mesh][async]") {
  const std::int64_t rows = 12, embed = 5, ffn = 8;
  const Tensor x = random_normal(Shape{{"rows", rows}, {"embed", embed}}, 3, "x", 1.0, DType::f64);
  const Tensor w = random_normal(Shape{{"embed", embed}, {"ffn", ffn}}, 3, "w", 1.0, DType::f64);
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>();
  std::vector<double> want(static_cast<std::size_t>(rows * ffn));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < ffn; ++j)
      for (std::int64_t k = 0; k < embed; ++k) want[static_cast<std::size_t>(i * ffn + j)] += xv[static_cast<std::size_t>(i * embed + k)] * wv[static_cast<std::size_t>(k * ffn + j)];
  for (const std::string spec : {"mp=1", "mp=2", "mp=4", "dp=2,mp=2"}) {
    INFO("mesh " << spec);
    Runtime rt = Runtime::local(Mesh::parse(spec));
    auto got = rt.run([&](Shard& s) {
      const Tensor xb = row_block(s, s.shard(x, {})), wb = s.shard(w, kRules);
      const Tensor a = collective_matmul::overlapped(xb, wb, "mp", "rows", "embed");
      const Tensor b = collective_matmul::blocking(xb, wb, "mp", "rows", "embed");
      NAX_EXPECT(a.vary() == b.vary());
      NAX_EXPECT(a.to_vector<double>() == b.to_vector<double>());
      return s.gather(all_gather(a, "mp", "ffn").with_vary(VaryType{})).to_vector<double>();
    });
    for (const auto& g : got) REQUIRE(nax::testing::max_rel_error(g, want) <= 1e-12);
  }
}

TEST_CASE("collective matmul: gradients match finite differences and the blocking form's", "[mesh][async][grad]") {
  for (const std::string spec : {"mp=2", "mp=4", "dp=2,mp=2"}) {
    INFO("mesh " << spec);
    Runtime rt = Runtime::local(Mesh::parse(spec));
    const Tensor x = nax::testing::random_input(Shape{{"rows", 8}, {"embed", 3}}, "x");
    const Tensor w = nax::testing::random_input(Shape{{"embed", 3}, {"ffn", 4}}, "w");
    nax::testing::check_mesh_gradients(rt, [](Shard& s, const std::vector<Tensor>& p) { return loss_of(s, p, true); }, {x, w},
                                       kRules);
    auto worst = rt.run([&](Shard& s) {
      const std::vector<Tensor> p{s.shard(x, kRules), s.shard(w, kRules)};
      auto a = value_and_grad([&](const std::vector<Tensor>& q) { return loss_of(s, q, true); }, p).second;
      auto b = value_and_grad([&](const std::vector<Tensor>& q) { return loss_of(s, q, false); }, p).second;
      double e = 0;
      for (std::size_t i = 0; i < 2; ++i) e = std::max(e, nax::testing::max_rel_error(a[i].to_vector<double>(), b[i].to_vector<double>()));
      return e;
    });
    for (double e : worst) REQUIRE(e <= 1e-12);
  }
}
