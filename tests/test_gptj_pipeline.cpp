// The GPT-J example's pipeline over pp (examples/gptj/pipeline.h): the schedules' timetables
// against their definitions (every action once, in dependency order, the textbook bubble and
// in-flight counts), the layers' stages, and the model on pp meshes: the loss and every
// parameter's gradient equal one device's, training too (bit for bit in deterministic mode, with
// dp, mp, fsdp, remat), checkpoints resume across pp and other meshes, and what pp does not go with
// is refused.
#include <map>

#include "gptj_helpers.h"
#include "helpers.h"
#include "pipeline.h"

using namespace nax;
using Catch::Matchers::Contains;
using nax::testing::corpus;
using nax::testing::tiny;

namespace {

// tick of (stage, kind, micro) in t, checking that each appears once.
std::map<std::tuple<int, int, std::int64_t>, std::size_t> ticks_of(const gptj::Timetable& t) {
  std::map<std::tuple<int, int, std::int64_t>, std::size_t> at;
  for (std::size_t tick = 0; tick < t.size(); ++tick)
    for (std::size_t s = 0; s < t[tick].size(); ++s) {
      const auto& a = t[tick][s];
      if (a.kind == gptj::Action::idle) continue;
      const auto key = std::make_tuple(static_cast<int>(s), static_cast<int>(a.kind), a.micro);
      REQUIRE(at.count(key) == 0);
      at[key] = tick;
    }
  return at;
}

}  // namespace

TEST_CASE("pipeline timetables: every forward and backward once, after its inputs, with the textbook bubble", "[gptj][pipeline]") {
  using gptj::Action;
  for (const auto schedule : {gptj::Schedule::one_f_one_b, gptj::Schedule::gpipe})
    for (int stages : {2, 3, 4})
      for (std::int64_t micro : {1, 2, 4, 7}) {
        INFO(gptj::schedule_name(schedule) << ", " << stages << " stages, " << micro << " micro-batches");
        const auto t = gptj::timetable(schedule, stages, micro);
        const auto at = ticks_of(t);
        REQUIRE(at.size() == static_cast<std::size_t>(2 * stages * micro));
        for (int s = 0; s < stages; ++s)
          for (std::int64_t m = 0; m < micro; ++m) {
            const auto f = at.at({s, Action::forward, m}), b = at.at({s, Action::backward, m});
            REQUIRE(f < b);
            if (s > 0) REQUIRE(at.at({s - 1, Action::forward, m}) < f);
            if (s + 1 < stages) REQUIRE(at.at({s + 1, Action::backward, m}) < b);
            if (m > 0) REQUIRE(at.at({s, Action::backward, m - 1}) < b);  // gradients accumulate in micro-batch order
          }
        REQUIRE(t.size() == static_cast<std::size_t>(2 * (micro + stages - 1)));
        REQUIRE(std::abs(gptj::bubble_fraction(t) - static_cast<double>(stages - 1) / static_cast<double>(micro + stages - 1)) < 1e-12);
        const std::int64_t in_flight = schedule == gptj::Schedule::gpipe ? micro : std::min<std::int64_t>(stages, micro);
        REQUIRE(gptj::most_in_flight(t) == in_flight);
      }
  REQUIRE_THROWS_WITH(gptj::parse_schedule("interleaved"), Contains("--schedule expects 1f1b or gpipe, got 'interleaved'"));
}

TEST_CASE("pipeline stages: consecutive runs of layers, the stages' parameters are the model's, in order", "[gptj][pipeline]") {
  const gptj::Config c = gptj::config_by_name("small");  // 6 layers
  const auto all = gptj::parameter_specs(c);
  for (int count : {1, 2, 4, 6}) {
    INFO(count << " stages");
    std::vector<std::string> names;
    std::int64_t next = 0;
    for (int s = 0; s < count; ++s) {
      const gptj::Stage stage = gptj::stage_of(c, s, count);
      REQUIRE(stage.first_layer == next);
      REQUIRE(stage.end_layer - stage.first_layer >= c.n_layers / count);
      REQUIRE(stage.end_layer - stage.first_layer <= c.n_layers / count + 1);
      next = stage.end_layer;
      for (const auto& spec : gptj::stage_specs(c, stage)) {
        names.push_back(spec.name);
        REQUIRE(gptj::stage_holding(c, count, spec.name) == s);
      }
    }
    REQUIRE(next == c.n_layers);
    std::vector<std::string> want;
    for (const auto& spec : all) want.push_back(spec.name);
    REQUIRE(names == want);
  }
  REQUIRE(gptj::stage_specs(c, gptj::stage_of(c, 0, 2)).front().name == "transformer.wte.weight");
  REQUIRE(gptj::stage_specs(c, gptj::stage_of(c, 1, 2)).back().name == "lm_head.bias");
}

