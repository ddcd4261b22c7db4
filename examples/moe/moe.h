#pragma once
// A mixture-of-experts layer written per shard with nax's index ops and all_to_all, as GShard /
// Switch Transformer do it: each device routes its own group of tokens (top-k over a softmax
// router, the k gates renormalised when k > 1), queues the assignments per expert (every token's
// first choice before any second choice) and drops those beyond `capacity` slots; a one-hot
// dispatch tensor gathers each expert's slots, all_to_all over `ep` sends them to the devices
// holding the experts, the experts' MLPs run, a second all_to_all brings the results back, and
// the gate-weighted combine tensor puts them in their tokens' places. Dropped assignments add 0.
//
// Axes: x [group, tokens, embed] with `group` cut over every mesh axis (one group per device);
// router [embed, route]; w_in [expert, embed, mlp] and w_out [expert, mlp, embed] with `expert`
// cut over `ep` (replicated over dp). The result has x's shape, Split like x.
#include <nax/nax.h>

#include <string>
#include <vector>

namespace moe {

struct Config {
  std::int64_t experts = 4;
  std::int64_t embed = 8;
  std::int64_t mlp = 16;
  std::int64_t k = 2;          // experts per token
  std::int64_t capacity = 2;   // slots per expert per group
};

struct Weights {
  nax::Tensor router, w_in, w_out;
};

inline nax::Shape router_shape(const Config& c) { return nax::Shape{{"embed", c.embed}, {"route", c.experts}}; }
inline nax::Shape w_in_shape(const Config& c) { return nax::Shape{{"expert", c.experts}, {"embed", c.embed}, {"mlp", c.mlp}}; }
inline nax::Shape w_out_shape(const Config& c) { return nax::Shape{{"expert", c.experts}, {"mlp", c.mlp}, {"embed", c.embed}}; }

// One token group per device (group over all mesh axes, dp-major), experts over ep.
inline nax::AxisRules rules(const nax::Mesh& mesh) {
  return nax::AxisRules{{"group", mesh.axis_names()}, {"expert", "ep"}};
}

// Where each of this device's tokens goes: dispatch [group, tokens, expert, slot] is 1 at its
// kept slots, combine the same weighted by the gates (differentiable in x and the router).
struct Routing {
  nax::Tensor dispatch, combine;
};

inline Routing route(const nax::Tensor& x, const nax::Tensor& router, const Config& c) {
  using namespace nax;
  const Tensor probs = softmax(dot(x, router, "embed"), "route");  // [group, tokens, route]
  auto [gates, choices] = top_k(probs, "route", c.k, "choice");     // [group, tokens, choice]
  if (c.k > 1) gates = gates / sum(gates, "choice");
  const Tensor mask = one_hot(choices, Axis{"expert", c.experts}, x.dtype());  // [group, tokens, choice, expert]
  // Queue position of each assignment in its expert: the assignments of earlier choices of every
  // token, then those of this choice by earlier tokens.
  const Tensor earlier_choices = cumsum(sum(mask, "tokens"), "choice", /*exclusive=*/true);
  const Tensor position = sum((cumsum(mask, "tokens", /*exclusive=*/true) + earlier_choices) * mask, "expert");
  const Tensor slot = one_hot(cast(position, DType::i32), Axis{"slot", c.capacity}, x.dtype());  // zeros beyond capacity
  const Tensor assigned = mask * slot;  // [group, tokens, choice, expert, slot]
  return {sum(assigned, "choice"), sum(assigned * gates, "choice")};
}

inline nax::Tensor layer(const nax::Tensor& x, const Weights& w, const Config& c) {
  using namespace nax;
  const Routing r = route(x, w.router, c);
  const Tensor expert_in = dot(r.dispatch, x, "tokens");                       // [group, expert, slot, embed]
  const Tensor arrived = all_to_all(expert_in, "ep", "expert", "group");         // this device's experts, every ep group
  const Tensor hidden = gelu(dot(arrived, w.w_in, "embed"));                    // [expert, group, slot, mlp]
  const Tensor expert_out = all_to_all(dot(hidden, w.w_out, "mlp"), "ep", "group", "expert");  // back to their groups
  return dot(r.combine, expert_out, {"expert", "slot"});                         // [group, tokens, embed]
}

}  // namespace moe
