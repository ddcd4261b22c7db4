// The timeline trace (nax/trace/trace.h): the JSON loads, one track per device, every collective on every
// device of its group with its mesh axes and bytes, waits for peers inside their collective and
// bracketing the rendezvous, slices nested as the code nests them, and nothing recorded when off.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "helpers.h"

using namespace nax;
using nlohmann::json;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / fmt::format("nax_trace_{}_{}", ::getpid(), name)).string();
}

json load(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return json::parse(in);
}

// The complete ("X") slices of a trace, per tid.
std::map<int, std::vector<json>> slices_by_device(const json& trace) {
  std::map<int, std::vector<json>> out;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X") out[e["tid"].get<int>()].push_back(e);
  return out;
}

double end_of(const json& e) { return e["ts"].get<double>() + e["dur"].get<double>(); }

// Whether `inner` lies within `outer` (timestamps in microseconds with nanosecond digits).
bool within(const json& inner, const json& outer) {
  return inner["ts"].get<double>() >= outer["ts"].get<double>() - 1e-3 && end_of(inner) <= end_of(outer) + 1e-3;
}

// A traced program on dp=2,mp=2: two psums over mp, one all_gather over dp, inside a phase.
json traced_program(const std::string& path) {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  trace::start();
  rt.run([](Shard& s) {
    const trace::Span phase("phase", "forward");
    Tensor x = s.random_normal(Shape{{"b", 8}, {"c", 4}}, AxisRules{}, 3, "x");
    Tensor v = pvary(x, "mp") * static_cast<double>(s.coord("mp") + 1);
    Tensor summed = psum(v, "mp");
    Tensor again = psum(pvary(summed, "mp") * 2.0, "mp");
    Tensor gathered = all_gather(pvary(again, "dp"), "dp", "b");
    static_cast<void>(gathered);
  });
  trace::stop();
  trace::write(path, "test");
  return load(path);
}

}  // namespace

