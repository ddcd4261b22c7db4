// bench_tree_gemm: deterministic mode's GEMM (GemmShape::tree on: each element summed in the
// canonical SumTree order by our own blocked kernel) against the default mode's OpenBLAS GEMM,
// both through the CPU kernel interface, one thread, f32, on the same inputs in the same run
// (interleaved). Reports GFLOP/s (median of repetitions) and the ratio tree / OpenBLAS, and the
// ratio of the best repetitions (steadier on a shared machine).
//
//   build/bin/bench_tree_gemm [--shapes 256x256x256,1024x1024x256:tn,4096x64x64:nt] [--forced 6] [--leaf 32] [--reps 9]
//                             [--json FILE]
// A shape's :tn (nt, tt) transposes op(A) (op(B), both). --forced and --leaf set the tree (default: the canonical tree of one
// device, SumTree's constants).
#include <cblas.h>
#include <fmt/format.h>
#include <nax/kernels/kernels.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"

namespace {

struct Options {
  std::vector<std::string> shapes{"256x256x256", "1024x1024x256", "4096x64x64", "256x256x4096", "128x512x64"};
  int reps = 9;
  nax::SumTree tree{.on = true};
  std::string json;
};

struct Shape {
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
};

Shape parse_shape(const std::string& text) {
  Shape s;
  std::size_t x1 = text.find('x'), x2 = x1 == std::string::npos ? x1 : text.find('x', x1 + 1);
  if (x2 == std::string::npos) nax::fail("--shapes", "'{}' is not MxNxK", text);
  s.m = bench::parse_integer(text.substr(0, x1), "--shapes");
  s.n = bench::parse_integer(text.substr(x1 + 1, x2 - x1 - 1), "--shapes");
  const std::size_t colon = text.find(':');
  s.k = bench::parse_integer(text.substr(x2 + 1, colon == std::string::npos ? colon : colon - x2 - 1), "--shapes");
  if (colon != std::string::npos) {
    const std::string ops = text.substr(colon + 1);
    if (ops != "nn" && ops != "tn" && ops != "nt" && ops != "tt")
      nax::fail("--shapes", "'{}': the operands' ops are nn, tn, nt or tt", text);
    s.trans_a = ops[0] == 't';
    s.trans_b = ops[1] == 't';
  }
  return s;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t comma = std::min(text.find(',', begin), text.size());
    parts.push_back(text.substr(begin, comma - begin));
    begin = comma + 1;
  }
  return parts;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--shapes")
      o.shapes = split(bench::flag_value(argc, argv, i));
    else if (arg == "--reps")
      o.reps = static_cast<int>(bench::parse_integer(bench::flag_value(argc, argv, i), "--reps"));
    else if (arg == "--forced")
      o.tree.forced = static_cast<int>(bench::parse_integer(bench::flag_value(argc, argv, i), "--forced"));
    else if (arg == "--leaf")
      o.tree.leaf = bench::parse_integer(bench::flag_value(argc, argv, i), "--leaf");
    else if (arg == "--json")
      o.json = bench::flag_value(argc, argv, i);
    else if (arg == "--help") {
      fmt::print("bench_tree_gemm [--shapes MxNxK,...] [--forced N] [--leaf L] [--reps N] [--json FILE]\n");
      std::exit(0);
    } else
      nax::fail(arg, "unknown flag (try --help)");
  }
  if (o.reps < 1) nax::fail("--reps", "needs at least 1");
  return o;
}

std::vector<float> random_values(std::int64_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(static_cast<std::size_t>(count));
  for (auto& x : v) x = normal(rng);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    openblas_set_num_threads(1);
    nax::kernels::Kernels& kernels = *nax::kernels::cpu_kernels_ptr();
    fmt::print("{:>16} {:>14} {:>14} {:>8} {:>11}\n", "m x n x k", "tree GFLOP/s", "BLAS GFLOP/s", "ratio", "best ratio");
    std::vector<bench::JsonObject> rows;
    for (const auto& text : o.shapes) {
      const Shape s = parse_shape(text);
      const auto a = random_values(s.m * s.k, 1), b = random_values(s.k * s.n, 2);
      std::vector<float> c(static_cast<std::size_t>(s.m * s.n));
      nax::kernels::GemmShape shape{.trans_a = s.trans_a,
                                    .trans_b = s.trans_b,
                                    .m = s.m,
                                    .n = s.n,
                                    .k = s.k,
                                    .lda = s.trans_a ? s.m : s.k,
                                    .ldb = s.trans_b ? s.k : s.n,
                                    .ldc = s.n,
                                    .tree = {}};
      nax::kernels::GemmShape tree_shape = shape;
      tree_shape.tree = o.tree;
      std::vector<double> tree_times, blas_times;
      for (int r = 0; r < o.reps; ++r) {
        tree_times.push_back(bench::seconds_of([&] { kernels.gemm(nax::DType::f32, tree_shape, a.data(), b.data(), c.data()); }));
        blas_times.push_back(bench::seconds_of([&] { kernels.gemm(nax::DType::f32, shape, a.data(), b.data(), c.data()); }));
      }
      const double flops = 2.0 * static_cast<double>(s.m * s.n * s.k);
      const double tree = flops / bench::median(tree_times) / 1e9, blas = flops / bench::median(blas_times) / 1e9;
      const double best =
          *std::min_element(blas_times.begin(), blas_times.end()) / *std::min_element(tree_times.begin(), tree_times.end());
      fmt::print("{:>16} {:>14.1f} {:>14.1f} {:>8.2f} {:>11.2f}\n", text, tree, blas, tree / blas, best);
      rows.push_back(bench::JsonObject()
                         .add("shape", text)
                         .add("tree_gflops", tree)
                         .add("blas_gflops", blas)
                         .add("ratio", tree / blas)
                         .add("best_ratio", best));
    }
    if (!o.json.empty())
      bench::write_text_file(o.json,
                             bench::JsonObject().add("threads", 1).add_raw("gemms", bench::json_array(rows)).str() + "\n");
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_tree_gemm: {}\n", e.what());
    return 1;
  }
}
