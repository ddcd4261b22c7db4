// The GPT-J trainer's memory options: activation checkpointing per block (--remat) gives the same
// losses and gradient norms as without, step by step, on meshes 1x1, 1x2 and 2x2.
#include "gptj_helpers.h"
#include "helpers.h"

using namespace nax;

namespace {

void require_same_steps(const nax::testing::StepValues& got, const nax::testing::StepValues& want, double tol) {
  nax::testing::require_close(got.losses, want.losses, tol);
  nax::testing::require_close(got.grad_norms, want.grad_norms, tol);
}

}  // namespace

TEST_CASE("training with remat per block (--remat) gives the same losses and gradient norms as without", "[gptj][remat][mesh]") {
  for (const std::string mesh : {"dp=1,mp=1", "dp=1,mp=2", "dp=2,mp=2"}) {
    INFO("mesh " << mesh);
    gptj::TrainOptions o = nax::testing::tiny(mesh, 3);
    const auto plain = nax::testing::learner_steps(Runtime::local(Mesh::parse(mesh)), o, 3);
    o.remat = true;
    const auto checkpointed = nax::testing::learner_steps(Runtime::local(Mesh::parse(mesh)), o, 3);
    require_same_steps(checkpointed, plain, 1e-5);
  }
}
