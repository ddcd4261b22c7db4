// Start/wait collectives (nax/ops/async_collectives.h) on the thread runtime: every start form gives
// the blocking form's values and vary type, and the host reference, on meshes 1, 1x4, 2x2 and
// 4x1 over each group; several starts in flight at once, waited in any order; gradients of
// programs written with start forms against finite differences of the whole mesh program; and
// the misuses (a Pending waited twice or never, mismatched starts) as errors.
#include <fmt/format.h>

#include "grad_check.h"
#include "helpers.h"

using namespace nax;
using nax::testing::groups_of;
using Catch::Matchers::Contains;
using Catch::Matchers::Matches;

namespace {

const Shape kLocal{{"a", 4}, {"b", 3}};

Tensor input_of(int device) { return random_normal(kLocal, 23, fmt::format("x{}", device), 1.0, DType::f64); }

Tensor varying_input(Shard& s) { return pvary(s.shard(input_of(s.device()), {}), s.mesh().axis_names()); }

std::vector<std::pair<int, int>> ring(int n) {
  std::vector<std::pair<int, int>> pairs;
  for (int r = 0; r < n; ++r) pairs.push_back({r, (r + 1) % n});
  return pairs;
}

// Each device: the started result, the blocking one, and whether their vary types agree.
struct Both {
  std::vector<double> started, blocking;
  bool same_vary;
};

template <typename Start, typename Block>
std::vector<Both> run_both(Runtime& rt, Start start, Block block) {
  return rt.run([&](Shard& s) {
    const Tensor x = varying_input(s);
    Pending<Tensor> p = start(x);
    const Tensor a = p.wait();
    const Tensor b = block(x);
    return Both{a.to_vector<double>(), b.to_vector<double>(), a.vary() == b.vary() && a.shape() == b.shape()};
  });
}

template <typename Start, typename Block>
void require_same(Runtime& rt, Start start, Block block) {
  for (const auto& r : run_both(rt, start, block)) {
    REQUIRE(r.same_vary);
    REQUIRE(r.started == r.blocking);  // the same communicator calls: the same bits
  }
}

const std::vector<std::string> kMeshes{"mp=1", "mp=4", "dp=2,mp=2", "mp=4,dp=1"};

}  // namespace

TEST_CASE("start forms give the blocking forms' values and vary types", "[mesh][async]") {
  for (const auto& spec : kMeshes) {
    Mesh mesh = Mesh::parse(spec);
    Runtime rt = Runtime::local(mesh);
    for (const auto& axes : groups_of(mesh)) {
      INFO("mesh " << spec << " over " << Names(axes).str());
      const int n = mesh.group_size(axes);
      require_same(rt, [&](const Tensor& x) { return start_psum(x, axes); }, [&](const Tensor& x) { return psum(x, axes); });
      for (const std::string axis : {"a", "b"}) {  // stacking (all_gather_stacked) has no start form
        INFO("axis " << axis);
        require_same(rt, [&](const Tensor& x) { return start_all_gather(x, axes, axis); },
                     [&](const Tensor& x) { return all_gather(x, axes, axis); });
        require_same(rt, [&](const Tensor& x) { return start_all_gather_invariant(x, axes, axis); },
                     [&](const Tensor& x) { return all_gather_invariant(x, axes, axis); });
      }
      for (const std::string axis : {"a", "b"}) {
        if (kLocal.size(axis) % n != 0) continue;
        require_same(rt, [&](const Tensor& x) { return start_psum_scatter(x, axes, axis); },
                     [&](const Tensor& x) { return psum_scatter(x, axes, axis); });
      }
      require_same(rt, [&](const Tensor& x) { return start_ppermute(x, axes, ring(n)); },
                   [&](const Tensor& x) { return ppermute(x, axes, ring(n)); });
    }
  }
}

