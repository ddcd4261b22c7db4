// The GPT-J example on meshes with the cp and fsdp axes. Context parallelism (ring_attention.h,
// block.h): the sequence in zigzag chunks over cp, ring attention with started ppermutes. FSDP
// (model.cpp): the batch and every parameter's embed axis cut over fsdp, parameters gathered where
// used and their gradients reduce-scattered. On tiny the loss and every parameter's gradient equal
// one device's (with dp and mp, with remat), training matches one device on up to 8 devices, a
// checkpoint saved on such a mesh resumes on another, and what they do not go with is refused. In
// deterministic mode cp meshes give one device's bits.

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "compare.h"
#include "gptj_helpers.h"
#include "helpers.h"
#include "plan.h"
#include "ring_attention.h"

using namespace nax;
using Catch::Matchers::Contains;
using nax::testing::corpus;
using nax::testing::tiny;

namespace {

nax::testing::LossAndGrads loss_and_grads(const std::string& mesh, bool remat) {
  return nax::testing::loss_and_grads(mesh, [remat](gptj::Model& model) { model.set_remat(remat); });
}

// Counts, on the device threads it watches, the results that ops fill after returning: started
// collectives'.
struct StartedCount final : trace::Observer {
  std::atomic<int> started{0};
  void opened(std::string_view, std::string_view) override {}
  void closed() override {}
  void made(const Tensor&) override {}
  void filled_later() override { ++started; }
  void terms_kept(const Tensor&, const std::vector<Tensor>&) override {}
};

}  // namespace

TEST_CASE("zigzag_order: device r holds chunks r and 2 cp - 1 - r", "[gptj][context_parallel]") {
  const Tensor positions = arange(Axis{"seq", 12}, DType::i32);
  const auto ordered = gptj::zigzag_order(expand_dims(positions, "batch"), 3).to_vector<std::int32_t>();
  REQUIRE(ordered == std::vector<std::int32_t>{0, 1, 10, 11, 2, 3, 8, 9, 4, 5, 6, 7});
  REQUIRE(gptj::zigzag_order(positions, 1).same_storage(positions));
}

TEST_CASE("gptj on cp and fsdp meshes: the loss and every parameter's gradient are one device's", "[gptj][context_parallel][fsdp][mesh]") {
  const auto specs = gptj::parameter_specs(gptj::config_by_name("tiny"));
  const auto one = loss_and_grads("dp=1,mp=1", false);
  for (const auto& [mesh, remat] : std::vector<std::pair<std::string, bool>>{
           {"cp=2", false}, {"cp=4", false}, {"mp=2,cp=2", false}, {"dp=2,cp=2", false}, {"cp=2", true}, {"dp=2,mp=2,cp=2", true},
           {"fsdp=2", false}, {"fsdp=4", false}, {"dp=2,fsdp=2", false}, {"mp=2,fsdp=2", true}, {"fsdp=2,cp=2", false}}) {
    INFO("mesh " << mesh << (remat ? " --remat" : ""));
    const auto cut = loss_and_grads(mesh, remat);
    nax::testing::require_close({cut.loss}, {one.loss}, 1e-5);
    REQUIRE(cut.grads.size() == specs.size());
    for (std::size_t i = 0; i < specs.size(); ++i) nax::testing::check_close_scaled(cut.grads[i], one.grads[i], 1e-5, specs[i].name);
  }
}

