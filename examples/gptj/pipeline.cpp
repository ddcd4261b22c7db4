#include "pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>

#include "model.h"

namespace gptj {

using namespace nax;

Stage stage_of(const Config& c, int index, int count) {
  const std::int64_t base = c.n_layers / count, longer = c.n_layers % count;
  Stage s{.index = index, .count = count};
  s.first_layer = index * base + std::min<std::int64_t>(index, longer);
  s.end_layer = s.first_layer + base + (index < longer ? 1 : 0);
  return s;
}

Stage device_stage(const Config& c, const Mesh& mesh, const Shard& s) {
  const int count = pipeline_stages(mesh);
  return stage_of(c, count > 1 ? s.coord("pp") : 0, count);
}

namespace {

// The layer a parameter name belongs to ("transformer.h.3.attn.q_proj.weight": 3); -1 for the
// embedding, n_layers for the final LayerNorm and the head.
std::int64_t layer_of(const Config& c, const std::string& name) {
  if (name.starts_with("transformer.wte.")) return -1;
  if (!name.starts_with("transformer.h.")) return c.n_layers;
  return std::stoll(name.substr(std::string("transformer.h.").size()));
}

}  // namespace

std::vector<nn::ParamSpec> stage_specs(const Config& c, const Stage& stage) {
  std::vector<nn::ParamSpec> out;
  for (const auto& spec : parameter_specs(c))
    if (stage_holding(c, stage.count, spec.name) == stage.index) out.push_back(spec);
  return out;
}

int stage_holding(const Config& c, int count, const std::string& name) {
  const std::int64_t layer = layer_of(c, name);
  if (layer < 0) return 0;
  if (layer >= c.n_layers) return count - 1;
  for (int s = 0; s < count; ++s)
    if (layer < stage_of(c, s, count).end_layer) return s;
  fail("pipeline", "parameter '{}' names layer {} of {}", name, layer, c.n_layers);
}

Schedule parse_schedule(const std::string& name) {
  if (name == "1f1b") return Schedule::one_f_one_b;
  if (name == "gpipe") return Schedule::gpipe;
  fail("train", "--schedule expects 1f1b or gpipe, got '{}'", name);
}

const char* schedule_name(Schedule s) { return s == Schedule::gpipe ? "gpipe" : "1f1b"; }

namespace {

// Each stage's actions in the order it runs them.
std::vector<Action> stage_order(Schedule schedule, int stage, int stages, std::int64_t micro) {
  std::vector<Action> order;
  const std::int64_t ahead = schedule == Schedule::gpipe ? micro : std::min<std::int64_t>(stages - 1 - stage, micro);
  for (std::int64_t m = 0; m < ahead; ++m) order.push_back({Action::forward, m});
  for (std::int64_t m = 0; m < micro; ++m) {
    if (m + ahead < micro) order.push_back({Action::forward, m + ahead});
    order.push_back({Action::backward, m});
  }
  return order;
}

}  // namespace

Timetable timetable(Schedule schedule, int stages, std::int64_t micro) {
  std::vector<std::vector<Action>> order;
  for (int s = 0; s < stages; ++s) order.push_back(stage_order(schedule, s, stages, micro));
  std::vector<std::size_t> next(static_cast<std::size_t>(stages), 0);
  // The tick after which stage s has micro-batch m's input: forward (activation) and backward (cotangent).
  std::map<std::pair<int, std::int64_t>, std::int64_t> forward_ready, backward_ready;
  Timetable table;
  for (std::int64_t tick = 0;; ++tick) {
    bool left = false;
    std::vector<Action> row(static_cast<std::size_t>(stages));
    for (int s = 0; s < stages; ++s) {
      auto& n = next[static_cast<std::size_t>(s)];
      const auto& mine = order[static_cast<std::size_t>(s)];
      if (n == mine.size()) continue;
      left = true;
      const Action a = mine[n];
      auto arrived = [&](const auto& ready, int at) {
        const auto it = ready.find({at, a.micro});
        return it != ready.end() && it->second < tick;
      };
      const bool has_input = a.kind == Action::forward ? s == 0 || arrived(forward_ready, s)
                                                       : arrived(s == stages - 1 ? forward_ready : backward_ready, s == stages - 1 ? stages : s);
      if (!has_input) continue;
      row[static_cast<std::size_t>(s)] = a;
      ++n;
    }
    if (!left) break;
    for (int s = 0; s < stages; ++s) {  // what the tick's exchange delivers
      const Action& a = row[static_cast<std::size_t>(s)];
      if (a.kind == Action::forward) forward_ready[{s + 1, a.micro}] = tick;
      if (a.kind == Action::backward) backward_ready[{s - 1, a.micro}] = tick;
    }
    table.push_back(std::move(row));
  }
  return table;
}

double bubble_fraction(const Timetable& t) {
  if (t.empty()) return 0.0;
  std::size_t idle = 0, all = 0;
  for (const auto& row : t)
    for (const auto& a : row) {
      idle += a.kind == Action::idle ? 1 : 0;
      ++all;
    }
  return static_cast<double>(idle) / static_cast<double>(all);
}

std::int64_t in_flight_on(const Timetable& t, int stage) {
  std::int64_t now = 0, most = 0;
  for (const auto& row : t) {
    const Action::Kind kind = row[static_cast<std::size_t>(stage)].kind;
    now += kind == Action::forward ? 1 : kind == Action::backward ? -1 : 0;
    most = std::max(most, now);
  }
  return most;
}

std::int64_t most_in_flight(const Timetable& t) {
  std::int64_t most = 0;
  for (std::size_t s = 0; !t.empty() && s < t[0].size(); ++s) most = std::max(most, in_flight_on(t, static_cast<int>(s)));
  return most;
}

namespace {

// One tick's exchange in one direction, started: the stages that send pass their tensor to their
// neighbour (`step` +1: the next stage, -1: the previous), the others zeros; every device starts the
// ppermute when any stage sends, so that the group's calls agree. Nothing when no stage sends.
std::optional<Pending<Tensor>> start_exchange(const std::vector<Action>& row, Action::Kind kind, int step, const Tensor& mine) {
  std::vector<std::pair<int, int>> pairs;
  for (std::size_t s = 0; s < row.size(); ++s) {
    const int to = static_cast<int>(s) + step;
    if (row[s].kind == kind && to >= 0 && to < static_cast<int>(row.size())) pairs.emplace_back(static_cast<int>(s), to);
  }
  if (pairs.empty()) return std::nullopt;
  return start_ppermute(mine, "pp", pairs);
}

}  // namespace

namespace {

// One device's part of a schedule: the micro-batches received and not yet run, the forwards whose
// pullback has not run, the gradients and losses so far.
class StageRun {
 public:
  StageRun(const StageProgram& program, const std::vector<Tensor>& params, bool backward)
      : program_(program), stage_(program.stage), params_(params), backward_(backward), nothing_(program.activation_like()) {}

