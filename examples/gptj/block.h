#pragma once
// One GPT-J block written per shard, as in mesh-transformer-jax: parallel residual
// x + attn(ln(x)) + mlp(ln(x)), heads and mlp cut over `mp`, one psum per block forward (and, by
// autodiff, one backward). Also the Megatron-style variant: sequential residual, two psums. With
// sequence parallelism (Megatron-LM's) x is cut along seq over mp between blocks: the LayerNorm
// runs on this device's block of the sequence, an all_gather along seq feeds the projections and
// a psum_scatter along seq takes the psum's place, the batch in pieces whose transfers overlap the
// other pieces' compute (overlapped_block). In deterministic mode the LayerNorm runs after
// the gather and the output bias is added as the own block of a whole-sequence bias, so that every
// sum over the rows (batch, seq) runs over whole rows, as on one device (docs/determinism.md).
// Context parallelism over cp: ring attention (ring_attention.h); in deterministic mode instead
// sequence parallelism over cp, the heads and mlp columns cut over cp beside mp.
#include <nax/nax.h>

#include <cmath>
#include <source_location>
#include <string>
#include <vector>

#include "ring_attention.h"

namespace gptj {

struct BlockConfig {
  std::int64_t d_model = 64;
  std::int64_t n_heads = 4;
  std::int64_t head_dim = 16;
  std::int64_t d_ff = 256;
  std::int64_t rotary_dims = 8;
  double layer_norm_eps = 1e-5;
  // x: [batch, seq|mp, embed] instead of whole on every mp device (a training layout; generation
  // with a KV cache keeps x whole).
  bool sequence_parallel = false;
  // RuntimeOptions::deterministic: with sequence_parallel, sums over rows see whole rows (see
  // normalized and output_bias).
  bool deterministic = false;
  // x: [batch, seq|cp, embed], the positions of this device's two zigzag chunks (ring_attention.h;
  // a training layout too). Deterministic: a contiguous block of seq, gathered by every block.
  bool context_parallel = false;
  // Sequence parallel, default mode: the batch in this many pieces, each piece's gather and
  // reduce-scatter started while another piece computes (overlapped_block); 1 runs the block whole.
  std::int64_t overlap_pieces = 2;
};

// Global shapes of the block's parameters, with Hugging Face GPT-J's names and layouts (a linear
// layer's weight is [out, in]; q/k/v/out split their heads*head_dim side into heads, head_dim).
inline std::vector<std::pair<std::string, nax::Shape>> block_parameter_shapes(const BlockConfig& c) {
  using nax::Shape;
  const Shape qkv{{"heads", c.n_heads}, {"head_dim", c.head_dim}, {"embed", c.d_model}};
  return {
      {"ln_1.weight", Shape{{"embed", c.d_model}}},
      {"ln_1.bias", Shape{{"embed", c.d_model}}},
      {"attn.q_proj.weight", qkv},
      {"attn.k_proj.weight", qkv},
      {"attn.v_proj.weight", qkv},
      {"attn.out_proj.weight", Shape{{"embed", c.d_model}, {"heads", c.n_heads}, {"head_dim", c.head_dim}}},
      {"mlp.fc_in.weight", Shape{{"mlp", c.d_ff}, {"embed", c.d_model}}},
      {"mlp.fc_in.bias", Shape{{"mlp", c.d_ff}}},
      {"mlp.fc_out.weight", Shape{{"embed", c.d_model}, {"mlp", c.d_ff}}},
      {"mlp.fc_out.bias", Shape{{"embed", c.d_model}}},
  };
}

// mesh-transformer-jax's sharding: heads, mlp over mp; batch over dp.
inline nax::AxisRules block_rules(const nax::Mesh& mesh) {
  nax::AxisRules rules{{"heads", "mp"}, {"mlp", "mp"}};
  if (mesh.has("dp")) rules.set("batch", {"dp"});
  return rules;
}

struct BlockParams {
  nax::Tensor ln_scale, ln_bias, q, k, v, out, mlp_in, mlp_in_bias, mlp_out, mlp_out_bias;

  // In the order of block_parameter_shapes.
  static BlockParams from(const std::vector<nax::Tensor>& t) {
    return {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9]};
  }
};

// Keys and values of the positions seen so far, for generation one token at a time.
struct KVCache {
  nax::Tensor k, v;  // [batch, seq, heads|mp, head_dim]
  std::int64_t length() const { return k.defined() ? k.shape().size("seq") : 0; }
};

// This device's block of `axis` of a value the same on every device of `mesh_axis` (cut beside the
// mesh axes that already cut `axis`, as their most minor cut). The slice's transpose writes each
// device's block into zeros and psums them over `mesh_axis`: nothing overlaps, the sum is exact.
inline nax::Tensor own_block(const nax::Tensor& whole, const std::string& mesh_axis, const std::string& axis) {
  using namespace nax;
  const std::int64_t block = whole.size(axis) / axis_size(mesh_axis);
  const Tensor start = axis_index(mesh_axis) * scalar(static_cast<double>(block), DType::i32);
  std::vector<std::string> cuts = whole.vary().split_mesh_axes(axis);  // a slice is no block of them: cut again, with mesh_axis
  cuts.push_back(mesh_axis);
  return as_split(dynamic_slice(whole, axis, start, block), Names(cuts), axis);
}

