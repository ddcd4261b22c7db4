// Sequence parallelism in the GPT-J example (--sequence-parallel; block.h, model.cpp): on tiny the
// loss and every parameter's gradient equal the plain model's on the same mesh (1x2, 2x2, with and
// without remat), training matches one device (in deterministic mode to the bit), a checkpoint
// resumes with or without it, mp=1 leaves the program as it is, and what it cannot go with is refused.
#include <filesystem>

#include "files.h"
#include "gptj_helpers.h"
#include "helpers.h"
#include "plan.h"

using namespace nax;
using Catch::Matchers::Contains;
using nax::testing::corpus;
using nax::testing::tiny;

namespace {

nax::testing::LossAndGrads loss_and_grads(const std::string& mesh, bool sequence_parallel, bool remat, std::int64_t overlap_pieces = 2) {
  return nax::testing::loss_and_grads(mesh, [=](gptj::Model& model) {
    model.set_remat(remat);
    model.set_sequence_parallel(sequence_parallel);
    model.set_overlap_pieces(overlap_pieces);
  });
}

}  // namespace

TEST_CASE("gptj --sequence-parallel: the loss and every parameter's gradient are the plain model's, on 1x2 and 2x2, with and without remat",
          "[gptj][sequence_parallel][mesh]") {
  const auto specs = gptj::parameter_specs(gptj::config_by_name("tiny"));
  for (const std::string mesh : {"dp=1,mp=2", "dp=2,mp=2"}) {
    for (bool remat : {false, true}) {
      INFO("mesh " << mesh << (remat ? " --remat" : ""));
      const auto plain = loss_and_grads(mesh, false, remat), cut = loss_and_grads(mesh, true, remat);
      nax::testing::require_close({cut.loss}, {plain.loss}, 1e-5);
      REQUIRE(cut.grads.size() == specs.size());
      for (std::size_t i = 0; i < specs.size(); ++i)  // relative to each gradient's scale: its elements lie near zero
        nax::testing::check_close_scaled(cut.grads[i], plain.grads[i], 1e-5, specs[i].name);
    }
  }
}

TEST_CASE("gptj --sequence-parallel: the batch in 1, 2, 3 or 4 overlapped pieces (uneven too) gives the plain model's loss and "
          "gradients", "[gptj][sequence_parallel][mesh]") {
  const auto specs = gptj::parameter_specs(gptj::config_by_name("tiny"));
  for (const std::string mesh : {"dp=1,mp=2", "dp=2,mp=2", "dp=1,mp=4"}) {
    const auto plain = loss_and_grads(mesh, false, false);
    for (std::int64_t pieces : {1, 2, 3, 4}) {
      for (bool remat : {false, true}) {
        INFO("mesh " << mesh << ", " << pieces << " pieces" << (remat ? " --remat" : ""));
        const auto cut = loss_and_grads(mesh, true, remat, pieces);
        nax::testing::require_close({cut.loss}, {plain.loss}, 1e-5);
        REQUIRE(cut.grads.size() == specs.size());
        for (std::size_t i = 0; i < specs.size(); ++i) nax::testing::check_close_scaled(cut.grads[i], plain.grads[i], 1e-5, specs[i].name);
      }
    }
  }
  auto o = tiny("dp=1,mp=2", 1);
  o.sequence_parallel = true, o.overlap_pieces = 0;
  REQUIRE_THROWS_WITH(gptj::train(o, corpus()), Contains("--overlap-pieces must be in [1"));
}

TEST_CASE("gptj --sequence-parallel: training gives one device's losses on 1x2, 2x2 and 1x4", "[gptj][sequence_parallel][mesh]") {
  const auto reference = gptj::train(tiny("dp=1,mp=1", 4), corpus());
  for (const std::string mesh : {"dp=1,mp=2", "dp=2,mp=2", "dp=1,mp=4"}) {
    for (bool remat : {false, true}) {
      INFO("mesh " << mesh << (remat ? " --remat" : ""));
      auto o = tiny(mesh, 4);
      o.sequence_parallel = true, o.remat = remat;
      const auto result = gptj::train(o, corpus());
      nax::testing::require_close(result.losses, reference.losses, 1e-5);
      nax::testing::require_close({result.heldout_loss}, {reference.heldout_loss}, 1e-5);
    }
  }
}

TEST_CASE("gptj --sequence-parallel: a checkpoint saved with it resumes without it, and on mp=1 it changes nothing",
          "[gptj][sequence_parallel][checkpoint]") {
  const auto straight = gptj::train(tiny("dp=1,mp=2", 6), corpus()).losses;
  const std::vector<double> tail(straight.begin() + 3, straight.end());
  const std::string dir = nax::testing::scratch_dir("sequence_parallel");
  auto interrupted = tiny("dp=1,mp=2", 6);
  interrupted.ckpt_dir = dir, interrupted.stop_after = 3, interrupted.sequence_parallel = true;
  REQUIRE(gptj::train(interrupted, corpus()).losses.size() == 3);
  auto resumed = tiny("dp=2,mp=1", 6);
  resumed.ckpt_dir = dir, resumed.resume = true;
  nax::testing::require_close(gptj::train(resumed, corpus()).losses, tail, 1e-5);
  std::filesystem::remove_all(dir);

  // mp=1: the plain program, to the bit (deterministic mode allows it there).
  auto o = tiny("dp=2,mp=1", 3);
  o.deterministic = true;
  const auto plain = gptj::train(o, corpus()).losses;
  o.sequence_parallel = true;
  REQUIRE(gptj::train(o, corpus()).losses == plain);
}

TEST_CASE("gptj --sequence-parallel --deterministic: one device's bits on 1x2, 2x2 and 1x4, with and without remat",
          "[gptj][sequence_parallel][deterministic][mesh]") {
  auto o = tiny("dp=1,mp=1", 3);
  o.deterministic = true;
  const auto reference = gptj::train(o, corpus());
  for (const std::string mesh : {"dp=1,mp=2", "dp=2,mp=2", "dp=1,mp=4"}) {
    for (bool remat : {false, true}) {
      INFO("mesh " << mesh << (remat ? " --remat" : ""));
      auto cut = tiny(mesh, 3);
      cut.deterministic = true, cut.sequence_parallel = true, cut.remat = remat;
      const auto result = gptj::train(cut, corpus());
      nax::testing::require_close(result.losses, reference.losses, 0.0);  // to the bit (a NaN anywhere fails)
      nax::testing::require_close({result.heldout_loss}, {reference.heldout_loss}, 0.0);
    }
  }
}

TEST_CASE("gptj --sequence-parallel: refused with a seq that mp does not divide",
          "[gptj][sequence_parallel][errors]") {
  auto o = tiny("dp=1,mp=4", 1);
  o.sequence_parallel = true;
  o.seq = 6;
  REQUIRE_THROWS_WITH(gptj::train(o, corpus()), Contains("--sequence-parallel cuts the sequence over mp: seq = 6 is not divisible by mp=4"));
  o.sharding = "auto";  // the global view's placement of the sequence refuses it alike
  REQUIRE_THROWS_WITH(gptj::train(o, corpus()), Contains("seq = 6 is not divisible by mp=4"));
  gptj::PlanOptions p;
  p.mesh = "dp=1,mp=4", p.seq = 30, p.sequence_parallel = true;
  REQUIRE_THROWS_WITH(gptj::plan_memory(p), Contains("seq = 30 is not divisible by mp=4"));
}
