#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <iterator>
#include <unordered_set>
#include <utility>

#include "autodiff/backward.h"
#include "nax/autodiff/autodiff.h"
#include "nax/ops/collectives.h"
#include "deterministic/deterministic.h"
#include "ops/collective_forward.h"
#include "ops/internal.h"

namespace nax {

namespace autodiff {

VaryType gradient_vary(const Tensor& like) {
  VaryType vary = like.vary();
  for (const auto& m : like.vary().partial_mesh_axes()) vary.set_varying(m);
  return vary;
}

namespace {

// A contribution in the value's axis order and dtype, with the value's vary type except over the
// mesh axes where the value is Invariant and the contribution varies (returned, to psum later).
std::pair<Tensor, std::vector<std::string>> align(const Tensor& g_in, const Tensor& like, const std::string& op) {
  if (!g_in.shape().same_axes(like.shape())) fail("grad", "backward of {} gave {} for input {}", op, g_in.str(), like.str());
  Tensor g = detail::permute_to(g_in, like.shape().names());
  if (g.dtype() != like.dtype()) g = cast(g, like.dtype());
  VaryType vary = gradient_vary(like);
  std::vector<std::string> pending_axes;
  for (const auto& e : g.vary().entries()) {
    if (like.vary().kind(e.mesh_axis) != Vary::Invariant) continue;
    if (e.kind == Vary::Split)
      fail("grad", "backward of {} gave {} cut over mesh axis '{}' for the invariant input {}", op, g.str(), e.mesh_axis, like.str());
    vary.set_varying(e.mesh_axis);
    pending_axes.push_back(e.mesh_axis);
  }
  std::sort(pending_axes.begin(), pending_axes.end());
  return {g.with_vary(vary), pending_axes};
}

}  // namespace

void accumulate(Pending& p, const Tensor& g_in, const std::string& op) {
  auto [g, axes] = align(g_in, p.like, op);
  if (deterministic::on()) {
    p.terms.emplace_back(std::move(axes), std::move(g));
    return;
  }
  auto [slot, fresh] = p.sums.try_emplace(axes, g);
  if (!fresh) slot->second = add(slot->second, g);
}

namespace {

// The vary type of gradients laid end to end in one bucket: Varying over the mesh axes to sum
// over, and per-device over every other mesh axis on which a part is not Invariant (a part cut
// there loses its cut in the flat buffer), so that the psum's result is not typed Invariant there.
VaryType bucket_vary(const std::vector<Tensor>& parts, const std::vector<std::string>& axes) {
  VaryType varying;
  for (const auto& m : axes) varying.set_varying(m);
  for (const auto& t : parts)
    for (const auto& e : t.vary().entries()) varying.set_varying(e.mesh_axis);
  return varying;
}

// Whether a sum over `axes` has nothing to add: no axes, or every device alone in its group (e.g.
// dp=1), so that the contributions are delivered as they are, with no bucket and no copy.
bool alone_over(const std::vector<std::string>& axes) { return axes.empty() || axis_size(Names(axes)) == 1; }

// Tensors laid end to end in one buffer typed for a psum over `axes`, and where each lies.
struct EndToEnd {
  Tensor flat;
  std::vector<Shape> shapes;
  std::vector<std::size_t> offsets;  // bytes
};

// Takes the parts (the caller keeps no other reference) and lets each go once it is in the buffer.
EndToEnd lay_end_to_end(std::vector<Tensor> parts, const std::vector<std::string>& axes) {
  std::int64_t total = 0;
  for (const auto& t : parts) total += t.numel();
  EndToEnd e;
  const VaryType varying = bucket_vary(parts, axes);
  e.flat = Tensor::empty(Shape{{"bucket", total}}, parts[0].dtype(), parts[0].device_ptr());
  auto& kernels = e.flat.device().kernels();
  std::size_t offset = 0;
  for (Tensor& t : parts) {
    kernels.copy_bytes(static_cast<char*>(e.flat.raw_mutable()) + offset, t.raw(), t.nbytes());
    e.shapes.push_back(t.shape()), e.offsets.push_back(offset);
    offset += t.nbytes();
    t = Tensor();
  }
  e.flat = e.flat.with_vary(varying);
  return e;
}

// Piece i of a summed buffer laid out as `e`: the buffer's own storage, not a copy (the pieces
// keep it alive together), typed for its gradient by the caller.
Tensor piece_of(const Tensor& reduced, const EndToEnd& e, std::size_t i) { return reduced.piece(e.offsets[i], e.shapes[i]); }

// The same tensors, laid end to end in one buffer, psummed together in place (the bucket), and
// handed out as pieces of it: two copies of the gradients only while they are laid out (the parts
// go as they enter the bucket), one after.
std::vector<Tensor> psum_together(std::vector<Tensor> parts, const std::vector<std::string>& axes) {
  if (parts.size() == 1) return {psum(parts[0], axes)};
  if (std::vector<Tensor> alike = detail::psum_alike(parts, Names(axes)); !alike.empty()) return alike;  // read where they lie
  EndToEnd e = lay_end_to_end(std::move(parts), axes);
  const Tensor reduced = detail::psum_over_input(std::exchange(e.flat, Tensor()), Names(axes));
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < e.shapes.size(); ++i) out.push_back(piece_of(reduced, e, i));
  return out;
}

// Deterministic mode: each value's contributions, those still varying psummed (bucketed as below:
// a bucket's psum adds each element over the ranks exactly as its own psum would), then added in
// arrival order, which is the same on every mesh.
std::vector<Tensor> finish_in_order(const std::vector<Pending*>& pendings) {
  std::vector<std::vector<Tensor>> parts(pendings.size());
  std::map<std::pair<std::vector<std::string>, DType>, std::vector<std::pair<std::size_t, std::size_t>>> buckets;
  for (std::size_t i = 0; i < pendings.size(); ++i) {
    if (pendings[i] == nullptr) continue;
    std::vector<std::pair<std::vector<std::string>, Tensor>> all(std::make_move_iterator(pendings[i]->sums.begin()),
                                                                  std::make_move_iterator(pendings[i]->sums.end()));
    all.insert(all.end(), std::make_move_iterator(pendings[i]->terms.begin()), std::make_move_iterator(pendings[i]->terms.end()));
    pendings[i]->sums.clear(), pendings[i]->terms.clear();
    for (auto& [axes, g] : all) {
      const DType dtype = g.dtype();
      parts[i].push_back(std::move(g));
      if (!alone_over(axes)) buckets[{axes, dtype}].push_back({i, parts[i].size() - 1});
    }
  }
  for (const auto& [key, places] : buckets) {
    std::vector<Tensor> summed;
    for (const auto& [i, j] : places) summed.push_back(std::move(parts[i][j]));
    summed = psum_together(std::move(summed), key.first);
    for (std::size_t p = 0; p < places.size(); ++p) parts[places[p].first][places[p].second] = summed[p];
  }
  std::vector<Tensor> out(pendings.size());
  for (std::size_t i = 0; i < pendings.size(); ++i)
    for (const auto& g : parts[i]) {
      const Tensor whole = g.with_vary(gradient_vary(pendings[i]->like));
      out[i] = out[i].defined() ? add(out[i], whole) : whole;
    }
  return out;
}

}  // namespace

// A bucket whose psum the walk started: each gradient is its piece of the summed bucket, handed
// out when its value is finished, the first waiting for the psum.
struct StartedBucket {
  EndToEnd layout;
  nax::Pending<Tensor> psum;
  Tensor reduced;
  std::size_t pieces_left = 0;