  // Runs this stage's action of one tick, then the tick's exchanges.
  void tick(const std::vector<Action>& row) {
    Action a = row[static_cast<std::size_t>(stage_.index)];
    if (a.kind == Action::backward && !backward_) a = {};  // an evaluation runs the forwards only
    const auto start = std::chrono::steady_clock::now();
    {
      // The trace shows each tick's action per stage, and the bubble as "idle" (the tick's wait).
      const trace::Span span("pipeline", a.kind == Action::forward ? "forward" : a.kind == Action::backward ? "backward" : "idle",
                             [&] { return fmt::format("\"micro\": {}, \"stage\": {}", a.micro, stage_.index); });
      if (a.kind == Action::forward) forward(a.micro);
      if (a.kind == Action::backward) backward(a.micro);
    }
    if (a.kind != Action::idle) busy_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    pass_on(row);
  }

  std::vector<Tensor> mean_grads() const { return acc_.count() > 0 ? acc_.mean() : std::vector<Tensor>{}; }
  // The exchanges this stage started and received nothing from, waited for (every start needs its wait).
  void finish_sends() {
    for (auto& p : sends_) static_cast<void>(p.wait());
    sends_.clear();
  }
  const Tensor& loss_sum() const { return loss_sum_; }
  double busy_s = 0;

