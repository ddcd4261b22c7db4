// A tensor-parallel MLP written per shard, as in Megatron-LM / mesh-transformer-jax: w_in is cut
// along mlp (column-parallel), w_out along mlp too (row-parallel), so each device computes a
// partial sum of the output and one psum over mp completes it. The result is checked against the
// same MLP on one device.
//
//   build/bin/tensor_parallel_mlp [--mesh dp=2,mp=2]   (the mesh needs axes dp and mp)
#include <cmath>
#include <nax/nax.h>

#include <fmt/format.h>

using namespace nax;

namespace {

Tensor mlp(const Tensor& x, const Tensor& w_in, const Tensor& w_out) {
  Tensor h = tanh(dot(x, w_in, "embed"));  // [batch, mlp|mp]: column-parallel, no communication
  return dot(h, w_out, "mlp");             // [batch, embed] partial{mp}: a partial sum
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string spec = argc > 2 && std::string(argv[1]) == "--mesh" ? argv[2] : "dp=2,mp=2";
    Mesh mesh = Mesh::parse(spec);
    Runtime rt = Runtime::local(mesh);
    const Shape x_shape{{"batch", 8}, {"embed", 64}}, w_in_shape{{"embed", 64}, {"mlp", 256}}, w_out_shape{{"mlp", 256}, {"embed", 64}};
    const AxisRules rules{{"batch", "dp"}, {"mlp", "mp"}};
    Tensor x = random_normal(x_shape, 0, "x");

    auto outputs = rt.run([&](Shard& s) {
      Tensor w_in = s.random_normal(w_in_shape, rules, 0, "w_in", 0.1);    // [embed, mlp|mp]
      Tensor w_out = s.random_normal(w_out_shape, rules, 0, "w_out", 0.1);  // [mlp|mp, embed]
      Tensor y = psum(mlp(s.shard(x, rules), w_in, w_out), "mp");          // [batch|dp, embed]
      if (s.device() == 0) fmt::print("device 0 holds {}\n", y.str());
      return s.gather(y);
    });

    Tensor reference = mlp(x, random_normal(w_in_shape, 0, "w_in", 0.1), random_normal(w_out_shape, 0, "w_out", 0.1));
    double worst = 0;
    auto want = reference.to_vector<double>(), got = outputs[0].to_vector<double>();
    if (got.size() != want.size()) worst = INFINITY;
    // A NaN counts as an infinite error (std::max would drop it and pass).
    for (std::size_t i = 0; i < want.size() && i < got.size(); ++i) {
      const double err = std::abs(got[i] - want[i]);
      worst = std::max(worst, std::isnan(err) ? INFINITY : err);
    }
    fmt::print("mesh {}: max |sharded - single device| = {:.2e}\n", mesh.str(), worst);
    return worst < 1e-4 ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