  Tensor take(std::size_t i) {
    if (!reduced.defined()) reduced = psum.wait();
    Tensor piece = piece_of(reduced, layout, i);
    if (--pieces_left == 0) reduced = Tensor();  // the pieces hold the storage now
    return piece;
  }
};

// Finished gradients. Where a value is Invariant over a mesh axis but a contribution varies (the
// value met a varying one: an implicit pvary), that contribution is summed over the axis, once for
// all the consumers that vary alike: pvary's transpose is psum. Several values' sums over the same
// mesh axes (and dtype) go as one all-reduce of the gradients laid end to end, as DDP buckets them:
// fewer, larger collectives (each element is summed over the same devices in the same order).
std::vector<Tensor> finish_bucketed(const std::vector<Pending*>& pendings) {
  if (deterministic::on()) return finish_in_order(pendings);
  // Each value's finished sums by the mesh axes they were kept under, added in that order at the
  // end: the same additions whichever of them went in buckets started during the walk.
  std::vector<std::map<std::vector<std::string>, Tensor>> finished(pendings.size());
  std::map<std::pair<std::vector<std::string>, DType>, std::vector<std::pair<std::size_t, Tensor>>> buckets;
  for (std::size_t i = 0; i < pendings.size(); ++i) {
    if (pendings[i] == nullptr) continue;
    for (auto& started : std::exchange(pendings[i]->started, {})) finished[i][started.axes] = started.bucket->take(started.piece);
    for (auto& [axes, sum] : std::exchange(pendings[i]->sums, {})) {
      if (alone_over(axes)) {
        finished[i][axes] = sum;
        continue;
      }
      const DType dtype = sum.dtype();
      buckets[{axes, dtype}].push_back({i, std::move(sum)});
    }
  }
  for (auto& [key, entries] : buckets) {
    std::vector<Tensor> parts;
    for (auto& entry : entries) parts.push_back(std::move(entry.second));
    parts = psum_together(std::move(parts), key.first);
    for (std::size_t e = 0; e < entries.size(); ++e) finished[entries[e].first][key.first] = parts[e];
  }
  std::vector<Tensor> out(pendings.size());
  for (std::size_t i = 0; i < pendings.size(); ++i)
    for (auto& [axes, sum] : finished[i]) {
      const Tensor whole = sum.with_vary(gradient_vary(pendings[i]->like));
      out[i] = out[i].defined() ? add(out[i], whole) : whole;
    }
  return out;
}

Tensor finish(const Pending& p) {
  Pending copy = p;
  return finish_bucketed({&copy})[0];
}

std::vector<Tensor> gradients_of(Grads grads, const std::vector<Tensor>& params) {
  std::vector<Pending*> pendings;
  for (const auto& p : params) {
    auto it = grads.find(p.grad_node().get());
    pendings.push_back(it != grads.end() ? &it->second : nullptr);
  }
  Transposing transposing;
  std::vector<Tensor> out = finish_bucketed(pendings);
  for (std::size_t i = 0; i < params.size(); ++i)
    if (!out[i].defined()) out[i] = zeros(params[i].shape(), params[i].dtype()).with_vary(params[i].vary());
  return out;
}

namespace {

// Nodes reachable from `root` and made at or after `floor`, each after every node that consumes
// it: latest made first (see Node::sequence). The list owns them: the walk frees each node's
// inputs, which may be the last other reference to a node still to come.
std::vector<std::shared_ptr<Node>> reverse_topological(const std::shared_ptr<Node>& root, std::uint64_t floor) {
  std::vector<std::shared_ptr<Node>> post_order;
  if (root->sequence < floor) return post_order;
  std::unordered_set<Node*> visited;
  std::vector<std::pair<std::shared_ptr<Node>, std::size_t>> stack{{root, 0}};
  visited.insert(root.get());
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (node->released) fail("grad", "the graph through '{}' was already used by an earlier grad()", node->op);
    if (next < node->inputs.size()) {
      const Tensor& input = node->inputs[next++];
      if (!input.defined()) continue;
      const auto& child = input.grad_node();
      if (child != nullptr && child->sequence >= floor && visited.insert(child.get()).second) stack.push_back({child, 0});
      continue;
    }
    post_order.push_back(node);
    stack.pop_back();
  }
  std::sort(post_order.begin(), post_order.end(), [](const auto& a, const auto& b) { return a->sequence > b->sequence; });
  return post_order;
}

}  // namespace

