// bench_optimizer: one AdamW step over a model's worth of f32 parameters, fused (nn::AdamW::step:
// one pass of the device's adamw kernel per parameter, 7 f32 reads and writes per element) against
// the same formula through tensor ops (about ten elementwise ops per parameter, each reading and
// writing whole tensors). Medians of --reps steps on device 0 of Runtime::local(x=1), or of a CUDA
// device with --backend cuda. Goal: the fused step at least 3x faster.
//
//   build/bin/bench_optimizer [--elements 16777216] [--tensors 8] [--reps 9] [--backend cpu|cuda] [--json FILE]
#include <fmt/format.h>

#include <nax/nax.h>

#include "bench_util.h"

namespace {

using nax::Tensor;

struct Options {
  std::int64_t elements = std::int64_t{1} << 24, tensors = 8;
  int reps = 9;
  nax::Backend backend = nax::Backend::cpu;
  std::string json;
};

// The formula of nn::AdamW through tensor ops (what AdamW::step did before the fused kernel).
std::vector<Tensor> op_by_op(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<Tensor>& m,
                             std::vector<Tensor>& v, double lr, int step) {
  const double b1 = 0.9, b2 = 0.95, c1 = 1 - std::pow(b1, step), c2 = 1 - std::pow(b2, step);
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < params.size(); ++i) {
    m[i] = m[i] * b1 + grads[i] * (1 - b1);
    v[i] = v[i] * b2 + nax::square(grads[i]) * (1 - b2);
    out.push_back(params[i] - ((m[i] / c1) / (nax::sqrt(v[i] / c2) + 1e-8) + params[i] * 0.1) * lr);
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--elements") o.elements = bench::parse_integer(bench::flag_value(argc, argv, i), arg);
    else if (arg == "--tensors") o.tensors = bench::parse_integer(bench::flag_value(argc, argv, i), arg);
    else if (arg == "--reps") o.reps = static_cast<int>(bench::parse_integer(bench::flag_value(argc, argv, i), arg));
    else if (arg == "--backend") o.backend = nax::parse_backend(bench::flag_value(argc, argv, i));
    else if (arg == "--json") o.json = bench::flag_value(argc, argv, i);
    else nax::fail("bench_optimizer", "unknown argument '{}' (usage: see the file's first lines)", arg);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    nax::RuntimeOptions runtime{.blas_threads = 1};
    runtime.backend = o.backend;
    nax::Runtime rt = nax::Runtime::local(nax::Mesh::parse("x=1"), runtime);
    double fused = 0, unfused = 0;
    rt.run([&](nax::Shard& s) {
      const nax::Shape shape{{"rows", o.elements / o.tensors / 1024}, {"cols", 1024}};
      std::vector<Tensor> params, grads, m, v;
      for (std::int64_t t = 0; t < o.tensors; ++t) {
        params.push_back(nax::random_normal(shape, 1, fmt::format("p{}", t)));
        grads.push_back(nax::random_normal(shape, 2, fmt::format("g{}", t), 1e-3));
        m.push_back(nax::zeros(shape));
        v.push_back(nax::zeros(shape));
      }
      nax::nn::AdamW adamw;
      std::vector<Tensor> p_fused = params, p_ops = params;
      int step = 0;
      fused = bench::median_seconds(o.reps, [&] {
        p_fused = adamw.step(p_fused, grads, 1e-3);
        s.synchronize();
      });
      unfused = bench::median_seconds(o.reps, [&] {
        p_ops = op_by_op(p_ops, grads, m, v, 1e-3, ++step);
        s.synchronize();
      });
    });
    const double bytes = 7.0 * 4.0 * static_cast<double>(o.elements);
    fmt::print("AdamW step over {} f32 parameters in {} tensors on {} (median of {}):\n", o.elements, o.tensors,
               nax::backend_name(o.backend), o.reps);
    fmt::print("  fused      {:8.2f} ms  ({:.1f} GB/s of its 7 reads and writes per element)\n", fused * 1e3, bytes / fused * 1e-9);
    fmt::print("  op by op   {:8.2f} ms\n  speed-up   {:8.2f}x (goal >= 3x)\n", unfused * 1e3, unfused / fused);
    if (!o.json.empty())
      bench::write_text_file(o.json, bench::JsonObject()
                                         .add("elements", o.elements)
                                         .add("backend", std::string(nax::backend_name(o.backend)))
                                         .add("fused_ms", fused * 1e3)
                                         .add("op_by_op_ms", unfused * 1e3)
                                         .add("speedup", unfused / fused)
                                         .str() + "\n");
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_optimizer: {}\n", e.what());
    return 1;
  }
}
