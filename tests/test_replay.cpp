// The replay of a step's timeline (examples/gptj/replay.h): its arithmetic on timelines written by
// hand (overlap of started collectives, groups meeting at blocking ones, a communicator's calls in
// order, groups of a 2-D mesh apart, the link fit), and on a traced GPT-J step, where the replay on
// this machine's own constants must give the measured step time within 10%.
#include "compare.h"
#include "gptj_helpers.h"
#include "helpers.h"
#include "replay.h"

using namespace nax;
using Catch::Matchers::Contains;
using gptj::Timeline;
using gptj::TimelineEvent;
using Kind = TimelineEvent::Kind;

namespace {

TimelineEvent compute(double s) {
  TimelineEvent e;
  e.seconds = s;
  return e;
}

TimelineEvent collective(Kind kind, const std::string& axis, std::size_t bytes, std::uint64_t ticket = 0) {
  TimelineEvent e;
  e.kind = kind, e.collective = CollectiveKind::all_reduce, e.bytes = bytes, e.mesh_axes = {axis}, e.ticket = ticket;
  return e;
}

TimelineEvent wait(std::uint64_t ticket) {
  TimelineEvent e;
  e.kind = Kind::wait, e.ticket = ticket;
  return e;
}

// Every collective costs its bytes in seconds.
gptj::ReplayCosts by_bytes(double scale = 1) {
  return {scale, [](CollectiveKind, std::size_t bytes, const std::vector<std::string>&) { return static_cast<double>(bytes); }};
}

}  // namespace

TEST_CASE("replay: a started collective overlaps the compute until its wait, from when its whole group started it", "[unit][replay]") {
  const Mesh mesh = Mesh::parse("dp=2");
  const std::vector<Timeline> t = {
      {compute(1.0), collective(Kind::start, "dp", 3, 1), compute(2.0), wait(1), compute(0.5)},
      {compute(1.5), collective(Kind::start, "dp", 3, 1), compute(1.0), wait(1), compute(0.5)},
  };
  // the transfer runs from 1.5 (the later start) to 4.5; both wait for it, then compute 0.5
  REQUIRE(gptj::replay(t, mesh, by_bytes()) == Approx(5.0));
  REQUIRE(gptj::busiest_compute_s(t) == Approx(3.5));
  // compute twice as slow: starts at 2 and 3, transfer 3 to 6; device 0 computes until 6, then 1
  REQUIRE(gptj::replay(t, mesh, by_bytes(2.0)) == Approx(7.0));
  // a transfer shorter than the compute in between is hidden entirely
  const auto cheap = gptj::replay(t, mesh, {1.0, [](CollectiveKind, std::size_t, const std::vector<std::string>&) { return 0.1; }});
  REQUIRE(cheap == Approx(3.5));
}

TEST_CASE("replay: a blocking collective starts when the last of its group arrives; a communicator runs its calls in order",
          "[unit][replay]") {
  const Mesh mesh = Mesh::parse("dp=2");
  const std::vector<Timeline> skewed = {
      {compute(1.0), collective(Kind::collective, "dp", 2), compute(1.0)},
      {compute(3.0), collective(Kind::collective, "dp", 2), compute(1.0)},
  };
  REQUIRE(gptj::replay(skewed, mesh, by_bytes()) == Approx(6.0));
  // two started back to back: the second transfer follows the first (1 to 3, then 3 to 4); waited in
  // the other order
  const std::vector<Timeline> queued = {
      {compute(1.0), collective(Kind::start, "dp", 2, 7), collective(Kind::start, "dp", 1, 8), wait(8), wait(7)},
      {compute(1.0), collective(Kind::start, "dp", 2, 3), collective(Kind::start, "dp", 1, 4), wait(4), wait(3)},
  };
  REQUIRE(gptj::replay(queued, mesh, by_bytes()) == Approx(4.0));
  // a blocking call after a started one waits for it on the communicator
  const std::vector<Timeline> drained = {
      {collective(Kind::start, "dp", 5, 1), collective(Kind::collective, "dp", 1), wait(1)},
      {collective(Kind::start, "dp", 5, 1), collective(Kind::collective, "dp", 1), wait(1)},
  };
  REQUIRE(gptj::replay(drained, mesh, by_bytes()) == Approx(6.0));
}

