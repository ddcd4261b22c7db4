// A mixture-of-experts layer per shard (examples/moe/moe.h): top-k routing with capacity, one-hot
// dispatch, all_to_all over `ep` to the devices holding the experts and back, gate-weighted
// combine; then gradients of a loss through it. The output is checked against the f64 loops of
// examples/moe/reference.h (same groups, same capacity drops).
//
//   build/bin/moe [--mesh dp=2,ep=2] [--k 2]   (the mesh needs an axis ep; dp is optional)
#include <cmath>
#include <fmt/format.h>

#include "moe/moe.h"
#include "moe/reference.h"

using namespace nax;

int main(int argc, char** argv) {
  try {
    std::string spec = "dp=2,ep=2";
    moe::Config c;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string flag = argv[i];
      if (flag == "--mesh") spec = argv[i + 1];
      else if (flag == "--k") c.k = std::stoi(argv[i + 1]);  // 1..experts (top_k refuses others)
      else throw Error(fmt::format("moe: unknown flag '{}' (flags: --mesh, --k)", flag));
    }
    const Mesh mesh = Mesh::parse(spec);
    Runtime rt = Runtime::local(mesh);
    const std::int64_t groups = mesh.size(), tokens = 8;
    c.capacity = (tokens * c.k * 5 / 4 + c.experts - 1) / c.experts;  // capacity factor 1.25, as Switch Transformer
    const Shape x_shape{{"group", groups}, {"tokens", tokens}, {"embed", c.embed}};
    const Tensor x = random_normal(x_shape, 0, "x");
    const Tensor router = random_normal(moe::router_shape(c), 0, "router");
    const Tensor w_in = random_normal(moe::w_in_shape(c), 0, "w_in", 0.3), w_out = random_normal(moe::w_out_shape(c), 0, "w_out", 0.3);
    const AxisRules rules = moe::rules(mesh);

    auto results = rt.run([&](Shard& s) {
      moe::Weights w{parameter(s.shard(router, rules)), parameter(s.shard(w_in, rules)), parameter(s.shard(w_out, rules))};
      const Tensor y = moe::layer(s.shard(x, rules), w, c);
      if (s.device() == 0) fmt::print("device 0: y {}\n", y.str());
      const Tensor loss = psum(sum(square(y), y.shape().names()), mesh.axis_names());
      const auto grads = grad(loss, {w.router, w.w_in, w.w_out});
      std::vector<Tensor> out{s.gather(y)};
      for (const auto& g : grads) out.push_back(s.gather(g));
      return out;
    })[0];

    const auto want = moe::reference_layer(x.to_vector<double>(), groups, tokens, router.to_vector<double>(), w_in.to_vector<double>(),
                                           w_out.to_vector<double>(), c);
    const auto got = results[0].to_vector<double>();
    double worst = 0;
    if (got.size() != want.y.size()) worst = INFINITY;
    // A NaN counts as an infinite error (std::max would drop it and pass).
    for (std::size_t i = 0; i < got.size() && i < want.y.size(); ++i) {
      const double err = std::abs(got[i] - want.y[i]);
      worst = std::max(worst, std::isnan(err) ? INFINITY : err);
    }
    fmt::print("mesh {}, k={}, capacity {} per expert per group: {} of {} assignments dropped\n", mesh.str(), c.k, c.capacity,
               want.dropped, groups * tokens * c.k);
    fmt::print("gradient norms: router {:.4f}, w_in {:.4f}, w_out {:.4f}\n", std::sqrt(sum(square(results[1]), results[1].shape().names()).item()),
               std::sqrt(sum(square(results[2]), results[2].shape().names()).item()),
               std::sqrt(sum(square(results[3]), results[3].shape().names()).item()));
    fmt::print("max |moe - f64 reference| = {:.2e}\n", worst);
    return worst < 1e-4 ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
