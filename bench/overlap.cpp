// bench_overlap: the collective matmul of examples/collective_matmul/ overlapped (a start_ppermute
// ring hidden behind the per-step dots) against blocking forms of the same work, forward and
// forward + backward, on the thread runtime and, under mpirun, the MPI runtime.
//
// Two blocking baselines: "gather" is all_gather + one dot (the usual program), "ring" is the same
// ring with each ppermute waited for at once (the overlapped program minus the overlap). The
// ratios overlapped / baseline are what overlap buys (below 1 is a gain). A row's time is the
// median over --reps of the slowest device's time for --iters calls, after a warm-up.
//
//   build/bin/bench_overlap [--devices 4] [--rows 2048] [--embed 1024] [--ffn 1024] [--iters 3] [--reps 5] [--json FILE]
//   mpirun --bind-to none -np 4 build/bin/bench_overlap [...]     (threads rows from process 0, then mpi rows)
#include <nax/nax.h>

#include <fmt/format.h>

#include "../examples/collective_matmul/collective_matmul.h"
#include "bench_util.h"

using namespace nax;

namespace {

struct Options {
  int devices = 4;
  std::int64_t rows = 2048, embed = 1024, ffn = 1024;
  int iters = 3, reps = 5;
  std::string json;
};

enum class Form { overlapped, ring_blocking, gather_blocking };
constexpr std::string_view form_name(Form f) {
  return f == Form::overlapped ? "overlapped" : f == Form::ring_blocking ? "ring" : "gather";
}

// The ring with every ppermute waited for at once.
Tensor ring_blocking(const Tensor& x, const Tensor& w) {
  const int n = axis_size("mp");
  const int r = static_cast<int>(axis_index("mp").item());
  std::vector<Tensor> blocks(static_cast<std::size_t>(n));
  Tensor held = x;
  for (int i = 0; i < n; ++i) {
    blocks[static_cast<std::size_t>((r - i + n) % n)] = dot(held, w, "embed");
    if (i + 1 < n) held = ppermute(held, "mp", collective_matmul::ring(n));
  }
  return concat(blocks, "rows");
}

Tensor product(Form form, const Tensor& x, const Tensor& w) {
  switch (form) {
    case Form::overlapped: return collective_matmul::overlapped(x, w, "mp", "rows", "embed");
    case Form::ring_blocking: return ring_blocking(x, w);
    case Form::gather_blocking: return collective_matmul::blocking(x, w, "mp", "rows", "embed");
  }
  return {};
}

// Seconds for `iters` calls of the form on the slowest device, median over reps.
double time_form(Runtime& rt, const Options& o, Form form, bool backward) {
  auto per_device = rt.run([&](Shard& s) {
    const std::int64_t block = o.rows / axis_size("mp");
    const Tensor x = pvary(random_normal(Shape{{"rows", block}, {"embed", o.embed}}, 1, fmt::format("x{}", s.device())), "mp");
    const Tensor w = s.random_normal(Shape{{"embed", o.embed}, {"ffn", o.ffn}}, AxisRules{{"ffn", "mp"}}, 2, "w", 0.02);
    auto step = [&] {
      if (!backward) {
        NoGrad no_grad;
        static_cast<void>(product(form, x, w).raw());
        return;
      }
      auto grads = value_and_grad([&](const std::vector<Tensor>& p) { return psum(sum(product(form, p[0], p[1]), {"rows", "ffn"}), "mp"); },
                                  {x, w}).second;
      static_cast<void>(grads[1].raw());
    };
    step();  // warm-up: communicators, allocator
    std::vector<double> times;
    for (int r = 0; r < o.reps; ++r) {
      static_cast<void>(psum(pvary(ones(Shape{}), "mp"), "mp").item());  // start together
      times.push_back(bench::seconds_of([&] {
        for (int i = 0; i < o.iters; ++i) step();
      }));
    }
    return times;
  });
  std::vector<double> slowest(static_cast<std::size_t>(o.reps));
  for (const auto& t : per_device)
    for (std::size_t r = 0; r < t.size(); ++r) slowest[r] = std::max(slowest[r], t[r]);
  return bench::median(slowest);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--devices") o.devices = static_cast<int>(bench::parse_integer(bench::flag_value(argc, argv, i), flag));
    else if (flag == "--rows") o.rows = bench::parse_integer(bench::flag_value(argc, argv, i), flag);
    else if (flag == "--embed") o.embed = bench::parse_integer(bench::flag_value(argc, argv, i), flag);
    else if (flag == "--ffn") o.ffn = bench::parse_integer(bench::flag_value(argc, argv, i), flag);
    else if (flag == "--iters") o.iters = static_cast<int>(bench::parse_integer(bench::flag_value(argc, argv, i), flag));
    else if (flag == "--reps") o.reps = static_cast<int>(bench::parse_integer(bench::flag_value(argc, argv, i), flag));
    else if (flag == "--json") o.json = bench::flag_value(argc, argv, i);
    else fail("bench_overlap", "unknown flag '{}' (flags: --devices --rows --embed --ffn --iters --reps --json)", flag);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o = parse(argc, argv);
    const bool under_mpi = process_count() > 1;
    if (under_mpi) o.devices = process_count();
    const Mesh mesh = Mesh::parse(fmt::format("mp={}", o.devices));
    if (o.rows % o.devices != 0 || o.ffn % o.devices != 0) fail("bench_overlap", "--rows and --ffn must be divisible by {} devices", o.devices);
    const bool report = process_index() == 0;
    if (report)
      fmt::print("collective matmul y[rows={}, ffn={}|mp] = all_gather(x[rows|mp, embed={}]) . w on mesh {}, {} calls per timing\n", o.rows,
                 o.ffn, o.embed, mesh.str(), o.iters);
    std::vector<bench::JsonObject> rows;
    auto measure = [&](std::string_view backend, Runtime& rt) {
      for (bool backward : {false, true}) {
        double t[3];
        for (Form f : {Form::overlapped, Form::ring_blocking, Form::gather_blocking}) t[static_cast<int>(f)] = time_form(rt, o, f, backward);
        if (!report) continue;
        const std::string pass = backward ? "fwd+bwd" : "fwd";
        fmt::print("{:<8} {:<8} overlapped {:8.2f} ms  ring {:8.2f} ms  gather {:8.2f} ms  overlapped/ring {:.3f}  overlapped/gather {:.3f}\n",
                   backend, pass, 1e3 * t[0] / o.iters, 1e3 * t[1] / o.iters, 1e3 * t[2] / o.iters, t[0] / t[1], t[0] / t[2]);
        rows.push_back(bench::JsonObject()
                           .add("backend", backend)
                           .add("pass", pass)
                           .add("devices", o.devices)
                           .add("overlapped_ms", 1e3 * t[0] / o.iters)
                           .add("ring_blocking_ms", 1e3 * t[1] / o.iters)
                           .add("gather_blocking_ms", 1e3 * t[2] / o.iters)
                           .add("overlapped_over_ring", t[0] / t[1])
                           .add("overlapped_over_gather", t[0] / t[2]));
      }
    };
    if (!under_mpi || report) {
      Runtime threads = Runtime::local(mesh);
      measure("threads", threads);
    }
    if (under_mpi) {
      Runtime mpi = Runtime::mpi(mesh);
      measure("mpi", mpi);
    }
    if (report && !o.json.empty())
      bench::write_text_file(o.json, bench::JsonObject()
                                         .add("rows", o.rows)
                                         .add("embed", o.embed)
                                         .add("ffn", o.ffn)
                                         .add_raw("results", bench::json_array(rows))
                                         .str() + "\n");
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