 private:
  void forward(std::int64_t m) {
    std::vector<Tensor> primals = params_;
    if (!stage_.first()) primals.push_back(take(activations_, m));
    auto fn = [&, m](const std::vector<Tensor>& p) {
      const std::vector<Tensor> weights(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(params_.size()));
      return std::vector<Tensor>{program_.forward(weights, stage_.first() ? Tensor() : p.back(), m)};
    };
    Tensor result;
    if (backward_) {
      Vjp f = vjp(fn, primals);
      result = f.outputs[0];
      waiting_.emplace(m, std::move(f));
    } else {
      NoGrad no_grad;
      result = fn(primals)[0];
    }
    if (stage_.last()) loss_sum_ = loss_sum_ + cast(result, DType::f64);
    else send_on_ = result;
  }

  void backward(std::int64_t m) {
    const Vjp f = std::move(waiting_.at(m));
    waiting_.erase(m);
    auto grads = f.pullback({stage_.last() ? full_like(f.outputs[0], 1.0) : take(cotangents_, m)});
    if (!stage_.first()) {
      send_back_ = grads.back();
      grads.pop_back();
    }
    acc_.add(grads);
  }

  // Forward: the activations go on; backward: the cotangents go back. A stage with nothing to send
  // passes zeros shaped as an activation. The ppermutes are started: a stage goes on to its next
  // tick while its tensor travels, and the receiver waits for it where it takes it (take).
  void pass_on(const std::vector<Action>& row) {
    finish_sends();  // the last tick's: one tick in flight at most
    const auto any = [&](Action::Kind kind) { return std::any_of(row.begin(), row.end(), [&](const Action& x) { return x.kind == kind; }); };
    if (any(Action::forward)) send(row, Action::forward, 1, send_on_, activations_);
    if (backward_ && any(Action::backward)) send(row, Action::backward, -1, send_back_, cotangents_);
    send_on_ = send_back_ = Tensor();
  }

  // One direction's exchange: what this stage receives (from the stage `step` before it, when that
  // one sent) goes in `into` by micro-batch; a start it receives nothing from waits in sends_.
  void send(const std::vector<Action>& row, Action::Kind kind, int step, const Tensor& mine, std::map<std::int64_t, Pending<Tensor>>& into) {
    auto sent = start_exchange(row, kind, step, mine.defined() ? mine : nothing_);
    if (!sent) return;
    const int from = stage_.index - step;
    if (from >= 0 && from < static_cast<int>(row.size()) && row[static_cast<std::size_t>(from)].kind == kind)
      into.emplace(row[static_cast<std::size_t>(from)].micro, std::move(*sent));
    else
      sends_.push_back(std::move(*sent));
  }

  static Tensor take(std::map<std::int64_t, Pending<Tensor>>& received, std::int64_t m) {
    Tensor t = received.at(m).wait();
    received.erase(m);
    return t;
  }

  const StageProgram& program_;
  const Stage& stage_;
  const std::vector<Tensor>& params_;
  const bool backward_;
  const Tensor nothing_;  // what a stage with nothing to send passes (a ppermute leaves its input as it is)
  std::map<std::int64_t, Pending<Tensor>> activations_, cotangents_;  // on their way, by micro-batch
  std::vector<Pending<Tensor>> sends_;                                  // started, nothing to receive
  std::map<std::int64_t, Vjp> waiting_;                      // forwards whose pullback has not run
  Tensor send_on_, send_back_;
  Tensor loss_sum_ = pvary(scalar(0.0, DType::f64), "pp");
  nn::GradAccumulator acc_;
};

}  // namespace

PipelineStep run_pipeline(const Timetable& t, const StageProgram& program, const std::vector<Tensor>& params, bool backward) {
  const auto start = std::chrono::steady_clock::now();
  StageRun run(program, params, backward);
  for (const auto& row : t) {
    const bool forwards = std::any_of(row.begin(), row.end(), [](const Action& a) { return a.kind == Action::forward; });
    if (backward || forwards) run.tick(row);  // an evaluation skips the ticks of backwards alone
  }
  run.finish_sends();
  PipelineStep out;
  out.grads = backward ? run.mean_grads() : std::vector<Tensor>{};
  // The losses live on the last stage: every device takes its value (a gather, exact in every bit).
  const Tensor all = all_gather_invariant_stacked(run.loss_sum(), "pp", "stage");
  out.loss_sum = sum(slice(all, "stage", program.stage.count - 1, program.stage.count), {"stage"});  // one term: exact
  out.busy_s = run.busy_s;
  out.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace gptj
