#include "global/propagation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <unordered_map>

#include "nax/global/cost_model.h"
#include "nax/global/vary_placement.h"
#include "nax/runtime/runtime.h"

namespace nax::global_detail {

namespace {

constexpr double kImpossible = std::numeric_limits<double>::infinity();

// What changing one operand's placement on mesh axis m costs, `bytes` being its local block.
double transition_cost(const CostModel& model, const Placement& from, const Placement& to, std::size_t bytes, int n,
                       const std::string& m) {
  if (from == to) return 0;
  if (to.is_partial()) return from.is_replicate() ? model.copy_seconds(bytes) : kImpossible;
  if (to.is_replicate()) {
    if (from.is_shard()) return model.seconds(CollectiveKind::all_gather, bytes, n, m);
    return model.seconds(CollectiveKind::all_reduce, bytes, n, m);
  }
  if (from.is_replicate()) return model.copy_seconds(bytes / static_cast<std::size_t>(n));
  if (from.is_shard()) return model.seconds(CollectiveKind::all_to_all, bytes, n, m);
  if (from.op() == PartialOp::sum) return model.seconds(CollectiveKind::reduce_scatter, bytes, n, m);
  return model.seconds(CollectiveKind::all_reduce, bytes, n, m) + model.copy_seconds(bytes / static_cast<std::size_t>(n));
}

bool deterministic_shard() {
  const Shard* s = Shard::current();
  return s != nullptr && s->deterministic();
}

struct Candidate {
  std::vector<Placement> inputs;
  Placement output = Placement::replicate();
  double cost = 0;
  int changes = 0;  // inputs redistributed: breaks ties (on a mesh axis of size 1 everything is free)

  bool cheaper_than(const Candidate& other) const { return cost < other.cost || (cost == other.cost && changes < other.changes); }
};

// The factors in order of first appearance over the operands.
std::vector<std::string> factors_of(const Rule& rule) {
  std::vector<std::string> factors;
  for (const auto& axes : rule.operands)
    for (const auto& a : axes)
      if (!has(factors, a)) factors.push_back(a);
  return factors;
}

class Chooser {
 public:
  Chooser(const Rule& rule, const std::vector<const GlobalTensor*>& inputs, const Mesh& mesh)
      : rule_(rule), inputs_(inputs), mesh_(mesh), factors_(factors_of(rule)) {
    for (const auto* x : inputs) bytes_.push_back(x->local().nbytes());
    for (const auto& f : factors_) local_size_.push_back(global_size(f));
  }

  Strategy run() {
    Strategy s;
    s.inputs.resize(inputs_.size());
    for (const auto& m : mesh_.axis_names()) {
      Candidate best = cheapest(m);
      if (best.cost == kImpossible)
        fail(rule_.op, "no sharding strategy fits the inputs {} on mesh axis '{}' (internal)", describe(), m);
      for (std::size_t i = 0; i < inputs_.size(); ++i) s.inputs[i].set(m, best.inputs[i]);
      s.output.set(m, best.output);
      s.cost_s += best.cost;
      if (!cut_factor_.empty()) shrink(cut_factor_, mesh_.axis_size(m));
    }
    return s;
  }

 private:
  std::int64_t global_size(const std::string& f) const {
    for (std::size_t i = 0; i < inputs_.size(); ++i)
      if (inputs_[i]->shape().has(f)) return inputs_[i]->shape().size(f);
    return 1;
  }

  void shrink(const std::string& f, int n) {
    for (std::size_t i = 0; i < factors_.size(); ++i)
      if (factors_[i] == f) local_size_[i] /= n;
  }

  std::string describe() const {
    std::vector<std::string> parts;
    for (const auto* x : inputs_) parts.push_back(x->str());
    return fmt::format("{}", fmt::join(parts, " and "));
  }

  void price(Candidate& c, const std::string& m) const {
    const int n = mesh_.axis_size(m);
    c.cost = 0;
    c.changes = 0;
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      c.cost += transition_cost(*model_, inputs_[i]->placement(m), c.inputs[i], bytes_[i], n, m);
      c.changes += inputs_[i]->placement(m) == c.inputs[i] ? 0 : 1;
    }
  }

