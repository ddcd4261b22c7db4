// The vocab block of this device, id checks and gradient vary types for embedding and pick.
#include "ops/vocab_parallel.h"

#include <fmt/format.h>

#include "nax/ops/tape.h"
#include "nax/ops/index_ops.h"
#include "nax/ops/ops.h"
#include "nax/shard/shard.h"
#include "ops/internal.h"

namespace nax::detail {

namespace {

std::string named_index(const Shape& shape, std::int64_t flat) {
  std::vector<std::string> parts(static_cast<std::size_t>(shape.rank()));
  for (int d = shape.rank() - 1; d >= 0; --d) {
    parts[static_cast<std::size_t>(d)] = fmt::format("{}={}", shape[d].name, flat % shape[d].size);
    flat /= shape[d].size;
  }
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

void check_ids_on_host(std::string_view op, std::string_view what, const Tensor& ids, std::int64_t total, const std::string& vocab,
                       const std::string& t) {
  const Tensor readable = ids.on_host();
  const auto* p = readable.data<std::int32_t>();
  for (std::int64_t i = 0; i < ids.numel(); ++i)
    if (p[i] < 0 || p[i] >= total)
      fail(op, "{} {} at {} of {} is outside the vocabulary [0, {}) of axis '{}' in {}", what, p[i], named_index(ids.shape(), i), ids.str(),
           total, vocab, t);
}

// Id checks on devices whose memory the host cannot read: each counts its bad ids on the device
// into one running total, read at this thread's next host read (which synchronises anyway), so a
// training step does not stop mid-way to look at its ids. A bad count re-runs the host check for
// the exact message.
struct DeferredIdCheck {
  std::string op, what;
  Tensor ids;
  std::int64_t total;
  std::string vocab, t;
};
struct DeferredIdChecks {
  std::vector<DeferredIdCheck> checks;
  Tensor bad;  // f32 count over all of them, on the device
};
thread_local DeferredIdChecks deferred;

}  // namespace

// The host reads a device's memory only once the device has drained: the checks left on it are
// resolved then (Tensor::on_host calls this after every such read).
const bool resolved_at_host_reads = (Tensor::after_host_read(&resolve_deferred_id_checks), true);

void resolve_deferred_id_checks() {
  if (deferred.checks.empty()) return;
  DeferredIdChecks pending = std::move(deferred);
  deferred = {};
  if (pending.bad.item() == 0) return;
  for (const auto& c : pending.checks) check_ids_on_host(c.op, c.what, c.ids, c.total, c.vocab, c.t);
}

VocabBlock vocab_block(std::string_view op, const Tensor& t, const std::string& vocab) {
  VocabBlock block;
  block.mesh_axes = t.vary().split_mesh_axes(vocab);
  block.range.local = t.size(vocab);
  block.total = block.range.local;
  if (block.mesh_axes.empty()) return block;
  const Shard* shard = Shard::current();
  if (shard == nullptr) fail(op, "{} has its vocab '{}' cut over mesh axes, but no device runs this code", t.str(), vocab);
  const Mesh& mesh = shard->mesh();
  block.range.start = mesh.rank_in_group(shard->device(), block.mesh_axes) * block.range.local;
  block.total = mesh.group_size(block.mesh_axes) * block.range.local;
  return block;
}

void check_ids(std::string_view op, std::string_view what, const Tensor& ids, const VocabBlock& block, const Tensor& t,
               const std::string& vocab) {
  if (ids.dtype() != DType::i32) fail(op, "{}s must be i32, got {} (with {})", what, ids.str(), t.str());
  // Each device of the group adds the rows of its block of the vocab: only the same ids on every
  // device make those the rows of one lookup.
  for (const auto& m : block.mesh_axes)
    if (ids.vary().kind(m) != Vary::Invariant)
      fail(op, "the {}s {} are not Invariant over mesh axis '{}', which cuts the vocab '{}' of {}: every device of the group "
           "must look up the same {}s, each in its block (all_gather_invariant them over '{}' first)", what, ids.str(), m, vocab,
           t.str(), what, m);
  if (ids.device().host_accessible()) return check_ids_on_host(op, what, ids, block.total, vocab, t.str());
  NoGrad no_grad;
  const Tensor wide = cast(stop_gradient(ids), DType::f32);  // ids below 2^24 are exact in f32
  const Tensor outside = lt(wide, full_like(wide, 0.0)) + ge(wide, full_like(wide, static_cast<double>(block.total)));
  const Tensor bad = sum(outside, ids.shape().names()).with_vary(VaryType{});
  deferred.bad = deferred.bad.defined() ? deferred.bad + bad : bad;
  deferred.checks.push_back({std::string(op), std::string(what), ids, block.total, vocab, t.str()});
}

VaryType scattered_gradient_vary(const Tensor& input, const Tensor& g) {
  VaryType vary = input.vary();
  for (const auto& e : g.vary().entries())
    if (input.vary().kind(e.mesh_axis) != Vary::Split) vary.set_varying(e.mesh_axis);
  return vary;
}

}  // namespace nax::detail
