// bench_index_ops: the index ops composed of tensor ops (nax/ops/index_ops.h) against plain host loops
// doing the same work on the same f32 data, to show what the composition costs and where a
// dedicated kernel would pay: top_k (k passes over the rows) against std::partial_sort per row,
// cumsum (log2(n) shifted adds) against a running sum, scatter_add (a one-hot contraction) against
// a loop adding rows, argmax against a loop. Medians of --reps calls on device 0 of
// Runtime::local(x=1); the loops run on the same thread.
//
//   build/bin/bench_index_ops [--rows 4096] [--width 64] [--k 2] [--reps 7] [--json FILE]
#include <fmt/format.h>

#include <nax/nax.h>

#include <algorithm>
#include <numeric>

#include "bench_util.h"

namespace {

using nax::Tensor;

struct Options {
  std::int64_t rows = 4096, width = 64, k = 2;
  int reps = 7;
  std::string json;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--rows") o.rows = bench::parse_integer(bench::flag_value(argc, argv, i), arg);
    else if (arg == "--width") o.width = bench::parse_integer(bench::flag_value(argc, argv, i), arg);
    else if (arg == "--k") o.k = bench::parse_integer(bench::flag_value(argc, argv, i), arg);
    else if (arg == "--reps") o.reps = static_cast<int>(bench::parse_integer(bench::flag_value(argc, argv, i), arg));
    else if (arg == "--json") o.json = bench::flag_value(argc, argv, i);
    else nax::fail("bench_index_ops", "unknown argument '{}' (usage: see the file's first lines)", arg);
  }
  return o;
}

struct Row {
  std::string op;
  double nax_ms = 0, loop_ms = 0;
};

std::vector<Row> measure(const Options& o) {
  const std::int64_t R = o.rows, W = o.width;
  const Tensor x = nax::random_normal(nax::Shape{{"rows", R}, {"width", W}}, 1, "x");
  const Tensor ids = nax::cast(nax::random_uniform(nax::Shape{{"rows", R}}, 2, "ids", 0, static_cast<double>(W) - 1e-3), nax::DType::i32);
  const Tensor updates = nax::random_normal(nax::Shape{{"rows", R}, {"e", W}}, 3, "updates");
  const Tensor target = nax::zeros(nax::Shape{{"slot", W}, {"e", W}});
  const std::vector<float> xv = x.to_vector<float>(), uv = updates.to_vector<float>();
  const std::vector<std::int32_t> iv = ids.to_vector<std::int32_t>();
  std::vector<float> out(static_cast<std::size_t>(R * W)), table(static_cast<std::size_t>(W * W));
  std::vector<std::int32_t> index(static_cast<std::size_t>(R * W));
  auto time = [&](auto&& fn) { return 1e3 * bench::median_seconds(o.reps, fn); };
  std::vector<Row> rows;

  rows.push_back({"top_k", time([&] { (void)nax::top_k(x, "width", o.k).values; }), time([&] {
                    for (std::int64_t r = 0; r < R; ++r) {
                      std::int32_t* order = &index[static_cast<std::size_t>(r * W)];
                      std::iota(order, order + W, 0);
                      const float* row = &xv[static_cast<std::size_t>(r * W)];
                      std::partial_sort(order, order + o.k, order + W, [&](auto a, auto b) { return row[a] > row[b]; });
                      for (std::int64_t j = 0; j < o.k; ++j) out[static_cast<std::size_t>(r * o.k + j)] = row[order[j]];
                    }
                  })});
  rows.push_back({"argmax", time([&] { (void)nax::argmax(x, "width"); }), time([&] {
                    for (std::int64_t r = 0; r < R; ++r) {
                      const float* row = &xv[static_cast<std::size_t>(r * W)];
                      index[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(std::max_element(row, row + W) - row);
                    }
                  })});
  rows.push_back({"cumsum", time([&] { (void)nax::cumsum(x, "width"); }), time([&] {
                    for (std::int64_t r = 0; r < R; ++r) {
                      float total = 0;
                      for (std::int64_t w = 0; w < W; ++w) out[static_cast<std::size_t>(r * W + w)] = total += xv[static_cast<std::size_t>(r * W + w)];
                    }
                  })});
  rows.push_back({"scatter_add", time([&] { (void)nax::scatter_add(target, "slot", ids, updates); }), time([&] {
                    std::fill(table.begin(), table.end(), 0.0f);
                    for (std::int64_t r = 0; r < R; ++r)
                      for (std::int64_t e = 0; e < W; ++e)
                        table[static_cast<std::size_t>(iv[static_cast<std::size_t>(r)] * W + e)] += uv[static_cast<std::size_t>(r * W + e)];
                  })});
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    nax::Runtime rt = nax::Runtime::local(nax::Mesh::parse("x=1"), nax::RuntimeOptions{.blas_threads = 1});
    std::vector<Row> rows;
    rt.run([&](nax::Shard&) { rows = measure(o); });
    fmt::print("index ops on [rows={}, width={}] f32 (k={}), median of {}, one thread:\n", o.rows, o.width, o.k, o.reps);
    fmt::print("  {:<12} {:>10} {:>10} {:>8}\n", "op", "nax ms", "loop ms", "ratio");
    std::vector<bench::JsonObject> items;
    for (const auto& r : rows) {
      fmt::print("  {:<12} {:>10.3f} {:>10.3f} {:>7.1f}x\n", r.op, r.nax_ms, r.loop_ms, r.nax_ms / r.loop_ms);
      items.push_back(bench::JsonObject().add("op", r.op).add("nax_ms", r.nax_ms).add("loop_ms", r.loop_ms));
    }
    if (!o.json.empty())
      bench::write_text_file(o.json, bench::JsonObject()
                                         .add("rows", o.rows)
                                         .add("width", o.width)
                                         .add("k", o.k)
                                         .add_raw("ops", bench::json_array(items))
                                         .str() + "\n");
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_index_ops: {}\n", e.what());
    return 1;
  }
}