  // A result made partial by moving an operand's cut onto the reduced factor owes a reduction
  // later that the move could have spared: at least a reduce-scatter of it. Counted so that a
  // cheap move of one operand does not win over gathering the other when the sum it leaves is
  // larger than both (FSDP's wide MLP weight: moving the activations' cut from batch to embed
  // leaves every hidden value to psum). Operands cut there already, or sliced from replicas, make
  // the partial sums tensor parallelism means to make: nothing is counted.
  double finishing_cost(const Candidate& c, const std::string& m) const {
    const int n = mesh_.axis_size(m);
    if (!c.output.is_partial() || n == 1) return 0;
    bool moved = false;
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      const Placement& from = inputs_[i]->placement(m);
      if (c.inputs[i].is_partial()) return 0;  // the sum was owed already
      moved = moved || (c.inputs[i].is_shard() && !(from == c.inputs[i] || from.is_replicate()));
    }
    if (!moved) return 0;
    double elements = 1;
    for (const auto& f : rule_.output)
      for (std::size_t i = 0; i < factors_.size(); ++i)
        if (factors_[i] == f) elements *= static_cast<double>(local_size_[i]);
    const auto bytes = static_cast<std::size_t>(elements) * dtype_size(inputs_[0]->dtype());
    return model_->seconds(CollectiveKind::reduce_scatter, bytes, n, m);
  }

  // Every operand having factor f cut along it; the result cut along it, or partial when f is reduced.
  Candidate cut(const std::string& f) const {
    Candidate c;
    for (const auto& axes : rule_.operands) c.inputs.push_back(has(axes, f) ? Placement::shard(f) : Placement::replicate());
    c.output = has(rule_.output, f) ? Placement::shard(f) : Placement::partial(rule_.reduction);
    return c;
  }

  bool cuttable(const std::string& f, int n) const {
    if (has(rule_.whole, f)) return false;
    for (std::size_t i = 0; i < factors_.size(); ++i)
      if (factors_[i] == f) return local_size_[i] % n == 0;
    return false;
  }

  Candidate cheapest(const std::string& m) {
    const int n = mesh_.axis_size(m);
    std::vector<Candidate> candidates;
    std::vector<std::string> cut_factors;
    Candidate replicated;
    replicated.inputs.assign(inputs_.size(), Placement::replicate());
    candidates.push_back(replicated);
    cut_factors.push_back("");
    for (const auto* x : inputs_) {
      const Placement& p = x->placement(m);
      if (!p.is_shard() || !cuttable(p.axis(), n) || has(cut_factors, p.axis())) continue;
      candidates.push_back(cut(p.axis()));
      cut_factors.push_back(p.axis());
    }
    for (const auto& set : rule_.linear) {
      // Deterministic mode keeps a partial sum partial only through add (the per-shard add keeps
      // the terms for the psum): any other op on it would reassociate the sum by the mesh.
      if (deterministic_ && rule_.op != "add") continue;
      bool follows = false;
      for (int i : set) follows |= inputs_[static_cast<std::size_t>(i)]->placement(m) == Placement::partial();
      if (!follows) continue;
      Candidate c;
      c.inputs.assign(inputs_.size(), Placement::replicate());
      for (int i : set) c.inputs[static_cast<std::size_t>(i)] = Placement::partial();
      c.output = Placement::partial();
      candidates.push_back(c);
      cut_factors.push_back("");
    }
    std::size_t best = 0;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      price(candidates[i], m);
      candidates[i].cost += finishing_cost(candidates[i], m);
      if (candidates[i].cheaper_than(candidates[best])) best = i;
    }
    cut_factor_ = cut_factors[best];
    return candidates[best];
  }

  const Rule& rule_;
  const std::vector<const GlobalTensor*>& inputs_;
  const Mesh& mesh_;
  const std::shared_ptr<const CostModel> model_ = cost_model();
  const bool deterministic_ = deterministic_shard();
  std::vector<std::string> factors_;
  std::vector<std::int64_t> local_size_;
  std::vector<std::size_t> bytes_;
  std::string cut_factor_;
};

struct Cache {
  std::unordered_map<std::string, Strategy> strategies;
  std::uint64_t model_version = 0;
  ShardingCacheStats stats;
};

}  // namespace

thread_local Cache g_cache;