namespace {

// tiny's loss and every parameter's gradient (by name, gathered whole) from Learner::gradients on
// `mesh` with `micro` micro-batches, each parameter taken from a device of the stage holding it.
std::pair<double, std::map<std::string, std::vector<double>>> pipeline_grads(const std::string& mesh, std::int64_t micro,
                                                                             const std::string& schedule, bool remat) {
  gptj::TrainOptions o = tiny(mesh, 1);
  o.micro_batches = micro, o.schedule = schedule, o.remat = remat;
  Runtime rt = Runtime::local(gptj::model_mesh(mesh));
  const gptj::Config config = gptj::padded_for(gptj::config_by_name(o.config), rt.mesh());
  using Named = std::map<std::string, std::vector<double>>;
  const auto per_device = rt.run([&](Shard& s) {
    const AxisRules rules = gptj::axis_rules(s.mesh());
    gptj::Learner learner(s, config, rules, o);
    const auto [ids, targets] = nax::testing::fixed_batch(s, config, o, rules);
    gptj::Learner::StepStats stats;
    const auto g = learner.gradients(ids, targets, stats);
    Named grads;
    for (std::size_t i = 0; i < g.grads.size(); ++i) {
      grads[learner.model().params().specs()[i].name] = all_gather_cuts(g.grads[i]).to_vector<double>();
    }
    return std::make_pair(g.loss.item(), grads);
  });
  std::pair<double, Named> out{per_device[0].first, {}};
  for (const auto& [loss, grads] : per_device) {
    REQUIRE(loss == out.first);  // every device has the loss
    for (const auto& [name, values] : grads) {
      const auto [at, fresh] = out.second.try_emplace(name, values);
      if (!fresh) nax::testing::require_same_bits(values, at->second, name + " on another device of its stage");
    }
  }
  return out;
}

}  // namespace

TEST_CASE("gptj on pp meshes: the loss and every parameter's gradient are one device's", "[gptj][pipeline][mesh]") {
  const auto specs = gptj::parameter_specs(gptj::config_by_name("tiny"));
  const auto one = pipeline_grads("dp=1,mp=1", 2, "1f1b", false);
  REQUIRE(one.second.size() == specs.size());
  // The micro-batches' mean is the whole batch's loss and gradient (Model::loss and grad, no Learner).
  const auto whole = nax::testing::loss_and_grads("dp=1,mp=1", [](gptj::Model&) {});
  nax::testing::require_close({one.first}, {whole.loss}, 1e-5);
  for (std::size_t i = 0; i < specs.size(); ++i) nax::testing::check_close_scaled(one.second.at(specs[i].name), whole.grads[i], 1e-5, specs[i].name);
  for (const auto& [mesh, schedule, remat] : std::vector<std::tuple<std::string, std::string, bool>>{
           {"pp=2", "1f1b", false}, {"pp=2", "gpipe", false}, {"dp=2,pp=2", "1f1b", false}, {"mp=2,pp=2", "1f1b", true},
           {"fsdp=2,pp=2", "gpipe", false}, {"pp=2,cp=2", "1f1b", false}}) {
    INFO("mesh " << mesh << ", " << schedule << (remat ? ", --remat" : ""));
    const auto cut = pipeline_grads(mesh, 2, schedule, remat);
    nax::testing::require_close({cut.first}, {one.first}, 1e-5);
    REQUIRE(cut.second.size() == specs.size());
    for (const auto& spec : specs) nax::testing::check_close_scaled(cut.second.at(spec.name), one.second.at(spec.name), 1e-5, spec.name);
  }
}