TEST_CASE("start_psum and start_ppermute against host references", "[mesh][async]") {
  for (const auto& spec : kMeshes) {
    Mesh mesh = Mesh::parse(spec);
    Runtime rt = Runtime::local(mesh);
    for (const auto& axes : groups_of(mesh)) {
      INFO("mesh " << spec << " over " << Names(axes).str());
      const int n = mesh.group_size(axes);
      auto got = rt.run([&](Shard& s) {
        Pending<Tensor> sum = start_psum(varying_input(s), axes);
        Pending<Tensor> shifted = start_ppermute(varying_input(s), axes, ring(n));
        return std::pair{shifted.wait().to_vector<double>(), sum.wait().to_vector<double>()};
      });
      for (int d = 0; d < mesh.size(); ++d) {
        const auto members = mesh.group(d, axes);
        const int r = mesh.rank_in_group(d, axes);
        std::vector<double> want_sum(static_cast<std::size_t>(kLocal.numel()));
        for (int m : members) {
          const auto v = input_of(m).to_vector<double>();
          for (std::size_t i = 0; i < v.size(); ++i) want_sum[i] += v[i];
        }
        const auto& [shifted, summed] = got[static_cast<std::size_t>(d)];
        REQUIRE(nax::testing::max_rel_error(summed, want_sum) <= 1e-12);
        REQUIRE(shifted == input_of(members[static_cast<std::size_t>((r + n - 1) % n)]).to_vector<double>());
      }
    }
  }
}

TEST_CASE("several starts in flight over one group and over others, waited in any order", "[mesh][async]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  auto results = rt.run([&](Shard& s) {
    const Tensor x = varying_input(s);
    Pending<Tensor> summed = start_psum(x, "mp");
    Pending<Tensor> gathered = start_all_gather(x, "dp", "b");
    Pending<Tensor> shifted = start_ppermute(x, "mp", ring(2));
    Pending<Tensor> scattered = start_psum_scatter(x, {"dp", "mp"}, "a");
    const Tensor local = x * x;  // computed while they are in flight
    std::vector<double> diffs;
    for (auto [got, want] : {std::pair{shifted.wait(), ppermute(x, "mp", ring(2))}, std::pair{summed.wait(), psum(x, "mp")},
                             std::pair{scattered.wait(), psum_scatter(x, {"dp", "mp"}, "a")},
                             std::pair{gathered.wait(), all_gather(x, "dp", "b")}})
      diffs.push_back(nax::testing::max_rel_error(got.to_vector<double>(), want.to_vector<double>()));
    NAX_EXPECT(local.defined());
    return diffs;
  });
  for (const auto& diffs : results)
    for (double d : diffs) REQUIRE(d == 0);
}

TEST_CASE("gradients through started collectives match finite differences", "[mesh][async][grad]") {
  // all_gather, ppermute, psum_scatter and psum, each started, with compute between start and wait.
  auto program = [](Shard& s, const std::vector<Tensor>& p) {
    const Tensor& w = p[0];  // [a, b], a cut over mp
    const int n = axis_size("mp");
    Pending<Tensor> gathering = start_all_gather(w, "mp", "a");
    Pending<Tensor> shifting = start_ppermute(w, "mp", ring(n));
    const Tensor between = w * 0.5;
    const Tensor y = gathering.wait();
    Pending<Tensor> scattering = start_psum_scatter(y * y, "mp", "a");
    const Tensor z = shifting.wait() + between;
    const Tensor q = scattering.wait();
    Tensor loss = start_psum(sum(q * z, {"a", "b"}), "mp").wait();
    static_cast<void>(s);
    return loss;
  };
  for (const std::string spec : {"mp=1", "mp=4", "dp=2,mp=2"}) {
    INFO("mesh " << spec);
    Runtime rt = Runtime::local(Mesh::parse(spec));
    const Tensor w = nax::testing::random_input(Shape{{"a", 8}, {"b", 2}}, "w");
    nax::testing::check_mesh_gradients(rt, program, {w}, AxisRules{{"a", "mp"}});
  }
}