// The residual stream placed batch-cut over dp and fsdp (global_model.cpp) and propagation pricing
// the sum a partial result owes: the parameters gathered as FSDP gathers them. Without either the
// view moved 3 to 12 times FSDP's bytes, psumming activations over fsdp.
TEST_CASE("gptj --sharding auto on fsdp meshes: the global view places the cut parameters, trains with one device's losses "
          "and moves about what FSDP moves", "[gptj][fsdp][global][mesh]") {
  const auto reference = gptj::train(tiny("dp=1,mp=1", 3), corpus());
  for (const std::string mesh : {"fsdp=2", "fsdp=4", "dp=2,fsdp=2", "mp=2,fsdp=2"}) {
    INFO("mesh " << mesh);
    auto o = tiny(mesh, 3);
    o.sharding = "auto";
    const auto result = gptj::train(o, corpus());
    nax::testing::require_close(result.losses, reference.losses, 1e-5);
    const auto hand = gptj::train(tiny(mesh, 3), corpus());
    // (over mp the view psums the LayerNorm outputs' cotangents once per group of consumers, five
    // times a step on tiny where the hand-coded block does three)
    for (const auto& [axis, most] : std::vector<std::pair<std::string, double>>{{"fsdp", 1.1}, {"mp", 1.4}}) {
      if (hand.bytes_per_step.count(axis) == 0) continue;
      INFO("bytes over " << axis << ": auto " << result.bytes_per_step.at(axis) << ", hand " << hand.bytes_per_step.at(axis));
      REQUIRE(result.bytes_per_step.at(axis) <= most * hand.bytes_per_step.at(axis));
    }
  }
}

TEST_CASE("gptj on fsdp without remat prefetches each next block's parameters; with remat it gathers them where used",
          "[gptj][fsdp][mesh]") {
  for (const bool remat : {false, true}) {
    static StartedCount count;  // outlives the device threads that point to it
    count.started = 0;
    const auto got = nax::testing::loss_and_grads("fsdp=2", [&](gptj::Model& model) {
      model.set_remat(remat);
      trace::set_thread_observer(&count);
    });
    const auto want = loss_and_grads("dp=1,mp=1", false);
    REQUIRE(std::abs(got.loss - want.loss) <= 1e-5 * std::abs(want.loss));
    INFO("remat " << remat << ": " << count.started << " started collectives");
    if (remat) REQUIRE(count.started == 0);
    else REQUIRE(count.started > 0);
  }
}

TEST_CASE("gptj train on cp and fsdp meshes gives one device's losses, up to 8 devices", "[gptj][context_parallel][fsdp][mesh]") {
  const auto reference = gptj::train(tiny("dp=1,mp=1", 4), corpus());
  for (const std::string mesh : {"cp=2", "mp=2,cp=2", "dp=2,mp=2,cp=2", "fsdp=2", "dp=2,mp=2,fsdp=2"}) {
    INFO("mesh " << mesh);
    const auto result = gptj::train(tiny(mesh, 4), corpus());
    nax::testing::require_close(result.losses, reference.losses, 1e-5);
    nax::testing::require_close({result.heldout_loss}, {reference.heldout_loss}, 1e-5);
    const std::string axis = mesh.find("cp") != std::string::npos ? "cp" : "fsdp";  // the ring's ppermutes; the gathers
    REQUIRE(result.bytes_per_step.count(axis) == 1);
  }
}