// DDP's overlap. The walk runs a value's readers before the value, so a parameter's gradient is
// complete once the last node that read it has run: its sums still to psum then join the open
// bucket of their mesh axes and dtype, and a bucket holding bucket_bytes has its psum started, to
// run while the walk goes on. Every device walks the same graph in the same order, so the devices
// of a group start the same buckets in the same order.
class OverlappedBuckets {
 public:
  OverlappedBuckets(const std::vector<std::shared_ptr<Node>>& order, const std::unordered_set<Node*>& wanted, std::size_t bucket_bytes)
      : bucket_bytes_(bucket_bytes), on_(bucket_bytes > 0 && !deterministic::on()) {
    if (!on_) return;
    for (const auto& node : order)
      for (Node* param : params_read(node.get(), wanted)) ++readers_[param];
  }

  // Reads `node`'s inputs: call before the walk frees them.
  std::vector<Node*> params_read(Node* node, const std::unordered_set<Node*>& wanted) const {
    std::vector<Node*> params;
    if (!on_ || node->leaf) return params;
    for (const Tensor& input : node->inputs) {
      if (!input.defined()) continue;
      Node* child = input.grad_node().get();
      if (child != nullptr && child->leaf && wanted.count(child)) params.push_back(child);
    }
    return params;
  }