TEST_CASE("gradients of started and blocking collectives agree", "[mesh][async][grad]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  auto grads = rt.run([&](Shard& s) {
    const Tensor w = s.shard(random_normal(Shape{{"a", 8}, {"b", 3}}, 5, "w", 1.0, DType::f64), AxisRules{{"a", "mp"}});
    const Tensor v = varying_input(s);
    auto loss_of = [&](bool started, const std::vector<Tensor>& p) {
      // t is Split over mp and Invariant over dp: marked Varying over dp before gathering over both.
      auto gather = [&](const Tensor& t) {
        return started ? start_all_gather(pvary(t, "dp"), {"dp", "mp"}, "a").wait() : all_gather(pvary(t, "dp"), {"dp", "mp"}, "a");
      };
      auto shift = [&](const Tensor& t) { return started ? start_ppermute(t, "dp", ring(2)).wait() : ppermute(t, "dp", ring(2)); };
      auto total = [&](const Tensor& t) { return started ? start_psum(t, {"dp", "mp"}).wait() : psum(t, {"dp", "mp"}); };
      // Per-device values and a partial sum over mp (a is cut), each finished by its own psum.
      return total(sum(gather(p[0]) * 2.0, {"a", "b"})) + total(sum(shift(p[1] * p[0]) * p[1], {"a", "b"}));
    };
    auto g_started = value_and_grad([&](const std::vector<Tensor>& p) { return loss_of(true, p); }, {w, v}).second;
    auto g_blocking = value_and_grad([&](const std::vector<Tensor>& p) { return loss_of(false, p); }, {w, v}).second;
    double worst = 0;
    for (std::size_t i = 0; i < 2; ++i) {
      NAX_EXPECT(g_started[i].vary() == g_blocking[i].vary());
      worst = std::max(worst, nax::testing::max_rel_error(g_started[i].to_vector<double>(), g_blocking[i].to_vector<double>()));
    }
    return worst;
  });
  for (double e : grads) REQUIRE(e <= 1e-12);
}

// FSDP's pattern: a parameter cut along a over mp, gathered whole, applied to this device's rows of
// a batch cut over mp; its gradient's per-device terms (a contraction over the cut batch) are
// reduce-scattered, and a term of the parameter alone (summed already) is sliced.
Tensor fsdp_loss(Shard& s, const Tensor& whole) {
  const Tensor rows = s.shard(random_normal(Shape{{"batch", 8}, {"b", 3}}, 9, "rows", 1.0, DType::f64), AxisRules{{"batch", "mp"}});
  const Tensor y = dot(rows, whole, "b");  // [batch, a], batch cut over mp
  // A term whose gradient varies over every mesh axis (dp too, where the parameter is Invariant).
  const Tensor mixed = psum(sum(slice(whole, "a", 0, 4) * varying_input(s), {"a", "b"}), s.mesh().axis_names());
  return psum(sum(y * y, {"batch", "a"}), "mp") + sum(whole * whole, {"a", "b"}) * 0.25 + mixed;
}

Tensor fsdp_parameter(Shard& s) {
  return s.shard(random_normal(Shape{{"a", 8}, {"b", 3}}, 7, "w", 1.0, DType::f64), AxisRules{{"a", "mp"}});
}