// Deterministic context parallelism: x is cut along seq over cp in contiguous blocks, and each
// block gathers the sequence and cuts its heads and mlp columns over cp beside mp (sequence
// parallelism, with cp in mp's place), so that every sum over the tokens runs over whole rows and
// attention is one device's over its heads (ring attention's online softmax adds in an order that
// depends on cp; docs/determinism.md).
inline bool context_gathered(const BlockConfig& c) { return c.context_parallel && c.deterministic; }

// The block's projections with this device's heads and mlp columns of cp's cut of them.
inline BlockParams heads_over_cp(BlockParams p) {
  for (nax::Tensor* t : {&p.q, &p.k, &p.v, &p.out}) *t = own_block(*t, "cp", "heads");
  for (nax::Tensor* t : {&p.mlp_in, &p.mlp_in_bias, &p.mlp_out}) *t = own_block(*t, "cp", "mlp");
  return p;
}

// Context parallelism: q and k turned at their chunks' positions, attention around the cp ring.
// Under remat, as ring attention's backward recomputes (and passes around again) what its forward
// made: the blocks received and the partial results would otherwise be kept for every step, as
// many as one device holding the whole sequence's keys and values.
inline nax::Tensor ring_attention_of(const BlockParams& p, const nax::Tensor& h, const BlockConfig& c) {
  using namespace nax;
  return remat([q_proj = p.q, k_proj = p.k, v_proj = p.v, rotary_dims = c.rotary_dims](const Tensor& x) {
    const Shard& s = *Shard::current();
    const Chunks mine = zigzag_chunks(s.coord("cp"), s.mesh().axis_size("cp"), x.size("seq"));
    const auto q = rotary_chunks(dot(x, q_proj, "embed"), mine, rotary_dims);
    const auto k = rotary_chunks(dot(x, k_proj, "embed"), mine, rotary_dims);
    return ring_attention(q, concat({k[0], k[1]}, "seq"), dot(x, v_proj, "embed"), mine);
  }, h);
}

inline nax::Tensor attention(const BlockParams& p, const nax::Tensor& h, const BlockConfig& c, KVCache* cache = nullptr) {
  using namespace nax;
  if (c.context_parallel && !c.deterministic) return dot(ring_attention_of(p, h, c), p.out, {"heads", "head_dim"});  // partial over mp
  const std::int64_t offset = cache != nullptr ? cache->length() : 0;
  Tensor q = rotary(dot(h, p.q, "embed"), "seq", "head_dim", c.rotary_dims, offset);  // [batch, seq, heads|mp, head_dim]
  Tensor k = rotary(dot(h, p.k, "embed"), "seq", "head_dim", c.rotary_dims, offset);
  Tensor v = dot(h, p.v, "embed");
  if (cache != nullptr) {
    if (offset > 0) {
      k = concat({cache->k, k}, "seq");
      v = concat({cache->v, v}, "seq");
    }
    cache->k = k, cache->v = v;
  }
  return dot(causal_attention(q, k, v, "seq", "head_dim"), p.out, {"heads", "head_dim"});  // partial over mp
}

inline nax::Tensor mlp(const BlockParams& p, const nax::Tensor& h) {
  using namespace nax;
  return dot(gelu(dot(h, p.mlp_in, "embed") + p.mlp_in_bias), p.mlp_out, "mlp");  // partial over mp
}

// What the column-parallel projections read: every position, gathered along seq when cut. The
// collectives here report the caller's line (a mismatch between devices names it).
inline nax::Tensor whole_sequence(const nax::Tensor& h, const BlockConfig& c, std::source_location where = std::source_location::current()) {
  return c.sequence_parallel ? nax::all_gather(h, "mp", "seq", where) : h;
}

// A row-parallel projection's partial sum over mp, finished: whole, or this device's block of seq.
// Deterministic context parallelism: partial over mp and cp (the heads cut mp-major), reduce-
// scattered over cp first, then psummed over mp: the order of the canonical tree.
inline nax::Tensor sum_over_mp(const nax::Tensor& partial, const BlockConfig& c, std::source_location where = std::source_location::current()) {
  if (context_gathered(c)) return nax::psum(nax::psum_scatter(partial, "cp", "seq", where), "mp", where);
  return c.sequence_parallel ? nax::psum_scatter(partial, "mp", "seq", where) : nax::psum(partial, "mp", where);
}

// Deterministic sequence parallelism: a sum over rows cut along seq behind the batch holds no block
// of the canonical tree, so the values whose gradients sum over rows are made whole first.
inline bool rows_whole(const BlockConfig& c) { return (c.sequence_parallel || c.context_parallel) && c.deterministic; }

// The mesh axis that cuts x's seq when rows_whole.
inline std::string seq_cut(const BlockConfig& c) { return c.context_parallel ? "cp" : "mp"; }

