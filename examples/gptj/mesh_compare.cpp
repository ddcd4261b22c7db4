// `gptj compare --meshes A,B`: the same training steps on two meshes with every op recorded
// (nax::debug::record_ops), then the first op whose global value differs (nax/debug/locator.h).
#include <fmt/format.h>

#include <charconv>

#include "compare.h"
#include "learner.h"
#include "nax/debug/locator.h"
#include "train.h"

namespace gptj {

using namespace nax;

namespace {

// "2x1" (dp x mp) as the mesh dp=2,mp=1; a mesh with named axes ("mp=2,cp=2") as --mesh takes it.
Mesh mesh_of(const std::string& spec) {
  if (spec.find('=') != std::string::npos) return model_mesh(spec);
  const std::size_t x = spec.find('x');
  int dp = 0, mp = 0;
  const char* end = spec.data() + spec.size();
  const bool ok = x != std::string::npos && std::from_chars(spec.data(), spec.data() + x, dp).ptr == spec.data() + x &&
                  std::from_chars(spec.data() + x + 1, end, mp).ptr == end && dp > 0 && mp > 0;
  if (!ok) fail("compare", "--meshes: '{}' is not DPxMP (e.g. 1x1,2x2: dp devices by mp devices)", spec);
  return Mesh({{"dp", dp}, {"mp", mp}});
}

struct MeshRun {
  debug::MeshRecords records;
  std::vector<double> losses;
};

MeshRun run_on(const Mesh& mesh, const CompareOptions& o, const TextData& data) {
  const TrainOptions& t = o.train;
  const Config config = padded_for(config_by_name(t.config), mesh);
  check_fits(config, mesh, t.batch);
  check_sequence_layout(mesh, t.seq, t.sequence_parallel, t.deterministic, config);
  const AxisRules rules = axis_rules(mesh);
  Runtime rt = Runtime::local(mesh, runtime_options(t.backend, t.deterministic));  // every device's records in this process
  MeshRun run;
  run.records = debug::record_ops(rt, [&](Shard& s) {
    Learner learner(s, config, rules, t);
    for (std::int64_t step = 0; step < t.steps; ++step) {
      const trace::Span step_span("step", fmt::format("step {}", step));
      const double lr = nn::warmup_cosine(step, t.warmup, t.steps, t.lr);
      auto [inputs, targets] = data.batch(TextData::Split::train, step, t.batch, t.seq, t.seed);
      const double loss = learner.step(device_tokens(s, inputs, rules), device_tokens(s, targets, rules), lr).loss;
      if (s.device() == 0) run.losses.push_back(loss);
    }
  });
  return run;
}

}  // namespace

// "1x1,2x2", or named meshes apart by ';' ("dp=1,mp=1;mp=2,cp=2").
std::vector<std::string> split_meshes(const std::string& list) {
  std::vector<std::string> out;
  const char between = list.find(';') != std::string::npos ? ';' : ',';
  if (between == ',' && list.find('=') != std::string::npos)
    fail("compare", "--meshes '{}': named meshes go apart by ';' (e.g. 'dp=1,mp=1;mp=2,cp=2'), commas name their axes", list);
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = std::min(list.find(between, start), list.size());
    out.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  if (out.size() != 2) fail("compare", "--meshes takes two meshes, e.g. 1x1,2x2 or 'dp=1,mp=1;mp=2,cp=2'; got '{}'", list);
  for (const auto& m : out) mesh_of(m);
  return out;
}

int compare_meshes(const CompareOptions& o, const TextData& data) {
  const Mesh a = mesh_of(o.meshes.at(0)), b = mesh_of(o.meshes.at(1));
  fmt::print("compare: config {}, batch {} x seq {}, {} step(s) on meshes {} and {}{}{}, every op recorded\n", o.train.config, o.train.batch,
             o.train.seq, o.train.steps, o.meshes[0], o.meshes[1], o.train.sequence_parallel ? " with --sequence-parallel" : "",
             o.train.deterministic ? " in deterministic mode" : "");
  const MeshRun ra = run_on(a, o, data), rb = run_on(b, o, data);
  for (std::size_t i = 0; i < ra.losses.size(); ++i)
    fmt::print("step {}: loss {:.9g} on {}, {:.9g} on {}{}\n", i, ra.losses[i], o.meshes[0], rb.losses[i], o.meshes[1],
               ra.losses[i] == rb.losses[i] ? " (bitwise equal)" : "");
  const debug::Comparison c = debug::compare_records(ra.records, rb.records);
  std::string report = debug::describe(c, o.meshes[0], o.meshes[1]);
  if (!c.first.found) report.insert(report.find(" between"), fmt::format(" over {} step(s)", o.train.steps));
  fmt::print("{}", report);
  return c.first.found ? 1 : 0;
}

}  // namespace gptj
