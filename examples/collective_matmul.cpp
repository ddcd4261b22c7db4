// The all-gather matmul of examples/collective_matmul/collective_matmul.h, overlapped (a
// start_ppermute ring hiding behind the per-step dots) against the plain all_gather + dot, forward
// and backward: the outputs and the gradients of x and w must agree.
//
//   build/bin/collective_matmul [--mesh dp=2,mp=2] [--rows 64] [--embed 32] [--ffn 48]
//
// Each device holds its own block of x's rows (Varying over mp) and the ffn columns of w that are
// its own (Split over mp, as in a Megatron MLP).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "collective_matmul/collective_matmul.h"

using namespace nax;

int main(int argc, char** argv) {
  try {
    std::string spec = "dp=2,mp=2";
    std::int64_t rows = 64, embed = 32, ffn = 48;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string flag = argv[i], value = argv[i + 1];
      if (flag == "--mesh") spec = value;
      else if (flag == "--rows") rows = std::stoll(value);
      else if (flag == "--embed") embed = std::stoll(value);
      else if (flag == "--ffn") ffn = std::stoll(value);
      else throw Error(fmt::format("collective_matmul: unknown flag '{}' (flags: --mesh, --rows, --embed, --ffn)", flag));
    }
    const Mesh mesh = Mesh::parse(spec);
    Runtime rt = Runtime::local(mesh);
    const Tensor x_all = random_normal(Shape{{"rows", rows}, {"embed", embed}}, 1, "x");
    const Tensor w_all = random_normal(Shape{{"embed", embed}, {"ffn", ffn}}, 1, "w", 0.2);

    auto worst = rt.run([&](Shard& s) {
      const std::int64_t block = rows / axis_size("mp"), r = s.coord("mp");
      const Tensor x = slice(pvary(s.shard(x_all, {}), "mp"), "rows", r * block, (r + 1) * block);
      const Tensor w = s.shard(w_all, AxisRules{{"ffn", "mp"}});
      auto run = [&](bool overlap) {
        auto [loss, grads] = value_and_grad(
            [&](const std::vector<Tensor>& p) {
              const Tensor y = overlap ? collective_matmul::overlapped(p[0], p[1], "mp", "rows", "embed")
                                       : collective_matmul::blocking(p[0], p[1], "mp", "rows", "embed");
              return psum(sum(y * y, {"rows", "ffn"}), "mp");
            },
            {x, w});
        return std::vector<Tensor>{loss, grads[0], grads[1]};
      };
      const auto a = run(true), b = run(false);
      double error = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        const auto u = a[i].to_vector<double>(), v = b[i].to_vector<double>();
        for (std::size_t j = 0; j < u.size(); ++j) error = std::max(error, std::abs(u[j] - v[j]) / std::max(1.0, std::abs(v[j])));
      }
      if (s.device() == 0) fmt::print("device 0: loss {:.6f} (overlapped) vs {:.6f} (all_gather + dot)\n", a[0].item(), b[0].item());
      return error;
    });
    const double error = *std::max_element(worst.begin(), worst.end());
    fmt::print("mesh {}: largest relative difference of loss, dx, dw: {:.2e}\n", spec, error);
    return error <= 1e-4 ? 0 : 1;  // f32, sums in other orders
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