  // After a node has run (or been skipped), with the parameters it read.
  void ran(const std::vector<Node*>& params, Grads& grads) {
    for (Node* param : params) {
      auto count = readers_.find(param);
      if (count == readers_.end() || --count->second > 0) continue;
      readers_.erase(count);
      auto it = grads.find(param);
      if (it != grads.end()) complete(param, it->second, grads);
    }
  }

 private:
  using Key = std::pair<std::vector<std::string>, DType>;
  struct Open {
    std::vector<std::pair<Node*, std::vector<std::string>>> members;  // whose sums, over which axes
    std::size_t bytes = 0;
  };

  void complete(Node* param, const Pending& pending, Grads& grads) {
    std::vector<std::pair<Key, std::size_t>> joining;  // (starting a bucket takes sums out of `pending`)
    for (const auto& [axes, sum] : pending.sums)
      if (!alone_over(axes)) joining.push_back({{axes, sum.dtype()}, sum.nbytes()});
    for (const auto& [key, bytes] : joining) {
      Open& open = open_[key];
      open.members.push_back({param, key.first});
      open.bytes += bytes;
      if (open.bytes >= bucket_bytes_) start(open_.extract(key).mapped(), key.first, grads);
    }
  }

  void start(Open open, const std::vector<std::string>& axes, Grads& grads) {
    auto bucket = std::make_shared<StartedBucket>();
    std::vector<Tensor> parts;
    for (std::size_t i = 0; i < open.members.size(); ++i) {
      Pending& pending = grads.at(open.members[i].first);
      auto sum = pending.sums.extract(open.members[i].second);
      parts.push_back(std::move(sum.mapped()));
      pending.started.push_back({bucket, i, open.members[i].second});
    }
    bucket->layout = lay_end_to_end(std::move(parts), axes);
    bucket->pieces_left = open.members.size();
    bucket->psum = detail::start_psum_over_input(std::exchange(bucket->layout.flat, Tensor()), Names(axes));
  }

  std::size_t bucket_bytes_;
  bool on_;
  std::unordered_map<Node*, int> readers_;  // nodes left to run that read each wanted parameter
  std::map<Key, Open> open_;
};