TEST_CASE("trace: four device tracks, every psum on all four, waits inside collectives", "[mesh][trace]") {
  const std::string path = temp_path("program.json");
  const json t = traced_program(path);
  std::filesystem::remove(path);
  auto by_device = slices_by_device(t);
  REQUIRE(by_device.size() == 4);
  std::map<int, std::string> names;
  for (const auto& e : t["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
  for (int d = 0; d < 4; ++d) REQUIRE(names[d] == fmt::format("device {}", d));

  std::vector<std::vector<json>> psums(4), waits(4);
  for (int d = 0; d < 4; ++d) {
    INFO("device " << d);
    const auto& slices = by_device[d];
    std::vector<json> collectives, phases;
    for (const auto& e : slices) {
      REQUIRE(e["dur"].get<double>() >= 0);
      REQUIRE(e["pid"] == 0);
      if (e["cat"] == "collective") collectives.push_back(e);
      if (e["cat"] == "phase") phases.push_back(e);
      if (e["cat"] == "collective" && e["name"] == "psum") psums[static_cast<std::size_t>(d)].push_back(e);
      if (e["cat"] == "wait") waits[static_cast<std::size_t>(d)].push_back(e);
    }
    REQUIRE(phases.size() == 1);
    REQUIRE(collectives.size() == 3);
    REQUIRE(psums[static_cast<std::size_t>(d)].size() == 2);
    for (const auto& p : psums[static_cast<std::size_t>(d)]) {
      REQUIRE(p["args"]["mesh_axes"] == json::array({"mp"}));
      REQUIRE(p["args"]["bytes"] == 8 * 4 * 4);
      REQUIRE(p["args"]["group_size"] == 2);
      REQUIRE(p["args"]["vary"] == "varying{mp}");
    }
    // Every slice lies inside the phase; every wait inside a collective; ops exist (the multiplies).
    for (const auto& e : slices)
      if (e["cat"] != "phase") REQUIRE(within(e, phases[0]));
    for (const auto& w : waits[static_cast<std::size_t>(d)])
      REQUIRE(std::any_of(collectives.begin(), collectives.end(), [&](const json& c) { return within(w, c); }));
    REQUIRE(std::count_if(slices.begin(), slices.end(), [](const json& e) { return e["cat"] == "op" && e["name"] == "mul"; }) >= 2);
    REQUIRE(!waits[static_cast<std::size_t>(d)].empty());
  }
  // A rendezvous ends for nobody before everyone has arrived: in the first psum of each mp group,
  // the earliest end of a member's first wait is after the latest start.
  for (auto [a, b] : {std::pair{0, 1}, std::pair{2, 3}}) {
    const json& wa = waits[static_cast<std::size_t>(a)].front();
    const json& wb = waits[static_cast<std::size_t>(b)].front();
    REQUIRE(std::min(end_of(wa), end_of(wb)) >= std::max(wa["ts"].get<double>(), wb["ts"].get<double>()) - 1e-3);
  }
}

TEST_CASE("trace: a started collective's transfer is a slice on the device's transfers track, between its start and its wait",
          "[mesh][trace]") {
  const std::string path = temp_path("started.json");
  Runtime rt = Runtime::local(Mesh::parse("dp=2"));
  trace::start();
  rt.run([](Shard& s) {
    Tensor x = pvary(s.random_normal(Shape{{"b", 64}}, AxisRules{}, 3, "x"), "dp");
    Pending<Tensor> sum = start_psum(x, "dp");
    Tensor meanwhile = x * 2.0;
    static_cast<void>(meanwhile);
    static_cast<void>(sum.wait());
  });
  trace::stop();
  trace::write(path, "test");
  const json t = load(path);
  std::filesystem::remove(path);
  std::map<int, std::string> names;
  for (const auto& e : t["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
  auto by_track = slices_by_device(t);
  for (int d = 0; d < 2; ++d) {
    INFO("device " << d);
    const int tid = 2000 + d;
    REQUIRE(names[tid] == fmt::format("device {} transfers", d));
    std::vector<json> transfers;  // (the waits for peers inside it are there too)
    for (const auto& e : by_track[tid])
      if (e["cat"] == "collective") transfers.push_back(e);
    REQUIRE(transfers.size() == 1);
    const json& transfer = transfers[0];
    REQUIRE(transfer["name"] == "all_reduce");
    REQUIRE(transfer["args"]["bytes"] == 64 * 4);
    REQUIRE(transfer["args"]["started"].get<std::string>().starts_with("start_psum("));
    // it ends before the device's wait for it ends
    const auto& own = by_track[d];
    const auto done = std::find_if(own.begin(), own.end(), [](const json& e) { return e["name"] == "complete a started collective"; });
    REQUIRE(done != own.end());
    REQUIRE(end_of(transfer) <= end_of(*done) + 1e-3);
  }
}

TEST_CASE("trace: off records nothing, and start clears the last recording", "[mesh][trace]") {
  Runtime rt = Runtime::local(Mesh::parse("mp=2"));
  trace::start();
  rt.run([](Shard& s) { static_cast<void>(psum(pvary(s.full(Shape{{"a", 2}}, AxisRules{}, 1.0), "mp"), "mp")); });
  trace::stop();
  REQUIRE(trace::event_count() > 0);
  trace::start();
  REQUIRE(trace::event_count() == 0);
  trace::stop();
  REQUIRE(!trace::enabled());
  rt.run([](Shard& s) { static_cast<void>(psum(pvary(s.full(Shape{{"a", 2}}, AxisRules{}, 1.0), "mp"), "mp")); });
  REQUIRE(trace::event_count() == 0);
}

TEST_CASE("trace: Scope records its lifetime and writes on exit, a bad path is an error naming it", "[unit][trace]") {
  const std::string path = temp_path("scope.json");
  {
    trace::Scope scope(path, "scoped");
    REQUIRE(trace::enabled());
    const trace::Span outer("phase", "outer");
    const trace::Span inner("op", "inner \"quoted\"", [] { return std::string("\"k\": 1"); });
  }
  REQUIRE(!trace::enabled());
  const json t = load(path);
  std::filesystem::remove(path);
  auto host = slices_by_device(t);
  REQUIRE(host.size() == 1);
  const auto& slices = host.begin()->second;
  REQUIRE(slices.size() == 2);
  REQUIRE(slices[0]["name"] == "inner \"quoted\"");
  REQUIRE(slices[0]["args"]["k"] == 1);
  REQUIRE(within(slices[0], slices[1]));
  REQUIRE_THROWS_WITH(trace::write("/nonexistent/dir/t.json"), Catch::Contains("trace") && Catch::Contains("/nonexistent/dir/t.json"));
}

TEST_CASE("trace: one file per process under mpirun", "[unit][trace]") {
  REQUIRE(trace::process_path("run.json") == "run.json");
  trace::set_process(1, 2);
  CHECK(trace::process_path("out/run.json") == "out/run.rank1.json");
  CHECK(trace::process_path("out.d/run") == "out.d/run.rank1");
  trace::set_process(0, 1);
}

TEST_CASE("trace: a clock offset to process 0 shifts every timestamp and is recorded", "[unit][trace]") {
  const std::string path = temp_path("offset.json");
  double unshifted = 0, shifted = 0;
  for (std::int64_t offset : {std::int64_t{0}, std::int64_t{7'000'000'000}}) {  // 7 s: another host's clock ahead
    trace::set_clock_offset(offset, offset + 250);
    trace::start();
    const std::int64_t before = trace::clock_ns();
    { const trace::Span span("op", "timed"); }
    trace::stop();
    trace::write(path, "offset");
    const json t = load(path);
    const auto slices = slices_by_device(t).begin()->second;
    REQUIRE(slices.size() == 1);
    const double ts_us = slices[0]["ts"].get<double>();
    // Written on process 0's clock: this process's time minus the offset.
    CHECK(ts_us >= (before - offset) / 1e3 - 1e-3);
    (offset == 0 ? unshifted : shifted) = ts_us - before / 1e3;
    int records = 0;
    for (const auto& e : t["traceEvents"])
      if (e["ph"] == "M" && e["name"] == "process_name") {
        ++records;
        CHECK(e["args"]["clock_offset_us"].get<double>() == Approx(offset / 1e3));
        CHECK(e["args"]["measured_clock_offset_us"].get<double>() == Approx((offset + 250) / 1e3));
      }
    REQUIRE(records == 1);  // else the checks above checked nothing
  }
  CHECK(unshifted - shifted == Approx(7e6).margin(1e3));  // 7 s, to within 1 ms of scheduling
  trace::set_clock_offset(0, 0);
  std::filesystem::remove(path);
}
