// Hand = auto (docs/invariants.md): the GPT-J written per shard and the same model in the global view
// give the same losses and gradients on the same mesh, and the automatic one never gathers the
// logits or the embedding table.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "compare.h"
#include "global_model.h"
#include "gptj_helpers.h"
#include "helpers.h"
#include "model.h"
#include "train.h"

using namespace nax;
using nax::testing::corpus;
using nax::testing::tiny;

namespace {

struct Step {
  double loss = 0;
  std::vector<Tensor> grads;  // global, on the host
  std::map<CollectiveKind, std::size_t> calls;
};

// One forward and backward pass of the tiny model in f64 on `mesh`, written by hand or in the
// global view, with the gradients gathered to the host.
Step one_step(const std::string& mesh_spec, bool global_view) {
  const Mesh mesh = Mesh::parse(mesh_spec);
  const gptj::Config config = gptj::padded_for(gptj::config_by_name("tiny"), mesh);
  const auto rules = gptj::axis_rules(mesh);
  auto [ids, targets] = corpus().batch(gptj::TextData::Split::train, 0, 4, 16, 0);
  Runtime rt = Runtime::local(mesh);
  Step out;
  rt.run([&](Shard& s) {
    gptj::Model model(config, nn::Parameters::init(s, gptj::parameter_specs(config), rules, 3, DType::f64));
    const gptj::GlobalModel global(config, model.params());
    Tensor x = s.shard(ids, rules), y = s.shard(targets, rules);
    const auto before = s.comm_stats();
    Tensor loss = global_view ? global.loss(x, y) : model.loss(x, y);
    auto grads = grad(loss, model.params().values());
    CommStats d;
    for (const auto& [axes, stats] : s.comm_stats_since(before)) d += stats;
    std::map<CollectiveKind, std::size_t> calls;
    for (int k = 0; k < kCollectiveKinds; ++k) calls[static_cast<CollectiveKind>(k)] = d.calls[static_cast<std::size_t>(k)];
    std::vector<Tensor> host;
    for (const auto& g : grads) host.push_back(s.gather(g));
    if (s.device() == 0) out = {loss.item(), host, calls};
  });
  return out;
}

}  // namespace

TEST_CASE("hand and auto sharding train tiny to the same losses", "[e2e][gptj][global]") {
  for (const std::string mesh : {"dp=1,mp=2", "dp=2,mp=2", "dp=1,mp=4"}) {
    INFO("mesh " << mesh);
    const auto hand = gptj::train(tiny(mesh, 5, "hand"), corpus());
    const auto automatic = gptj::train(tiny(mesh, 5, "auto"), corpus());
    REQUIRE(hand.losses.size() == 5);
    REQUIRE(nax::testing::max_rel_error(automatic.losses, hand.losses) <= 1e-5);
    // The automatic model moves no more than twice the hand-coded model's bytes.
    double hand_bytes = 0, auto_bytes = 0;
    for (const auto& [axes, b] : hand.bytes_per_step) hand_bytes += b;
    for (const auto& [axes, b] : automatic.bytes_per_step) auto_bytes += b;
    REQUIRE(auto_bytes <= 2 * hand_bytes);
  }
}

TEST_CASE("hand and auto sharding give the same gradients, and auto gathers nothing", "[e2e][gptj][global]") {
  for (const std::string mesh : {"dp=1,mp=2", "dp=2,mp=2", "dp=1,mp=4"}) {
    INFO("mesh " << mesh);
    const Step hand = one_step(mesh, false), automatic = one_step(mesh, true);
    REQUIRE(std::abs(automatic.loss - hand.loss) <= 1e-12 * std::abs(hand.loss));
    REQUIRE(automatic.grads.size() == hand.grads.size());
    for (std::size_t i = 0; i < hand.grads.size(); ++i) {
      INFO("gradient " << i << ": " << hand.grads[i].str());
      REQUIRE(nax::testing::max_rel_error(automatic.grads[i].to_vector<double>(), hand.grads[i].to_vector<double>()) <= 1e-10);
    }
    // Logits, the embedding table and the head stay cut over mp: no all-gather, no all-to-all.
    CHECK(automatic.calls.at(CollectiveKind::all_gather) == 0);
    CHECK(automatic.calls.at(CollectiveKind::all_to_all) == 0);
  }
}

TEST_CASE("gptj --sharding auto with --sequence-parallel: the residual stream placed along seq over mp trains with one device's losses and "
          "moves what the hand-coded sequence parallelism moves", "[e2e][gptj][global][sequence_parallel]") {
  const auto reference = gptj::train(tiny("dp=1,mp=1", 4), corpus());
  for (const std::string mesh : {"dp=1,mp=2", "dp=2,mp=2", "mp=2,fsdp=2"}) {
    INFO("mesh " << mesh);
    auto automatic = tiny(mesh, 4, "auto"), hand = tiny(mesh, 4, "hand"), plain = tiny(mesh, 4, "auto");
    automatic.sequence_parallel = hand.sequence_parallel = true;
    const auto a = gptj::train(automatic, corpus()), h = gptj::train(hand, corpus()), p = gptj::train(plain, corpus());
    REQUIRE(nax::testing::max_rel_error(a.losses, reference.losses) <= 1e-5);
    // Over mp: the gathers and reduce-scatters of sequence parallelism, not the plain auto view's
    // all-reduces (a reduce-scatter's input counts whole: more bytes than the all-reduce), within
    // 10% of the hand-coded program's bytes.
    REQUIRE(a.bytes_per_step.at("mp") <= 1.1 * h.bytes_per_step.at("mp"));
    REQUIRE(a.bytes_per_step.at("mp") > p.bytes_per_step.at("mp"));
  }
}

TEST_CASE("gptj compare: rows for hand and auto, the JSON list and the cluster projections", "[e2e][gptj][global]") {
  gptj::CompareOptions c;
  c.train = tiny("dp=2,mp=2", 4);
  c.train.steps = 4;
  c.timing_skip = 1;
  const auto rows = gptj::compare(c, corpus());
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].sharding == "hand");
  CHECK(rows[1].sharding == "auto");
  REQUIRE(nax::testing::max_rel_error(rows[1].losses, rows[0].losses) <= 1e-5);
  for (const auto& r : rows) {
    CHECK(r.tokens_per_s > 0);
    CHECK(r.peak_bytes > 0);
    CHECK(r.bytes_by_axes.count("mp") == 1);
    CHECK(r.bytes_by_axes.count("dp") == 1);
    CHECK(r.collectives_per_step > 0);
  }
  // Projections: the same compute for both; the communication priced from the counted calls.
  for (const auto& cluster : gptj::declared_clusters()) {
    const auto hand = gptj::project(rows[0], cluster, c), automatic = gptj::project(rows[1], cluster, c);
    CHECK(hand.compute_s == Approx(automatic.compute_s));
    CHECK(hand.comm_s > 0);
    CHECK(hand.step_s == Approx(hand.compute_s + hand.comm_s));
  }
  const std::string path = (std::filesystem::temp_directory_path() / fmt::format("nax_compare_{}.json", ::getpid())).string();
  gptj::write_comparison_json(rows, c, path);
  std::ifstream in(path);
  const auto json = nlohmann::json::parse(in);
  std::filesystem::remove(path);
  REQUIRE(json.is_array());
  REQUIRE(json.size() == 2);
  for (const char* key : {"sharding", "tokens_per_s", "bytes_per_step", "collectives_per_step", "peak_bytes", "final_loss", "projected"})
    CHECK(json[0].contains(key));
  CHECK(json[1]["sharding"] == "auto");
}