// layer_norm(x) as the projections read it, over every position. Sequence parallel: normalized on
// this device's block, then gathered; deterministic: gathered (invariant over mp, as in the plain
// model), then normalized, so the scale and bias gradients sum whole rows and the cotangent is
// psummed, not reduce-scattered.
inline nax::Tensor normalized(const nax::Tensor& x, const nax::Tensor& scale, const nax::Tensor& bias, double eps, const BlockConfig& c,
                              std::source_location where = std::source_location::current()) {
  if (rows_whole(c)) return nax::layer_norm(nax::all_gather_invariant(x, seq_cut(c), "seq", where), "embed", scale, bias, eps);
  return whole_sequence(nax::layer_norm(x, "embed", scale, bias, eps), c, where);
}

inline nax::Tensor normalized(const BlockParams& p, const nax::Tensor& x, const BlockConfig& c,
                              std::source_location where = std::source_location::current()) {
  return normalized(x, p.ln_scale, p.ln_bias, c.layer_norm_eps, c, where);
}

// The output bias as added to x. Deterministic sequence or context parallelism: this device's block of seq
// of the bias broadcast over every row (batch cut as x's), so its gradient is gathered along seq by
// the slice's transpose (a psum of blocks that do not overlap: exact) and summed over whole rows.
inline nax::Tensor output_bias(const BlockParams& p, const nax::Tensor& x, const BlockConfig& c) {
  using namespace nax;
  if (!rows_whole(c)) return p.mlp_out_bias;
  const std::string cut = seq_cut(c);
  VaryType rows = x.vary();  // the batch as x's; the whole sequence on every device of the cut
  rows.set_invariant(cut);
  const Shape whole{{"batch", x.size("batch")}, {"seq", x.size("seq") * axis_size(cut)}, {"embed", x.size("embed")}};
  return own_block(zeros(whole, x.dtype()).with_vary(rows) + p.mlp_out_bias, cut, "seq");
}

// Sequence parallelism's transfers overlapped with compute, as Megatron-LM's tp-comm-overlap does
// by chunking: the batch in pieces, every piece's LayerNorm output gathered at once, then each
// piece's projections run while the next pieces' gathers are in flight and its reduce-scatter is
// started as soon as its partial sum is made, under the next piece's projections. The backward
// (latest op first) starts each piece's transposed transfers the same way, under the other pieces'
// backward. The same bytes as the whole block; only the first gather and the last reduce-scatter
// (in the backward, their transposes) wait in the open. Rows never mix across the batch, so the
// pieces' results are the whole block's.
inline bool overlapped(const nax::Tensor& x, const BlockConfig& c, const KVCache* cache) {
  return c.sequence_parallel && !c.deterministic && !c.context_parallel && cache == nullptr && c.overlap_pieces > 1 &&
         x.size("batch") >= 2;
}

inline nax::Tensor overlapped_block(const BlockParams& p, const nax::Tensor& x, const BlockConfig& c) {
  using namespace nax;
  const std::int64_t batch = x.size("batch"), n = std::min(c.overlap_pieces, batch);
  std::vector<Pending<Tensor>> gathers, sums;
  for (std::int64_t i = 0; i < n; ++i)
    gathers.push_back(start_all_gather(layer_norm(slice(x, "batch", batch * i / n, batch * (i + 1) / n), "embed", p.ln_scale, p.ln_bias,
                                                  c.layer_norm_eps),
                                       "mp", "seq"));
  for (Pending<Tensor>& gathered : gathers) {
    const Tensor h = gathered.wait();
    sums.push_back(start_psum_scatter(attention(p, h, c) + mlp(p, h), "mp", "seq"));
  }
  std::vector<Tensor> mixed;
  for (Pending<Tensor>& sum : sums) mixed.push_back(sum.wait());
  return x + concat(mixed, "batch") + p.mlp_out_bias;
}

// x: [batch, seq, embed], Invariant over mp ([batch, seq|mp, embed] with c.sequence_parallel).
// The bias is added after the sum: once, not once per device. (Two statements: the attention and
// MLP outputs and their sum go at the first one's end, before the residual's values are made.)
inline nax::Tensor block(const BlockParams& whole, const nax::Tensor& x, const BlockConfig& c, KVCache* cache = nullptr) {
  if (overlapped(x, c, cache)) return overlapped_block(whole, x, c);
  const BlockParams p = context_gathered(c) ? heads_over_cp(whole) : whole;
  const nax::Tensor h = normalized(p, x, c);
  const nax::Tensor mixed = sum_over_mp(attention(p, h, c, cache) + mlp(p, h), c);
  return x + mixed + output_bias(p, x, c);
}

// Megatron-LM's layout: sequential residual, a psum after attention and another after the MLP
// (the same parameters; the one LayerNorm is applied before each half).
inline nax::Tensor megatron_block(const BlockParams& whole, const nax::Tensor& x, const BlockConfig& c, KVCache* = nullptr) {
  const BlockParams p = context_gathered(c) ? heads_over_cp(whole) : whole;
  const nax::Tensor a = x + sum_over_mp(attention(p, normalized(p, x, c), c), c);
  return a + sum_over_mp(mlp(p, normalized(p, a, c)), c) + output_bias(p, a, c);
}

}  // namespace gptj
