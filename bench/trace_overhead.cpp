// The trace's cost per op: a small op (add of two 16-element tensors, about a microsecond) timed
// with tracing off, on, and for a bare span, on one device; and a psum over two devices off and on.
// The difference on - off is what recording one op slice costs.
//
//   build/bin/bench_trace_overhead [--ops N] [--repeats R] [--json FILE]
#include <nax/nax.h>

#include "bench_util.h"

namespace {

// Seconds per call of `fn` over `ops` calls, the median of `repeats` runs.
template <typename Fn>
double per_call(int ops, int repeats, Fn&& fn) {
  return bench::median_seconds(repeats, [&] {
           for (int i = 0; i < ops; ++i) fn();
         }) /
         ops;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int ops = 20000, repeats = 7;
    std::string json_path;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        fmt::print("usage: bench_trace_overhead [--ops N] [--repeats R] [--json FILE]\n");
        return 0;
      }
      if (arg == "--ops") ops = static_cast<int>(bench::parse_integer(bench::flag_value(argc, argv, i), "--ops"));
      else if (arg == "--repeats") repeats = static_cast<int>(bench::parse_integer(bench::flag_value(argc, argv, i), "--repeats"));
      else if (arg == "--json") json_path = bench::flag_value(argc, argv, i);
      else nax::fail("bench_trace_overhead", "unknown argument '{}' (try --help)", arg);
    }
    using namespace nax;
    struct Row {
      std::string what;
      double off_s, on_s;
    };
    std::vector<Row> rows;
    {
      Runtime rt = Runtime::local(Mesh::parse("x=1"));
      rt.run([&](Shard& s) {
        Tensor a = s.full(Shape{{"i", 16}}, AxisRules{}, 1.0), b = s.full(Shape{{"i", 16}}, AxisRules{}, 2.0);
        auto add_op = [&] { static_cast<void>(add(a, b)); };
        auto bare_span = [] { const trace::Span span("op", "bench"); };
        per_call(ops, 1, add_op);  // warm the allocator's cache
        const double add_off = per_call(ops, repeats, add_op), span_off = per_call(ops, repeats, bare_span);
        trace::start();
        const double add_on = per_call(ops, repeats, add_op), span_on = per_call(ops, repeats, bare_span);
        trace::stop();
        trace::start();  // forget the recording
        trace::stop();
        rows.push_back({"add f32[i=16] (one op slice)", add_off, add_on});
        rows.push_back({"bare trace::Span (no arguments)", span_off, span_on});
      });
    }
    {
      Runtime rt = Runtime::local(Mesh::parse("mp=2"));
      const int collectives = std::max(1, ops / 10);
      double off = 0, on = 0;
      rt.run([&](Shard& s) {
        Tensor x = pvary(s.full(Shape{{"i", 16}}, AxisRules{}, 1.0), "mp");
        auto reduce = [&] { static_cast<void>(psum(x, "mp")); };
        per_call(collectives, 1, reduce);
        const double measured_off = per_call(collectives, repeats, reduce);
        if (s.device() == 0) trace::start();
        static_cast<void>(psum(x, "mp"));  // both devices see the trace on before timing
        const double measured_on = per_call(collectives, repeats, reduce);
        static_cast<void>(psum(x, "mp"));
        if (s.device() == 0) trace::stop(), off = measured_off, on = measured_on;
      });
      trace::start();
      trace::stop();
      rows.push_back({"psum f32[i=16] over mp=2 (collective, wait, op slices)", off, on});
    }
    fmt::print("trace overhead per call ({} calls, median of {} runs)\n", ops, repeats);
    fmt::print("{:<56} {:>10} {:>10} {:>12}\n", "call", "off ns", "on ns", "on-off ns");
    for (const auto& r : rows) fmt::print("{:<56} {:>10.0f} {:>10.0f} {:>12.0f}\n", r.what, r.off_s * 1e9, r.on_s * 1e9, (r.on_s - r.off_s) * 1e9);
    std::vector<bench::JsonObject> json;
    for (const auto& r : rows) json.push_back(bench::JsonObject().add("call", r.what).add("off_ns", r.off_s * 1e9).add("on_ns", r.on_s * 1e9));
    if (!json_path.empty()) bench::write_text_file(json_path, bench::json_array(json) + "\n");
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