TEST_CASE("start_all_gather_invariant gathers a parameter as FSDP does, with the blocking form's gradients", "[mesh][async][grad]") {
  for (const std::string spec : {"mp=2", "dp=2,mp=2", "mp=4"}) {
    INFO("mesh " << spec);
    Runtime rt = Runtime::local(Mesh::parse(spec));
    const auto errors = rt.run([&](Shard& s) {
      auto loss_of = [&](bool started, const std::vector<Tensor>& p) {
        return fsdp_loss(s, started ? start_all_gather_invariant(p[0], "mp", "a").wait() : all_gather_invariant(p[0], "mp", "a"));
      };
      const Tensor w = fsdp_parameter(s);
      const auto [loss_started, g_started] = value_and_grad([&](const std::vector<Tensor>& p) { return loss_of(true, p); }, {w});
      const auto [loss_blocking, g_blocking] = value_and_grad([&](const std::vector<Tensor>& p) { return loss_of(false, p); }, {w});
      NAX_EXPECT(g_started[0].vary() == g_blocking[0].vary() && g_started[0].vary() == w.vary());
      NAX_EXPECT(loss_started.item() == loss_blocking.item());
      return nax::testing::max_rel_error(g_started[0].to_vector<double>(), g_blocking[0].to_vector<double>());
    });
    for (double e : errors) REQUIRE(e == 0);
  }
  // Started and blocking forms make the same calls over mp: one gather forward, one reduce-scatter
  // of the per-device terms backward (half an all-reduce's bytes).
  auto calls_of = [](bool started) {
    Runtime rt = Runtime::local(Mesh::parse("mp=4"));
    rt.run([&](Shard& s) {
      value_and_grad([&](const std::vector<Tensor>& p) {
        return fsdp_loss(s, started ? start_all_gather_invariant(p[0], "mp", "a").wait() : all_gather_invariant(p[0], "mp", "a"));
      }, {fsdp_parameter(s)});
    });
    return rt.comm_stats_by_axes(0).at("mp");
  };
  const CommStats started = calls_of(true), blocking = calls_of(false);
  REQUIRE(started.calls == blocking.calls);
  REQUIRE(started.bytes == blocking.bytes);
  REQUIRE(started.calls[static_cast<std::size_t>(CollectiveKind::reduce_scatter)] == 1);
  REQUIRE(started.calls[static_cast<std::size_t>(CollectiveKind::all_gather)] == 1);
  // Against finite differences of the whole mesh program.
  auto program = [](Shard& s, const std::vector<Tensor>& p) {
    Pending<Tensor> gathering = start_all_gather_invariant(p[0], "mp", "a");
    const Tensor x = varying_input(s) * 0.5;  // computed while the gather runs
    const Tensor whole = gathering.wait();
    const Tensor per_device = psum(sum(slice(whole, "a", 0, 4) * x, {"a", "b"}), s.mesh().axis_names());
    return per_device + sum(whole * whole, {"a", "b"});
  };
  for (const std::string spec : {"mp=1", "mp=4", "dp=2,mp=2"}) {
    INFO("finite differences on mesh " << spec);
    Runtime rt = Runtime::local(Mesh::parse(spec));
    nax::testing::check_mesh_gradients(rt, program, {nax::testing::random_input(Shape{{"a", 8}, {"b", 3}}, "w")}, AxisRules{{"a", "mp"}});
  }
}

TEST_CASE("a Pending is waited for once: twice, never, or empty is an error", "[mesh][async][errors]") {
  Runtime rt = Runtime::local(Mesh::parse("mp=2"));
  REQUIRE_THROWS_WITH(rt.run([](Shard& s) {
                        Pending<Tensor> p = start_psum(varying_input(s), "mp");
                        static_cast<void>(p.wait());
                        static_cast<void>(p.wait());
                      }),
                      Matches(".*start_psum\\(f64\\[a=4, b=3\\] varying\\{mp\\}, mp\\) at tests/test_async\\.cpp:[0-9]+:[0-9]+ was already "
                              "waited for.*"));
  REQUIRE_THROWS_WITH(rt.run([](Shard& s) { Pending<Tensor> p = start_all_gather(varying_input(s), "mp", "a"); }),
                      Contains("start_all_gather(") && Contains("test_async.cpp") && Contains("destroyed without wait()"));
  REQUIRE_THROWS_WITH(rt.run([](Shard&) { static_cast<void>(Pending<Tensor>().wait()); }), Contains("holds no collective"));
  // The runtime goes on, and an unwaited Pending of a failed run does not leak into the next.
  REQUIRE_THROWS_WITH(rt.run([](Shard& s) {
                        Pending<Tensor> p = start_psum(varying_input(s), "mp");
                        fail("program", "fails before waiting");
                      }),
                      Contains("fails before waiting"));
  auto ok = rt.run([](Shard& s) { return start_psum(varying_input(s), "mp").wait().to_vector<double>(); });
  REQUIRE(ok[0] == ok[1]);
}