TEST_CASE("replay: the groups of a 2-D mesh meet apart; mismatched timelines are an error", "[unit][replay]") {
  const Mesh mesh = Mesh::parse("dp=2,mp=2");  // devices 0,1 share dp=0: one mp group; 2,3 the other
  std::vector<Timeline> t(4);
  for (int d = 0; d < 4; ++d) t[static_cast<std::size_t>(d)] = {compute(d == 3 ? 5.0 : 1.0), collective(Kind::collective, "mp", 1)};
  // the mp group {0, 1} meets at 1 and ends at 2; {2, 3} waits for device 3 until 5, ends at 6
  REQUIRE(gptj::replay(t, mesh, by_bytes()) == Approx(6.0));
  t[0].push_back(collective(Kind::collective, "dp", 1));  // device 2 never joins this dp call
  REQUIRE_THROWS_WITH(gptj::replay(t, mesh, by_bytes()), Contains("device 0 is stuck"));
  REQUIRE_THROWS_WITH(gptj::replay({{compute(1)}}, mesh, by_bytes()), Contains("1 timelines for the 4 devices"));
  REQUIRE_THROWS_WITH(gptj::replay({{wait(9)}, {}, {}, {}}, mesh, by_bytes()), Contains("never started"));
}

TEST_CASE("replay: devices beyond the cores share them, a device waiting in a collective leaves its core, work is CPU time",
          "[unit][replay]") {
  const Mesh mesh = Mesh::parse("dp=2,mp=2");
  auto with_cores = [](int cores) {
    gptj::ReplayCosts costs = by_bytes();
    costs.cores = cores;
    return costs;
  };
  const std::vector<Timeline> even(4, Timeline{compute(1.0)});
  REQUIRE(gptj::replay(even, mesh, with_cores(2)) == Approx(2.0));  // four on two cores, each at half speed
  REQUIRE(gptj::replay(even, mesh, with_cores(4)) == Approx(1.0));
  REQUIRE(gptj::replay(even, mesh, with_cores(0)) == Approx(1.0));
  // the long one runs alone once the others are done: 4 s, not the 3 s of the work over two cores
  const std::vector<Timeline> uneven = {{compute(3.0)}, {compute(1.0)}, {compute(1.0)}, {compute(1.0)}};
  REQUIRE(gptj::replay(uneven, mesh, with_cores(2)) == Approx(4.0));
  // device 0 waits for device 1 from 1 s to 2.5 s: the other three share the two cores meanwhile, at
  // 2/3 each, so no core idles and the step is the work over the cores, 3.5 s
  const std::vector<Timeline> waiting = {{compute(0.5), collective(Kind::collective, "mp", 0), compute(0.5)},
                                         {compute(1.5), collective(Kind::collective, "mp", 0), compute(0.5)},
                                         {compute(2.0)},
                                         {compute(2.0)}};
  REQUIRE(gptj::replay(waiting, mesh, with_cores(2)) == Approx(3.5));
  // a compute event's work is its CPU time where the trace has it (the rest was waiting for a core)
  TimelineEvent shared = compute(2.0);
  shared.cpu_seconds = 1.0;
  REQUIRE(gptj::work_of(shared) == 1.0);
  REQUIRE(gptj::replay({{shared}, {compute(1.0)}, {compute(1.0)}, {compute(1.0)}}, mesh, with_cores(2)) == Approx(2.0));
  REQUIRE(gptj::busiest_compute_s({{shared}, {compute(1.5)}}) == Approx(1.5));
}

TEST_CASE("replay: fit_links recovers a link from transfers priced on it", "[unit][replay]") {
  const Mesh mesh = Mesh::parse("dp=4");
  const Link truth{"dp", 7e-6, 3e9};
  std::vector<Timeline> t(4);
  for (const std::size_t bytes : {std::size_t{1} << 10, std::size_t{1} << 16, std::size_t{1} << 22}) {
    auto e = collective(Kind::collective, "dp", bytes);
    e.seconds = CostModel::seconds(CollectiveKind::all_reduce, bytes, 4, truth);
    t[0].push_back(e);
  }
  const auto links = gptj::fit_links(t, mesh);
  REQUIRE(links.at({"dp"}).latency_s == Approx(truth.latency_s).epsilon(1e-6));
  REQUIRE(links.at({"dp"}).bandwidth_Bps == Approx(truth.bandwidth_Bps).epsilon(1e-6));
}

