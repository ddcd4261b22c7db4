#pragma once
// Sharding propagation for the global view (docs/architecture.md, Global view). An op states its sharding rule once,
// einsum-style: every axis name is a factor; a factor absent from the output is reduced over. The
// rule is expanded per mesh axis into candidate strategies, priced by the cost model, and the
// cheapest is run: the per-shard op on redistributed blocks.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "nax/global/global_ops.h"

namespace nax::global_detail {

struct Rule {
  Rule(std::string op_name, std::string sig, std::vector<std::vector<std::string>> operand_axes, std::vector<std::string> output_axes)
      : op(std::move(op_name)), signature(std::move(sig)), operands(std::move(operand_axes)), output(std::move(output_axes)) {}

  std::string op;                                  // for errors
  std::string signature;                           // op and its static arguments: part of the cache key
  std::vector<std::vector<std::string>> operands;  // each operand's axes
  std::vector<std::string> output;                 // the result's axes
  std::vector<std::string> whole;                  // factors that may not be cut (e.g. a fused op's normalised axis)
  PartialOp reduction = PartialOp::sum;            // how a cut factor absent from the output combines
  std::vector<std::vector<int>> linear;            // operand sets that may be partial sums together, the others replicated
};

// Per operand, the placements it is redistributed to; and the result's placements.
struct Strategy {
  std::vector<Placements> inputs;
  Placements output;
  double cost_s = 0;  // the redistributions' cost under the cost model, and the reductions a moved cut leaves owed
};

// The cheapest strategy for `inputs` (cached per rule signature, input placements and shapes).
// Candidates on each mesh axis: replicate; cut a factor that an input is cut along there (the
// other inputs follow); leave partial sums partial through an op linear in them. Sharding follows
// the inputs' placements (as GSPMD propagates annotated shardings); it is never invented.
Strategy choose(const Rule& rule, const std::vector<const GlobalTensor*>& inputs);

// Runs the chosen strategy: redistributes the inputs, calls `fn` on their local blocks and wraps
// the per-shard result, checking that its vary type is the strategy's output placement.
GlobalTensor apply(const Rule& rule, const std::vector<const GlobalTensor*>& inputs,
                   const std::function<Tensor(const std::vector<Tensor>&)>& fn);

// Whether `name` is one of `axes`; `axes` without those in `removed`, in order.
bool has(const std::vector<std::string>& axes, const std::string& name);
std::vector<std::string> without(const std::vector<std::string>& axes, const std::vector<std::string>& removed);

// The partial reductions of `placements`, by mesh axis (to rewrap a per-shard result).
std::map<std::string, PartialOp> partial_ops(const Placements& placements);

}  // namespace nax::global_detail