Grads backpropagate(const Tensor& root, const Tensor& seed, const std::unordered_set<Node*>& wanted, std::uint64_t floor,
                    std::size_t bucket_bytes) {
  Transposing transposing;
  Grads grads;
  const auto order = reverse_topological(root.grad_node(), floor);
  grads[root.grad_node().get()] = Pending{.sums = {{{}, seed}}, .like = root, .terms = {}, .started = {}};

  auto propagate = [&](Node* node, const Tensor& g) {
    std::vector<Tensor> input_grads = node->backward(g);
    if (input_grads.size() != node->inputs.size())
      fail("grad", "backward of {} gave {} gradients for {} inputs", node->op, input_grads.size(), node->inputs.size());
    for (std::size_t i = 0; i < node->inputs.size(); ++i) {
      const Tensor& input = node->inputs[i];
      if (!input.defined() || !input_grads[i].defined()) continue;
      auto& pending = grads[input.grad_node().get()];
      if (!pending.like.defined()) pending.like = input;
      accumulate(pending, input_grads[i], node->op);
    }
  };
  OverlappedBuckets buckets(order, wanted, bucket_bytes);
  for (const auto& owned : order) {
    Node* node = owned.get();
    const std::vector<Node*> params_read = buckets.params_read(node, wanted);
    auto it = grads.find(node);
    if (node->leaf || it == grads.end()) {
      buckets.ran(params_read, grads);
      continue;
    }
    if (node->passes_partial_sums && !wanted.count(node) && !deterministic::on()) {
      const Pending pending = std::move(it->second);
      grads.erase(it);
      for (const auto& [axes, sum] : pending.sums) propagate(node, axes.empty() ? sum.with_vary(gradient_vary(pending.like)) : sum);
    } else {
      const Tensor g = finish(it->second);
      if (wanted.count(node)) it->second.sums = {{{}, g}}, it->second.terms.clear();
      else grads.erase(it);
      propagate(node, g);
    }
    node->backward = nullptr;  // free what the op saved
    node->inputs.clear();
    node->released = true;
    buckets.ran(params_read, grads);
  }
  return grads;
}

}  // namespace autodiff

std::vector<Tensor> grad(const Tensor& loss, const std::vector<Tensor>& params, GradOptions options) {
  if (!loss.defined()) fail("grad", "the loss is undefined");
  if (loss.rank() != 0) fail("grad", "the loss must be a scalar, got {}", loss.str());
  if (!loss.requires_grad()) fail("grad", "the loss {} does not depend on any parameter (make them with parameter())", loss.str());
  if (!options.allow_varying_loss)
    for (const auto& m : loss.vary().partial_mesh_axes())
      fail("grad", "the loss {} is {} over mesh axis '{}': each device holds one term of it, so each would differentiate only its "
           "term; finish it with {} over '{}' first (or pass GradOptions{{.allow_varying_loss = true}} for per-device gradients)",
           loss.str(), loss.vary().local_mean(m) ? "a local mean" : "a partial sum", m, loss.vary().local_mean(m) ? "pmean" : "psum", m);
  if (!options.allow_varying_loss)
    for (const auto& m : loss.vary().varying_mesh_axes())
      fail("grad", "the loss {} is Varying over mesh axis '{}': each device would differentiate only its own part; reduce it with "
           "pmean/psum over '{}' first (or pass GradOptions{{.allow_varying_loss = true}} for per-device gradients)",
           loss.str(), m, m);
  std::unordered_set<autodiff::Node*> wanted;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined() || !params[i].requires_grad())
      fail("grad", "params[{}] = {} takes no gradient (make it with parameter())", i, params[i].str());
    wanted.insert(params[i].grad_node().get());
  }

  NoGrad no_grad;  // backward computations are not recorded
  if (loss.device().index() >= 0 && Shard::current() == nullptr)
    fail("grad", "the loss lives on {}: call grad inside Runtime::run", loss.device().str());
  auto grads = autodiff::backpropagate(loss, full(Shape{}, 1.0, loss.dtype()).with_vary(autodiff::gradient_vary(loss)), wanted, 0,
                                       options.bucket_bytes);
  return autodiff::gradients_of(std::move(grads), params);
}

std::pair<Tensor, std::vector<Tensor>> value_and_grad(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                                      const std::vector<Tensor>& params, GradOptions options) {
  std::vector<Tensor> leaves;
  for (const auto& p : params) leaves.push_back(parameter(p));
  Tensor loss = fn(leaves);
  auto grads = grad(loss, leaves, options);
  return {stop_gradient(loss), std::move(grads)};
}

}  // namespace nax