TEST_CASE("gptj train on pp meshes gives one device's losses, up to 8 devices, both schedules", "[gptj][pipeline][mesh]") {
  auto options = [](const std::string& mesh, const std::string& schedule) {
    auto o = tiny(mesh, 4);
    o.micro_batches = 2, o.schedule = schedule;
    return o;
  };
  const auto reference = gptj::train(options("dp=1,mp=1", "1f1b"), corpus());
  for (const auto& [mesh, schedule] : std::vector<std::pair<std::string, std::string>>{
           {"pp=2", "1f1b"}, {"pp=2", "gpipe"}, {"dp=2,pp=2", "1f1b"}, {"dp=2,mp=2,pp=2", "1f1b"}, {"mp=2,pp=2", "gpipe"}}) {
    INFO("mesh " << mesh << ", " << schedule);
    const auto result = gptj::train(options(mesh, schedule), corpus());
    nax::testing::require_close(result.losses, reference.losses, 1e-5);
    nax::testing::require_close({result.heldout_loss}, {reference.heldout_loss}, 1e-5);
    REQUIRE(result.bytes_per_step.count("pp") == 1);
    REQUIRE(std::abs(result.bubble - 1.0 / 3.0) < 1e-12);  // 2 stages, 2 micro-batches: 1 / (2 + 2 - 1)
    REQUIRE(result.in_flight == 2);
  }
}

TEST_CASE("gptj on pp meshes in deterministic mode: one device's bits", "[gptj][pipeline][deterministic]") {
  auto options = [](const std::string& schedule) {
    auto o = tiny("dp=1,mp=1", 3);
    o.micro_batches = 2, o.schedule = schedule, o.deterministic = true;
    return o;
  };
  const auto one = nax::testing::learner_steps(Runtime::local(gptj::model_mesh("dp=1,mp=1"), gptj::runtime_options(Backend::cpu, true)),
                                               options("1f1b"), 3);
  for (const auto& [mesh, schedule] : std::vector<std::pair<std::string, std::string>>{
           {"pp=2", "1f1b"}, {"pp=2", "gpipe"}, {"mp=2,pp=2", "1f1b"}, {"mp=2,pp=2", "gpipe"}}) {  // dp: determinism.meshes.tiny_pp
    INFO("mesh " << mesh << ", " << schedule);
    const auto cut = nax::testing::learner_steps(Runtime::local(gptj::model_mesh(mesh), gptj::runtime_options(Backend::cpu, true)),
                                                 options(schedule), 3);
    REQUIRE(cut == one);  // losses and gradient norms, every bit
  }
}

TEST_CASE("gptj: a checkpoint saved on a pp mesh resumes on another mesh, and back", "[gptj][pipeline][checkpoint]") {
  auto options = [](const std::string& mesh) {
    auto o = tiny(mesh, 6);
    o.micro_batches = 2;
    return o;
  };
  nax::testing::require_resumes_across(options, "dp=1,mp=2", {{"dp=2,pp=2", "dp=1,mp=2"}, {"dp=1,mp=2", "pp=2"}, {"pp=2", "mp=2,pp=2"}},
                                       "gptj_pipeline");
}

TEST_CASE("gptj on a pp mesh: what it does not go with is refused, naming why", "[gptj][pipeline][errors]") {
  auto o = tiny("pp=4", 1);  // tiny has 2 layers
  REQUIRE_THROWS_WITH(gptj::train(o, corpus()), Contains("pp=4 of mesh dp=1,mp=1,pp=4 needs at least one layer per stage"));
  o = tiny("pp=2", 1), o.sharding = "auto";
  REQUIRE_THROWS_WITH(gptj::train(o, corpus()), Contains("--sharding auto (the global view) has no pipeline"));
  o = tiny("pp=2", 1), o.schedule = "zb";
  REQUIRE_THROWS_WITH(gptj::train(o, corpus()), Contains("--schedule expects 1f1b or gpipe, got 'zb'"));
  REQUIRE_THROWS_WITH(gptj::check_dp_mp_only(gptj::model_mesh("pp=2"), "generation"),
                      Contains("generation has no pipeline: the mesh dp=1,mp=1,pp=2 cuts the layers into stages over pp"));
}
