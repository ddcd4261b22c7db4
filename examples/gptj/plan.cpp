#include "plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "model.h"

namespace gptj {

using namespace nax;

namespace {

// One device's sizes: its parameters (those cut over mp divided by mp) and its tokens.
struct DeviceSizes {
  double params = 0, block_params = 0, head_params = 0;  // elements
  double largest = 0;                                    // the largest parameter's elements
  double largest_in_block = 0;                           // the largest of a block's parameters' elements
  double tokens = 0;                                    // batch / dp x seq
  double d = 0, attn = 0, ff = 0, heads = 0, vocab = 0;  // per device: d_model, heads x head_dim / mp, d_ff / mp, heads / mp, vocab / mp
  // Sequence parallelism on mp > 1: what runs between the psums is cut along seq, a device keeping
  // `cut` = 1 / mp of the positions, and each LayerNorm's output is kept on them and gathered.
  bool sequence_cut = false;
  double cut = 1;
  // Deterministic mode's sequence parallelism runs the LayerNorm after the gather (block.h), so a
  // block keeps the whole input it read, not its cut of it.
  bool whole_norm_input = false;
  double layers = 0;
  double dp = 1, mp = 1;
  // Context parallelism: a device holds 1 / cp of the positions, and each block's attention is
  // the ring, checkpointed (block.h): it keeps its output only, and rebuilds the rest in the backward.
  double cp = 1;
  bool ring = false;
  // Deterministic mode's cp: sequence parallelism over cp (block.h), the blocks running on the
  // whole sequence with their heads and mlp columns cut over mp and cp (head_cut devices).
  bool cp_gathered = false;
  double head_cut = 1;
  // FSDP: the parameters (and their gradients and moments) cut over fsdp, the batch too; each
  // block's parameters whole while it runs, and their gradient whole until its reduce-scatter.
  double fsdp = 1;
  // Micro-batches: `tokens` are one micro-batch's. A pipeline stage holds `in_flight` of them
  // between their forward and backward (1F1B: stages - stage; GPipe: all), and only its own layers'
  // parameters (the embedding on the first stage, the head on the last).
  double micro = 1, in_flight = 1;
  bool last = true;
};

DeviceSizes sizes_of(const Config& c, const Mesh& mesh, const PlanOptions& o, const Stage& stage, const Timetable& schedule) {
  const double mp = mesh.has("mp") ? mesh.axis_size("mp") : 1;
  DeviceSizes s;
  s.dp = mesh.has("dp") ? mesh.axis_size("dp") : 1;
  s.mp = mp;
  s.cp = context_devices(mesh);
  s.fsdp = fsdp_devices(mesh);
  const AxisRules rules = axis_rules(mesh);  // the model's own sharding: vocab, heads and mlp over mp
  for (const auto& spec : parameter_specs(c)) {
    double n = static_cast<double>(spec.global.numel());
    for (const auto& axis : spec.global.names())
      for (const auto& mesh_axis : rules.mesh_axes(axis))
        if (mesh.has(mesh_axis)) n /= static_cast<double>(mesh.axis_size(mesh_axis));
    const bool block = spec.name.starts_with("transformer.h.");
    if (block) s.block_params += n / static_cast<double>(c.n_layers);
    if (block) s.largest_in_block = std::max(s.largest_in_block, n);
    if (stage_holding(c, stage.count, spec.name) != stage.index) continue;
    s.params += n;
    s.largest = std::max(s.largest, n);
    if (!block) s.head_params += n;
  }
  s.micro = static_cast<double>(o.micro_batches);
  s.last = stage.last();
  s.in_flight = stage.count > 1 ? static_cast<double>(in_flight_on(schedule, stage.index)) : 1.0;
  s.ring = s.cp > 1 && !o.deterministic;
  s.cp_gathered = s.cp > 1 && o.deterministic;
  s.head_cut = mp * (s.cp_gathered ? s.cp : 1);
  s.tokens = static_cast<double>(o.batch) / data_parallel_devices(mesh) / s.micro * static_cast<double>(o.seq) / (s.ring ? s.cp : 1);
  s.d = static_cast<double>(c.d_model);
  s.attn = static_cast<double>(c.n_heads * c.head_dim) / s.head_cut;
  s.ff = static_cast<double>(c.d_ff) / s.head_cut;
  s.heads = static_cast<double>(c.n_heads) / s.head_cut;
  s.vocab = static_cast<double>(c.vocab) / mp;
  s.layers = static_cast<double>(stage.end_layer - stage.first_layer);
  s.sequence_cut = (o.sequence_parallel && mp > 1) || s.cp_gathered;  // mp=1: the plain model (Model::logits)
  s.cut = s.cp_gathered ? 1 / s.cp : s.sequence_cut ? 1 / mp : 1.0;
  s.whole_norm_input = s.sequence_cut && o.deterministic;
  return s;
}

// What one block's backward reads, captured by its ops' backward rules (the graph keeps no other
// value: src/ops/tape.h): in the compute dtype its input (which the LayerNorm reads; cut along seq
// with sequence parallelism), the LayerNorm's output as the projections read it (2 x d_model), q and
// k rotated, v and the attention output (4 x heads x head_dim / mp), the MLP's hidden values after
// the bias and after gelu (2 x d_ff / mp); in f32 the LayerNorm's mean and rstd (of the positions it
// runs on) and the attention's log-sum-exp per head. Under bf16 also the bf16 copies of the block's
// parameters. With cp the ring runs under remat and keeps its output only.
double block_saved(const DeviceSizes& s, double e, bool bf16) {
  const double attention = s.ring ? e * s.attn : e * 4 * s.attn + 4 * s.heads;
  const double normed = s.whole_norm_input ? 1.0 : s.cut;  // the positions the LayerNorm ran on
  return s.tokens * (e * (normed * s.d + s.d + 2 * s.ff) + attention + 4 * 2 * normed) + (bf16 ? 2 * s.block_params : 0.0);
}

// What one block makes beside what it keeps, alive together in it (block.h's temporaries): inside
// the MLP, the attention output beside the hidden values before the bias; at the first statement's
// end, the attention and MLP outputs, their sum and its psum on mp > 1 (with sequence parallelism
// the reduce-scatter's whole staging buffer and its cut result). Under remat the rebuilt block
// holds them at the end of its recompute.
double block_locals(const DeviceSizes& s, double e) {
  const double summed = s.head_cut == 1 ? 0.0 : s.sequence_cut ? s.d + s.cut * s.d : s.d;
  return s.tokens * e * std::max(s.d + s.ff, 3 * s.d + summed);
}

// The ring's recompute in one block's backward (ring_attention.h): q, k and v with their chunks
// and turned copies, the blocks received and their chunks, each pair's output and the combines'
// products and sums, about 4 cp + 6 values of heads x head_dim / mp per position.
double ring_transient(const DeviceSizes& s, double e) { return s.ring ? s.tokens * e * (4 * s.cp + 6) * s.attn : 0.0; }

// The values alive inside one block's backward besides the parameters' gradients and what the
// block saved. The MLP's backward runs first (it was recorded last): its d_ff-wide gradients beside
// d_model-wide ones, of the residual stream (cut with sequence parallelism) and of the LayerNorm's
// output.
double mlp_transient(const DeviceSizes& s, double e) { return s.tokens * e * (2 * s.ff + s.d + s.cut * s.d); }

// Then, with cp, the ring's backward: its recompute beside the d_model-wide gradients, and under
// remat the rebuilt block's MLP hidden values, held until the whole block's backward ends (measured
// at the allocator's high-water mark, small, cp=2 and mp=2,cp=2). Zero without cp (plain
// attention's backward adds less than the MLP's).
double ring_phase(const DeviceSizes& s, double e, bool remat) {
  if (!s.ring) return 0.0;
  return ring_transient(s, e) + s.tokens * e * (s.d + s.cut * s.d + (remat ? 2 * s.ff : 0.0));
}

// Deterministic mode on mp > 1: the LayerNorm output's gradient arrives as four terms (q, k, v and
// the MLP's input projection read it), kept apart, summed over mp (and cp) side by side into one
// buffer, then added in order (docs/determinism.md): 11 d_model-wide values at once
// where the default mode adds each as it comes. Under remat beside the rebuilt block's input and
// LayerNorm output; without it the block has by then let go of all it kept (`kept`, counted
// elsewhere) but those two. Measured at the allocator's high-water mark, small, mp=2 and mp=4.
double terms_phase(const DeviceSizes& s, double e, const PlanOptions& o, double kept) {
  if (!o.deterministic || s.head_cut == 1) return 0.0;
  const double terms = 11 * e * s.tokens * s.d, two_wide = 2 * e * s.tokens * s.d;
  // (deterministic cp under remat: also the rebuilt block's attention and MLP outputs, whole-sequence
  // partial sums that its reduce-scatters read; NAX_MEMORY_PEAK_TRACE, small, mp=2,cp=2)
  const double rebuilt_outputs = s.cp_gathered ? two_wide : 0.0;
  return o.remat ? terms + two_wide + rebuilt_outputs : std::max(0.0, terms - (kept - two_wide));
}

// The forward's end under bf16: an add's operands and result in f32 (bf16 ops compute in f32
// between their loads and stores).
double widened_add(const DeviceSizes& s, bool bf16) { return bf16 ? 3 * 4 * s.tokens * s.d : 0.0; }

// The head: the final LayerNorm's input (the last block's output) and output and its statistics,
// and the cross-entropy's exponentials (f32; the logits themselves go once it has returned); the
// bf16 copies of the embedding and output matrices.
double head_saved(const DeviceSizes& s, double e, bool bf16) {
  const double logits = s.tokens * s.vocab;
  const double final_norm = e * (s.cut * s.d + s.d) + 8 * s.cut;
  return s.tokens * final_norm + 4 * logits + (bf16 ? 2 * s.head_params : 0.0);
}

// The loss's gradient with respect to the logits and its product (f32), alive together at the
// start of the backward; on mp > 1 then the final hidden state's gradient and its psum (f32).
double head_transient(const DeviceSizes& s) { return 4 * 2 * s.tokens * (s.vocab + (s.mp > 1 ? s.d : 0.0)); }

}  // namespace

namespace {

// One device's plan: a device of pipeline stage `stage` (every layer without pp).
MemoryPlan plan_stage(const Config& c, const Mesh& mesh, const PlanOptions& o, const Stage& stage, const Timetable& schedule) {
  const DeviceSizes s = sizes_of(c, mesh, o, stage, schedule);
  const bool bf16 = o.dtype == DType::bf16;
  const double e = static_cast<double>(dtype_size(o.dtype));
  MemoryPlan p;
  p.parameters = 4 * s.params;  // f32 master weights whatever the compute dtype
  p.gradients = 4 * s.params;
  p.optimizer = 8 * (o.zero ? std::ceil(s.params / s.dp) : s.params);
  const double one_block = block_saved(s, e, bf16);
  // FSDP keeps each block's gathered parameters for its backward unless remat gathers them again
  // there; deterministic cp keeps cp's slices of them (block.h: the projections read the slices).
  const double slices = s.cp_gathered ? e * s.block_params * s.fsdp / s.cp : 0.0;
  const double gathered_kept = s.cp_gathered ? slices : s.fsdp > 1 ? e * s.block_params * s.fsdp : 0.0;
  const double kept_per_block = o.remat ? e * s.tokens * s.cut * s.d : one_block + gathered_kept;  // remat keeps each block's input only
  const double recompute = o.remat ? one_block + slices : 0.0;  // and rebuilds one block at a time (with its slices)
  const double wide_head = s.fsdp > 1 ? e * s.head_params * s.fsdp : 0.0;  // FSDP: wte and lm_head whole
  const double head = (s.last ? head_saved(s, e, bf16) : (bf16 ? 2 * s.head_params : 0.0)) + wide_head;
  // Micro-batch k's backward: the stage still keeps the micro-batches whose forward ran ahead of it
  // (in_flight - 1 at most, fewer at the end), and from k = 1 on the sum of the gradients so far
  // beside the ones this backward makes.
  const double kept_stage = s.layers * kept_per_block + (s.last ? head_saved(s, e, false) : 0.0);
  // FSDP: each parameter's gradient whole until its reduce-scatter, which comes as soon as the
  // backward has made it (the all_gather's transpose), so one at a time, the largest at most; and,
  // under remat, the block's parameters gathered again for its rebuild (kept_per_block counts them
  // otherwise).
  const double gathered = s.fsdp > 1 ? e * s.fsdp * (s.largest_in_block + (o.remat ? s.block_params : 0.0)) : 0.0;
  // Inside one block's backward: the MLP's transients (beside the rebuilt block under remat), the
  // ring's phase or deterministic mode's psum of terms, which comes at the block's end, beside the
  // block's weight gradients.
  const double mlp = mlp_transient(s, e), ring = ring_phase(s, e, o.remat), terms = terms_phase(s, e, o, one_block);
  const double terms_at_end = terms > 0 ? terms + 4 * s.block_params : 0.0;
  const double in_block = std::max({recompute + (o.remat ? block_locals(s, e) : 0.0), recompute + mlp, ring, terms_at_end}) + gathered;
  // The forward's end: every block's kept values and the last one's locals.
  const double forward_end = s.layers * kept_per_block + recompute + block_locals(s, e) + widened_add(s, bf16);
  p.activations = s.in_flight * s.layers * kept_per_block + head + recompute;
  const double state = p.parameters + p.optimizer;
  // The others kept only fall as k grows and the sum is there from k = 1 on: k = 0 and k = 1 are
  // the backwards that can peak.
  double backward = 0;
  for (double k = 0; k < std::min(s.micro, 2.0); ++k) {
    const double others = std::min(s.in_flight - 1, s.micro - k - 1) * kept_stage;
    const double sum = k > 0 ? p.gradients : 0.0;
    // The backward's memory falls as it frees activations and rises as gradients arrive: its peak
    // is at the head (everything saved, the logits' gradients), at the last block (the head freed),
    // at the first block (every gradient made) or after it, where the gradients' sums over dp go in
    // buckets (autodiff.cpp): each partial sum goes once it is in its bucket, which is summed in
    // place and hands its gradients out as pieces of itself, so beside one copy of the gradients
    // only the bucket being laid out (at most --bucket-mb, or what is left at the end). Before the
    // backward, the forward's end.
    const double at_forward_end = others + forward_end;
    const double at_head = others + s.layers * kept_per_block + head + (s.last ? head_transient(s) : 0.0);
    const double at_last_block = others + s.layers * kept_per_block + in_block + 4 * s.head_params + sum;
    // By the first block's backward every gradient is made; its own saved values (rebuilt under
    // remat) go as the MLP's backward's transients come, so the larger of the two counts.
    const double at_first_block = others + kept_per_block + std::max(recompute, std::max({mlp, ring, terms}) + gathered) + p.gradients + sum;
    // (a bucket starts once it holds --bucket-mb: up to that plus the gradient that filled it)
    const double bucket = s.dp * s.cp > 1 ? std::min(p.gradients, o.bucket_mb * (1 << 20) + 4 * s.largest) : 0.0;  // over dp and cp alike
    const double at_dp_sum = others + p.gradients + bucket + sum;
    backward = std::max({backward, at_forward_end, at_head, at_last_block, at_first_block, at_dp_sum});
  }
  p.backward_peak = state + backward;
  // The step: the averaged gradients and, while the largest parameter is updated, its clipped
  // gradient (AdamW::update scales each as it uses it), its new value and its new moments beside the
  // old ones (AdamW::update replaces one parameter at a time). With --zero every updated part lives
  // until the parts are gathered, with the largest parameter's part and gathered copy, beside the old
  // parameters.
  const double step_transient = o.zero ? p.parameters + 4 * (std::ceil(s.params / s.dp) + s.largest * (1 + 1 / s.dp)) : 12 * s.largest;
  const double clipped = 4 * (o.zero ? std::ceil(s.largest / s.dp) : s.largest);  // the largest gradient (with --zero its part), scaled
  p.optimizer_peak = p.parameters + p.optimizer + p.gradients + clipped + step_transient;
  p.peak = std::max(p.backward_peak, p.optimizer_peak);
  p.fits = p.peak <= o.device_memory;
  return p;
}

}  // namespace

MemoryPlan plan_memory(const Config& c, const Mesh& mesh, const PlanOptions& o) {
  if (o.dtype != DType::f32 && o.dtype != DType::bf16) fail("plan", "--dtype expects bf16 or f32, got '{}'", dtype_name(o.dtype));
  if (o.batch < 1) fail("plan", "--batch must be at least 1, got {}", o.batch);
  check_fits(c, mesh, o.batch);
  check_sequence_layout(mesh, o.seq, o.sequence_parallel, o.deterministic, c);
  if (o.deterministic && o.dtype != DType::f32)
    fail("plan", "--deterministic computes in f32 (a bf16 partial sum's rounding depends on the devices sharing it: "
         "docs/determinism.md): drop --dtype {} or --deterministic", dtype_name(o.dtype));
  if (o.seq < 1 || o.seq > c.max_seq) fail("plan", "--seq must be in 1..{} for config {}, got {}", c.max_seq, c.name, o.seq);
  if (!(o.device_memory > 0)) fail("plan", "--device-memory must be positive");
  if (!(o.bucket_mb >= 0)) fail("plan", "--bucket-mb must be at least 0, got {}", o.bucket_mb);
  check_micro_batches(mesh, o.batch, o.micro_batches, "plan");
  const int stages = pipeline_stages(mesh);
  const Timetable schedule = timetable(parse_schedule(o.schedule), stages, o.micro_batches);
  MemoryPlan busiest;
  busiest.bubble = bubble_fraction(schedule);
  for (int k = 0; k < stages; ++k) {  // the stages differ: the first holds the embedding, the last the head
    MemoryPlan p = plan_stage(c, mesh, o, stage_of(c, k, stages), schedule);
    busiest.stage_peaks.push_back(p.peak);
    if (k == 0 || p.peak > busiest.peak) {
      p.stage_peaks = std::move(busiest.stage_peaks);
      p.bubble = busiest.bubble;
      busiest = std::move(p);
    }
  }
  return busiest;
}

MemoryPlan plan_memory(const PlanOptions& o) {
  const Mesh mesh = model_mesh(o.mesh);
  return plan_memory(padded_for(config_by_name(o.config), mesh), mesh, o);
}

double parse_bytes(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char ch) { return static_cast<char>(std::toupper(ch)); });
  const std::pair<const char*, double> units[] = {{"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
                                                  {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
  for (const auto& [name, scale] : units)
    if (used > 0 && unit == name && value > 0 && std::isfinite(value)) return value * scale;
  fail("plan", "--device-memory expects a size such as 141GB, 80GiB or 512MB, got '{}'", text);
}

std::string format_plan(const PlanOptions& o, const MemoryPlan& p) {
  // GB to three decimals, MB to one below a GB: a small model's plan is read to the percent
  auto gb = [](double bytes) { return bytes < 1e9 ? fmt::format("{:10.1f} MB", bytes * 1e-6) : fmt::format("{:10.3f} GB", bytes * 1e-9); };
  std::string out = fmt::format("memory plan: config {}, mesh {}, batch {} x seq {}{}, {} compute{}{}{}{}; per device:\n", o.config, o.mesh,
                                o.batch, o.seq, o.micro_batches > 1 ? fmt::format(" in {} micro-batches", o.micro_batches) : "",
                                dtype_name(o.dtype), o.remat ? ", --remat" : "", o.zero ? ", --zero" : "",
                                o.sequence_parallel ? ", --sequence-parallel" : "", o.deterministic ? ", --deterministic" : "");
  out += fmt::format("  parameters (f32)       {}\n", gb(p.parameters));
  out += fmt::format("  gradients (f32)        {}\n", gb(p.gradients));
  out += fmt::format("  optimizer state        {}   AdamW m and v, f32{}\n", gb(p.optimizer), o.zero ? ", cut over dp" : "");
  out += fmt::format("  activations            {}   {}\n", gb(p.activations),
                     o.remat ? "each block's input, one block recomputed, the head" : "what the backward reads");
  out += fmt::format("  peak in backward       {}\n", gb(p.backward_peak));
  out += fmt::format("  peak in optimizer step {}\n", gb(p.optimizer_peak));
  out += fmt::format("  peak                   {}   of {:.2f} GB: {}\n", gb(p.peak), o.device_memory * 1e-9, p.fits ? "fits" : "does NOT fit");
  if (p.stage_peaks.size() > 1) {
    std::vector<std::string> each;
    for (double b : p.stage_peaks) {
      std::string peak = gb(b);
      each.push_back(peak.substr(peak.find_first_not_of(' ')));
    }
    out += fmt::format("  pipeline ({}, {} micro-batches): the busiest stage above; peaks per stage {}, bubble {:.1f}%\n", o.schedule,
                       o.micro_batches, fmt::join(each, " / "), 100 * p.bubble);
  }
  return out;
}

}  // namespace gptj