TEST_CASE("gptj compare on pp, cp and fsdp meshes: the hand-coded row alone, its axes' bytes, the bubble, the projections",
          "[gptj][context_parallel][fsdp][pipeline][mesh]") {
  const auto reference = gptj::train(tiny("dp=1,mp=1", 3), corpus());
  for (const std::string mesh : {"dp=2,pp=2", "mp=2,cp=2", "fsdp=2"}) {
    INFO("mesh " << mesh);
    gptj::CompareOptions c;
    c.train = tiny(mesh, 3);
    c.train.micro_batches = 2;
    c.timing_skip = 1;
    const auto rows = gptj::compare(c, corpus());
    const bool placed = mesh == "fsdp=2";  // the automatic view places dp, mp and fsdp, not pp nor cp
    REQUIRE(rows.size() == (placed ? 2u : 1u));
    const gptj::CompareRow& hand = rows[0];
    CHECK(hand.sharding == "hand");
    nax::testing::require_close(hand.losses, reference.losses, 1e-5);
    if (placed) nax::testing::require_close(rows[1].losses, reference.losses, 1e-5);
    const std::string named = mesh == "fsdp=2" ? "fsdp" : mesh == "mp=2,cp=2" ? "cp" : "pp";
    CHECK(hand.bytes_by_axes.count(named) == 1);
    const bool pipeline = named == "pp";
    CHECK((hand.bubble > 0) == pipeline);
    if (pipeline) CHECK(hand.bubble == Approx(1.0 / 3));  // (pp - 1) / (M + pp - 1) with 2 micro-batches
    for (const auto& cluster : gptj::declared_clusters()) {
      const auto p = gptj::project(hand, cluster, c);
      CHECK(p.comm_s > 0);
      CHECK(p.step_s == Approx(p.compute_s + p.comm_s));
      gptj::CompareRow no_bubble = hand;
      no_bubble.bubble = 0;
      if (pipeline) CHECK(p.compute_s == Approx(gptj::project(no_bubble, cluster, c).compute_s * 1.5));
    }
    const std::string path = (std::filesystem::temp_directory_path() / fmt::format("nax_compare_axes_{}.json", ::getpid())).string();
    gptj::write_comparison_json(rows, c, path);
    std::ifstream in(path);
    const auto json = nlohmann::json::parse(in);
    std::filesystem::remove(path);
    REQUIRE(json.size() == rows.size());
    CHECK(json[0].contains("pipeline") == pipeline);
  }
  gptj::CompareOptions jax;
  jax.train = tiny("fsdp=2", 3);
  jax.with_jax = true;
  REQUIRE_THROWS_WITH(gptj::compare(jax, corpus()), Contains("--with-jax") && Contains("dp and mp only"));
  gptj::CompareOptions uneven;  // 2 rows per device in 4 micro-batches
  uneven.train = tiny("dp=2,pp=2", 3);
  uneven.train.micro_batches = 4;
  REQUIRE_THROWS_WITH(gptj::compare(uneven, corpus()), Contains("compare") && Contains("--micro-batches 4 does not divide"));
  gptj::CompareOptions remat;
  remat.train = tiny("dp=2,mp=2", 3);
  remat.train.remat = true;
  REQUIRE_THROWS_WITH(gptj::compare(remat, corpus()), Contains("--remat") && Contains("would not compare"));
  // Projections against arithmetic of their own: per device, fsdp=2 computes what dp=2 does (half
  // the batch, the whole model) and the cluster as fast; mp=2,cp=2 a quarter of one device's step;
  // pp=2 half of it, stretched by the bubble.
  auto projected = [](const std::string& mesh, double bubble) {
    gptj::CompareOptions c;
    c.train = tiny(mesh, 3);
    gptj::CompareRow row;
    row.bubble = bubble;
    return gptj::project(row, gptj::declared_clusters()[1], c);
  };
  const double one = projected("dp=1,mp=1", 0).compute_s;
  CHECK(projected("dp=2,mp=1", 0).compute_s == Approx(one / 2));
  CHECK(projected("fsdp=2", 0).compute_s == Approx(one / 2));
  CHECK(projected("fsdp=2", 0).tokens_per_s == Approx(projected("dp=2,mp=1", 0).tokens_per_s));
  CHECK(projected("mp=2,cp=2", 0).compute_s == Approx(one / 4));
  CHECK(projected("pp=2", 0.25).compute_s == Approx(one / 2 / 0.75));
}