// A traced step of GPT-J small on two devices (one per core here: the replay treats devices as
// parallel, which simulated devices sharing cores are not, docs/trace.md), with the gradients'
// buckets started during the backward on dp=2: the replay with the step's own compute and the
// links fitted to its own collectives gives the measured step time within 10%.
TEST_CASE("replay: a traced GPT-J step replayed on this machine's own constants takes the measured time within 10%",
          "[e2e][replay]") {
  for (const std::string mesh : {"dp=2,mp=1", "dp=1,mp=2", "dp=2,mp=2"}) {
    INFO("mesh " << mesh);
    gptj::CompareOptions o;
    o.train = nax::testing::tiny(mesh, 3);
    o.train.config = "small", o.train.batch = 8, o.train.seq = 128, o.train.bucket_mb = 2, o.train.quiet = true;
    o.timing_skip = 1;
    const auto rows = gptj::compare(o, nax::testing::corpus());
    REQUIRE(rows.size() == 2);
    for (const auto& row : rows) {
      INFO(row.sharding << ": measured " << row.traced_step_s << " s, replayed " << row.replayed_step_s << " s");
      REQUIRE(!row.timelines.empty());
      REQUIRE(row.replayed_step_s == Approx(row.traced_step_s).epsilon(0.10));
      if (mesh == "dp=2,mp=1" && row.sharding == "hand") {  // the buckets were started: some transfer overlapped compute
        const auto& t0 = row.timelines[0];
        REQUIRE(std::count_if(t0.begin(), t0.end(), [](const TimelineEvent& e) { return e.kind == Kind::start; }) >= 2);
      }
    }
  }
}

// Sequence parallelism's gathers and reduce-scatters over mp, started per piece of the batch: on
// device 0's traced step, in the forward and (their transposes) in the backward, the device
// computes between a start and its wait. In one piece nothing over mp is started.
TEST_CASE("replay: sequence parallelism's collectives over mp overlap the other pieces' compute in the traced step",
          "[e2e][replay][sequence_parallel]") {
  auto overlapped_over_mp = [](std::int64_t pieces) {
    gptj::CompareOptions o;
    o.train = nax::testing::tiny("dp=1,mp=2", 3);
    o.train.sequence_parallel = true, o.train.overlap_pieces = pieces;
    o.timing_skip = 1;
    const auto rows = gptj::compare(o, nax::testing::corpus());
    REQUIRE(!rows.empty());
    const Timeline& t0 = rows[0].timelines.at(0);
    std::map<CollectiveKind, int> overlapped;  // started collectives over mp with compute before their wait, by kind
    for (std::size_t i = 0; i < t0.size(); ++i) {
      if (t0[i].kind != Kind::start || t0[i].mesh_axes != std::vector<std::string>{"mp"}) continue;
      for (std::size_t j = i + 1; j < t0.size() && !(t0[j].kind == Kind::wait && t0[j].ticket == t0[i].ticket); ++j)
        if (t0[j].kind == Kind::compute && t0[j].seconds > 0) {
          overlapped[t0[i].collective] += 1;
          break;
        }
    }
    return overlapped;
  };
  const auto two = overlapped_over_mp(2);
  // Per block: the second piece's gather and the first piece's reduce-scatter, forward and backward.
  const int layers = static_cast<int>(gptj::config_by_name("tiny").n_layers);
  auto count = [&](CollectiveKind kind) { return two.count(kind) != 0 ? two.at(kind) : 0; };
  CHECK(count(CollectiveKind::all_gather) >= 2 * layers);
  CHECK(count(CollectiveKind::reduce_scatter) >= 2 * layers);
  CHECK(overlapped_over_mp(1).empty());
}

// A deterministic FSDP run (started gathers, their transposes, the mode's tree psums) is replayed:
// every wait pairs with its start.
TEST_CASE("replay: deterministic FSDP steps are replayed (every wait pairs with its start)", "[e2e][replay][deterministic]") {
  gptj::CompareOptions o;
  o.train = nax::testing::tiny("mp=2,fsdp=2", 3);
  o.train.deterministic = true;
  o.timing_skip = 1;
  const auto rows = gptj::compare(o, nax::testing::corpus());
  REQUIRE(!rows.empty());
  const auto& t0 = rows[0].timelines.at(0);
  REQUIRE(std::count_if(t0.begin(), t0.end(), [](const TimelineEvent& e) { return e.kind == Kind::start; }) > 0);
  REQUIRE(rows[0].replayed_step_s > 0);
}