namespace {

// Built on every global op: plain appends, no formatting.
std::string cache_key(const Rule& rule, const std::vector<const GlobalTensor*>& inputs) {
  std::string key = rule.signature;
  if (deterministic_shard()) key += "|deterministic";
  key.reserve(128);
  for (const auto* x : inputs) {
    key += '|';
    key += dtype_name(x->dtype());
    for (const auto& a : x->shape().axes()) {
      key += ' ';
      key += a.name;
      key += '=';
      key += std::to_string(a.size);
    }
    for (const auto& [m, p] : x->placements().entries()) {
      key += ';';
      key += m;
      key += p.is_shard() ? 'S' : p.is_partial() ? (p.op() == PartialOp::sum ? 'P' : 'M') : 'R';
      key += p.axis();
    }
  }
  return key;
}

void log_choice(const Rule& rule, const std::vector<const GlobalTensor*>& inputs, const Strategy& s) {
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    parts.push_back(inputs[i]->placements() == s.inputs[i] ? inputs[i]->placements().str()
                                                            : fmt::format("{} -> {}", inputs[i]->placements().str(), s.inputs[i].str()));
  fmt::print(stderr, "sharding: {}({}) = {}   cost {:.3g} us\n", rule.op, fmt::join(parts, ", "), s.output.str(), s.cost_s * 1e6);
}

void check_vary(const Rule& rule, const Tensor& out, const Placements& expected, const Mesh& mesh) {
  for (const auto& m : mesh.axis_names()) {
    const Placement& p = expected.on(m);
    const Vary k = out.vary().kind(m);
    const bool agrees = vary_of(p) == k && (!p.is_shard() || out.vary().split_axis(m) == p.axis());
    if (!agrees)
      fail(rule.op, "internal: the strategy gives {} over mesh axis '{}' but the per-shard op gave {}", p.str(), m, out.str());
  }
}

}  // namespace

std::uint64_t cost_model_version();

Strategy choose(const Rule& rule, const std::vector<const GlobalTensor*>& inputs) {
  const Mesh& mesh = Shard::current()->mesh();
  if (g_cache.model_version != cost_model_version()) {
    g_cache.strategies.clear();
    g_cache.model_version = cost_model_version();
  }
  std::string key = cache_key(rule, inputs);
  if (auto it = g_cache.strategies.find(key); it != g_cache.strategies.end()) {
    ++g_cache.stats.hits;
    return it->second;
  }
  ++g_cache.stats.misses;
  Strategy s = Chooser(rule, inputs, mesh).run();
  if (Shard::current()->sharding_log() && Shard::current()->device() == 0) log_choice(rule, inputs, s);
  g_cache.strategies.emplace(std::move(key), s);
  return s;
}

GlobalTensor apply(const Rule& rule, const std::vector<const GlobalTensor*>& inputs,
                   const std::function<Tensor(const std::vector<Tensor>&)>& fn) {
  for (const auto* x : inputs)
    if (!x->defined()) fail(rule.op, "an operand is undefined");
  Shard* shard = Shard::current();
  if (shard == nullptr) fail(rule.op, "global tensors live inside Runtime::run");
  const Strategy s = choose(rule, inputs);
  std::vector<Tensor> blocks;
  for (std::size_t i = 0; i < inputs.size(); ++i) blocks.push_back(redistribute(*inputs[i], s.inputs[i]).local());
  Tensor out = fn(blocks);
  check_vary(rule, out, s.output, shard->mesh());
  return GlobalTensor::from_local(out, partial_ops(s.output));
}

bool has(const std::vector<std::string>& axes, const std::string& name) {
  return std::find(axes.begin(), axes.end(), name) != axes.end();
}

std::vector<std::string> without(const std::vector<std::string>& axes, const std::vector<std::string>& removed) {
  std::vector<std::string> out;
  for (const auto& n : axes)
    if (!has(removed, n)) out.push_back(n);
  return out;
}

std::map<std::string, PartialOp> partial_ops(const Placements& placements) {
  std::map<std::string, PartialOp> ops;
  for (const auto& [m, p] : placements.entries())
    if (p.is_partial()) ops[m] = p.op();
  return ops;
}

}  // namespace nax::global_detail

namespace nax {
ShardingCacheStats sharding_cache_stats() { return global_detail::g_cache.stats; }
}  // namespace nax