// Deterministic mode runs cp as sequence parallelism with the heads and mlp cut over cp beside mp
// (block.h): every sum over tokens sees whole rows, so training gives one device's bits.
TEST_CASE("gptj --deterministic on cp meshes: one device's bits, with dp, mp, fsdp, pp and remat", "[gptj][context_parallel][deterministic][mesh]") {
  auto o = tiny("dp=1,mp=1", 3);
  o.deterministic = true, o.micro_batches = 2;
  const auto reference = gptj::train(o, corpus());
  for (const auto& [mesh, remat] : std::vector<std::pair<std::string, bool>>{
           {"cp=2", false}, {"cp=4", true}, {"mp=2,cp=2", false}, {"dp=2,cp=2", true}, {"fsdp=2,cp=2", false}, {"cp=2,pp=2", false}}) {
    INFO("mesh " << mesh << (remat ? " --remat" : ""));
    auto cut = tiny(mesh, 3);
    cut.deterministic = true, cut.micro_batches = 2, cut.remat = remat;
    const auto result = gptj::train(cut, corpus());
    nax::testing::require_close(result.losses, reference.losses, 0.0);  // to the bit (a NaN anywhere fails)
    nax::testing::require_close({result.heldout_loss}, {reference.heldout_loss}, 0.0);
  }
}

TEST_CASE("gptj --deterministic on a cp mesh: what it cannot cut is refused, naming why", "[gptj][context_parallel][deterministic][errors]") {
  auto o = tiny("cp=4", 1);
  o.deterministic = true, o.seq = 14;
  REQUIRE_THROWS_WITH(gptj::train(o, corpus()), Contains("seq = 14 is not divisible by cp=4"));
  auto heads = tiny("mp=4,cp=2", 1);  // tiny has 4 heads
  heads.deterministic = true;
  REQUIRE_THROWS_WITH(gptj::train(heads, corpus()), Contains("heads = 4 of config 'tiny' is not divisible by mp x cp = 8"));
  auto order = tiny("cp=2,mp=2", 1);
  order.deterministic = true;
  REQUIRE_THROWS_WITH(gptj::train(order, corpus()), Contains("list mp before cp") && Contains("--mesh mp=2,cp=2"));
}

TEST_CASE("gptj: a checkpoint saved on a cp or fsdp mesh resumes on another mesh", "[gptj][context_parallel][fsdp][checkpoint]") {
  nax::testing::require_resumes_across([](const std::string& mesh) { return tiny(mesh, 6); }, "dp=1,mp=2",
                                       {{"mp=2,cp=2", "dp=2,mp=1"}, {"fsdp=4", "dp=1,mp=2"}, {"dp=2,mp=2", "fsdp=2,mp=2"}}, "gptj_axes");
}

TEST_CASE("gptj on a cp mesh: what it does not go with is refused, naming why", "[gptj][context_parallel][errors]") {
  auto o = tiny("cp=4", 1);
  o.seq = 12;
  REQUIRE_THROWS_WITH(gptj::train(o, corpus()), Contains("2 cp = 8 chunks") && Contains("seq = 12 is not divisible by 8"));
  o.seq = 16, o.sharding = "auto";
  REQUIRE_THROWS_WITH(gptj::train(o, corpus()), Contains("--sharding auto (the global view) has no context parallelism"));
  auto sp = tiny("mp=2,cp=2", 1);
  sp.sequence_parallel = true;
  REQUIRE_THROWS_WITH(gptj::train(sp, corpus()), Contains("--sequence-parallel on a mesh with cp=2"));
  REQUIRE_THROWS_WITH(gptj::train(tiny("dp=1,mp=1,ep=2", 1), corpus()), Contains("axis 'ep'") && Contains("dp, mp, pp, cp and fsdp"));
  auto fsdp = tiny("dp=2,fsdp=4", 1);  // batch 4 over 8 data-parallel devices
  REQUIRE_THROWS_WITH(gptj::train(fsdp, corpus()), Contains("batch = 4 is not divisible by dp x fsdp = 8"));
  REQUIRE_THROWS_WITH(gptj::check_dp_mp_only(gptj::model_mesh("cp=2"), "generation"),
                      Contains("generation has no context parallelism: the mesh dp=1,mp=1,cp=2 cuts the sequence over cp"));
  // dp and mp, which the model always names, join a mesh that leaves them out.
  REQUIRE(gptj::model_mesh("cp=2,mp=2").str() == "dp=1,cp=2,mp=2");
  REQUIRE(gptj::model_mesh("mp=2,dp=2").str() == "mp=2,dp=2");
}