TEST_CASE("start forms refuse what the blocking forms refuse, with the same messages", "[mesh][async][errors]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  auto message = [&](const std::function<void(Shard&)>& fn) {
    try {
      rt.run(fn);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto invariant = [](Shard&) { return ones(Shape{{"i", 4}}); };
  REQUIRE(message([&](Shard& s) { static_cast<void>(start_psum(invariant(s), "mp").wait()); }) ==
          message([&](Shard& s) { psum(invariant(s), "mp"); }));
  REQUIRE(message([&](Shard& s) { static_cast<void>(start_psum_scatter(varying_input(s), "mp", "b").wait()); }) ==
          message([&](Shard& s) { psum_scatter(varying_input(s), "mp", "b"); }));
  REQUIRE(message([&](Shard& s) { static_cast<void>(start_ppermute(varying_input(s), "mp", {{0, 1}, {1, 1}}).wait()); }) ==
          message([&](Shard& s) { ppermute(varying_input(s), "mp", {{0, 1}, {1, 1}}); }));
  REQUIRE_THAT(message([&](Shard& s) { static_cast<void>(start_psum(invariant(s), "tp").wait()); }), Contains("tp"));
}

TEST_CASE("mismatched starts across devices are errors on every device, not hangs", "[mesh][async][errors]") {
  Runtime rt = Runtime::local(Mesh::parse("mp=2"));
  // Different shapes: the blocking form's message.
  REQUIRE_THROWS_WITH(rt.run([](Shard& s) {
                        Pending<Tensor> p = start_psum(pvary(ones(Shape{{"i", 4 + s.device()}}), "mp"), "mp");
                        static_cast<void>(p.wait());
                      }),
                      Contains("collective mismatch in") && Contains("start_psum(f32[i=4] varying{mp}, mp) at tests/test_async.cpp:") &&
                          Contains("[all_reduce(sum, f32 x 4)]") && Contains("f32 x 5"));
  // Different orders of two starts.
  REQUIRE_THROWS_WITH(rt.run([](Shard& s) {
                        const Tensor x = pvary(ones(Shape{{"i", 4}}), "mp");
                        if (s.device() == 0) {
                          Pending<Tensor> a = start_psum(x, "mp"), b = start_all_gather(x, "mp", "i");
                          static_cast<void>(a.wait()), static_cast<void>(b.wait());
                        } else {
                          Pending<Tensor> b = start_all_gather(x, "mp", "i"), a = start_psum(x, "mp");
                          static_cast<void>(a.wait()), static_cast<void>(b.wait());
                        }
                      }),
                      Contains("collective mismatch in") && Contains("start_psum(") && Contains("start_all_gather("));
  // A start on one device, nothing on the other.
  REQUIRE_THROWS_WITH(rt.run([](Shard& s) {
                        if (s.device() == 0) static_cast<void>(start_psum(pvary(ones(Shape{{"i", 4}}), "mp"), "mp").wait());
                      }),
                      Contains("finished its program without calling it"));
  // A backward that only one device runs: its transpose is named as the start form's.
  REQUIRE_THROWS_WITH(rt.run([](Shard& s) {
                        const Tensor x = parameter(pvary(ones(Shape{{"i", 2}}), "mp"));
                        const Tensor gathered = start_all_gather(x, "mp", "i").wait();
                        const Tensor loss = s.device() == 0 ? sum(gathered, "i") : sum(x, "i");
                        grad(loss, {x}, {.allow_varying_loss = true});
                      }),
                      Matches(".*start_psum_scatter\\(.* in the backward of start_all_gather at tests/test_async\\.cpp:[0-9]+:[0-9]+.*"));
  auto ok = rt.run([](Shard&) { return start_psum(pvary(ones(Shape{{"i", 4}}), "mp"), "mp").wait().to_vector<double>(); });
  REQUIRE(ok[0] == std::vector<double>(4, 2.0));
}

TEST_CASE("a start on threads returns before its peers arrive: other groups can meet in between", "[mesh][async]") {
  // Legal in each group's order (one psum over mp, one over (dp,mp)), but only when a start does
  // not wait for the group: device 0 starts over mp, then meets device 1 over (dp,mp), which
  // starts over mp only afterwards. A blocking start would be a deadlock (reported as one).
  Runtime rt = Runtime::local(Mesh::parse("dp=1,mp=2"));
  auto results = rt.run([](Shard& s) {
    const Tensor x = pvary(full(Shape{{"i", 3}}, s.device() + 1.0), {"dp", "mp"});
    // One call site for each collective (devices at different lines would be a mismatch).
    auto start_over_mp = [&] { return start_psum(x, "mp"); };
    auto sum_over_both = [&] { return psum(x, {"dp", "mp"}); };
    Tensor over_both, over_mp;
    if (s.device() == 0) {
      Pending<Tensor> p = start_over_mp();
      over_both = sum_over_both();
      over_mp = p.wait();
    } else {
      over_both = sum_over_both();
      over_mp = start_over_mp().wait();
    }
    return std::pair{over_mp.to_vector<double>(), over_both.to_vector<double>()};
  });
  for (const auto& [over_mp, over_both] : results) {
    REQUIRE(over_mp == std::vector<double>(3, 3.0));
    REQUIRE(over_both == std::vector<double>(3, 3.0));
  }
}

TEST_CASE("a tensor a started collective reads cannot be written until its wait, nor after", "[mesh][async][errors]") {
  Runtime rt = Runtime::local(Mesh::parse("mp=2"));
  // The example that gave {200, 2}: the write is refused naming the collective in flight.
  REQUIRE_THROWS_WITH(rt.run([](Shard&) {
                        Tensor x = Tensor::empty(Shape{{"i", 2}}, DType::f32);
                        x.mutable_data<float>()[0] = 1, x.mutable_data<float>()[1] = 1;
                        x = pvary(x, "mp");
                        auto p = start_psum(x, "mp");
                        x.mutable_data<float>()[0] = 100;
                        return p.wait().to_vector<double>();
                      }),
                      Contains("mutable_data") && Contains("psum") && Contains("in flight") && Contains("wait()"));
  // After the wait it was still read by an op: immutable as every used tensor; the sum is {2, 2}.
  auto sums = rt.run([](Shard&) {
    Tensor x = Tensor::empty(Shape{{"i", 2}}, DType::f32);
    x.mutable_data<float>()[0] = 1, x.mutable_data<float>()[1] = 1;
    x = pvary(x, "mp");
    auto p = start_psum(x, "mp");
    const Tensor y = p.wait();
    bool refused = false;
    try {
      x.mutable_data<float>()[0] = 100;
    } catch (const Error& e) {
      refused = std::string(e.what()).find("immutable") != std::string::npos;
    }
    NAX_EXPECT(refused);
    return y.to_vector<double>();
  });
  for (const auto& s : sums) REQUIRE(s == std::vector<double>{2, 2});
}

TEST_CASE("a backward whose devices skip different transposes of one line's collectives fails at the first, naming both calls",
          "[async][grad][errors]") {
  // Two ppermutes from one line in a loop: device 1 leaves the second result unused, so its backward
  // starts with the first's transpose where device 0 starts with the second's; same line, same
  // shapes: only the calls' numbers tell them apart (without them the two would pair up, wrongly).
  Runtime rt = Runtime::local(Mesh::parse("x=2"));
  REQUIRE_THROWS_WITH(rt.run([](Shard& s) {
    const Tensor w = parameter(s.shard(ones(Shape{{"i", 4}}), {}));
    const std::vector<std::pair<int, int>> swap{{0, 1}, {1, 0}};
    std::vector<Tensor> moved;
    for (int k = 0; k < 2; ++k) moved.push_back(start_ppermute(w * static_cast<double>(k + 1), "x", swap).wait());
    Tensor loss = s.coord("x") == 0 ? sum(moved[0] + moved[1], "i") : sum(moved[0], "i");
    (void)grad(psum(loss, "x"), {w});
  }), Contains("in the backward of start_ppermute") && Contains("the group's call 2") && Contains("the group's call 1"));
}
