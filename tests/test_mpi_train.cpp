// The GPT-J trainer under mpirun -np 4 on dp=2,mp=2: the same losses as the thread runtime on the
// same mesh (and on mp=2,cp=2, ring attention's, and dp=2,pp=2, a pipeline's: one device's), one checkpoint written by process 0
// and read back by every process (resume, sample).
// gptj::train picks its runtime with Runtime::from_env: MPI here; $NAX_RUNTIME=threads gives the
// reference in process 0.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gptj_helpers.h"
#include "helpers.h"
#include "train.h"

using namespace nax;
using nax::testing::corpus;

namespace {

gptj::TrainOptions tiny(std::int64_t steps) { return nax::testing::tiny("dp=2,mp=2", steps); }

// The same folder name in every process (process 0's pid, broadcast through a run).
std::string shared_scratch_dir(const std::string& name) {
  Runtime rt = Runtime::mpi(Mesh::parse(fmt::format("x={}", process_count())));
  auto ids = rt.run([](Shard& s) {
    Tensor mine = s.shard(full(Shape{{"i", 1}}, static_cast<double>(::getpid()), DType::i32), {});
    return static_cast<long>(s.gather(all_gather_invariant(pvary(mine, "x"), "x", "i")).to_vector<double>()[0]);
  });
  return (std::filesystem::temp_directory_path() / fmt::format("nax_test_mpi_{}_{}", name, ids[static_cast<std::size_t>(process_index())]))
      .string();
}

std::vector<double> train_on_threads(const gptj::TrainOptions& o) {
  ::setenv("NAX_RUNTIME", "threads", 1);
  auto losses = gptj::train(o, corpus()).losses;
  ::unsetenv("NAX_RUNTIME");
  return losses;
}

}  // namespace

TEST_CASE("mpi: 5 training steps of tiny on dp=2,mp=2 give the thread runtime's losses", "[mpi][gptj]") {
  REQUIRE(process_count() == 4);
  const auto losses = gptj::train(tiny(5), corpus()).losses;
  if (process_index() != 0) {
    REQUIRE(losses.empty());  // device 0, in process 0, reports
    return;
  }
  REQUIRE(losses.size() == 5);
  REQUIRE(nax::testing::max_rel_error(losses, train_on_threads(tiny(5))) <= 1e-5);
}

TEST_CASE("mpi: ring attention over cp (mp=2,cp=2) gives one device's losses", "[mpi][gptj][context_parallel]") {
  REQUIRE(process_count() == 4);
  const auto losses = gptj::train(nax::testing::tiny("mp=2,cp=2", 4), corpus()).losses;
  if (process_index() != 0) return;
  REQUIRE(losses.size() == 4);
  REQUIRE(nax::testing::max_rel_error(losses, train_on_threads(nax::testing::tiny("dp=1,mp=1", 4))) <= 1e-5);
}

TEST_CASE("mpi: a pipeline over pp (dp=2,pp=2, 1F1B) gives one device's losses; its checkpoint resumes on threads", "[mpi][gptj][pipeline]") {
  REQUIRE(process_count() == 4);
  const std::string dir = shared_scratch_dir("pipeline");
  auto options = [&](const std::string& mesh) {
    auto o = nax::testing::tiny(mesh, 4);
    o.micro_batches = 2, o.ckpt_dir = dir;
    return o;
  };
  auto interrupted = options("dp=2,pp=2");
  interrupted.stop_after = 2;  // the stages' parameters travel to process 0, which writes the files
  const auto losses = gptj::train(interrupted, corpus()).losses;
  if (process_index() != 0) return;
  auto straight = options("dp=1,mp=1");
  straight.ckpt_dir.clear();
  const auto want = train_on_threads(straight);
  REQUIRE(losses.size() == 2);
  REQUIRE(nax::testing::max_rel_error(losses, {want[0], want[1]}) <= 1e-5);
  auto resumed = options("dp=1,mp=2");
  resumed.resume = true;
  REQUIRE(nax::testing::max_rel_error(train_on_threads(resumed), {want[2], want[3]}) <= 1e-5);
  std::filesystem::remove_all(dir);
}

TEST_CASE("mpi: process 0 writes the checkpoint and the metrics once; every process resumes from it and samples", "[mpi][gptj]") {
  const std::string dir = shared_scratch_dir("ckpt");
  const std::string metrics = dir + ".metrics.jsonl";
  auto interrupted = tiny(6);
  interrupted.ckpt_dir = dir, interrupted.stop_after = 3, interrupted.metrics = metrics;
  gptj::train(interrupted, corpus());
  REQUIRE(std::filesystem::exists(dir + "/step_000003/model.safetensors"));
  REQUIRE(std::filesystem::exists(dir + "/step_000003/trainer.json"));
  for (const auto& entry : std::filesystem::directory_iterator(dir))  // no temporary left by a second writer
    REQUIRE(entry.path().string().find(".tmp.") == std::string::npos);

  auto resumed = tiny(6);
  resumed.ckpt_dir = dir, resumed.resume = true;
  const auto tail = gptj::train(resumed, corpus()).losses;

  gptj::SampleOptions sample;
  sample.ckpt_dir = dir, sample.mesh = "dp=2,mp=2", sample.prompt = "the quick", sample.tokens = 8, sample.temperature = 0;
  const std::string text = gptj::sample(sample);
  REQUIRE(text.size() >= 1);

  if (process_index() == 0) {
    std::ifstream in(metrics);
    int lines = 0;
    for (std::string line; std::getline(in, line);) ++lines;
    REQUIRE(lines == 3);  // 3 steps, written by process 0 alone
    const auto straight = train_on_threads(tiny(6));
    REQUIRE(tail.size() == 3);
    REQUIRE(nax::testing::max_rel_error(tail, std::vector<double>(straight.begin() + 3, straight.end())) <= 1e-5);
    ::setenv("NAX_RUNTIME", "threads", 1);
    REQUIRE(gptj::sample(sample) == text);
    ::unsetenv("NAX_RUNTIME");
  }
  // Everyone is done reading before process 0 removes the folder.
  Runtime rt = Runtime::mpi(Mesh::parse(fmt::format("x={}", process_count())));
  rt.run([](Shard& s) { s.comm({"x"}).barrier(); });
  if (process_index() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::remove(metrics);
  }
}
