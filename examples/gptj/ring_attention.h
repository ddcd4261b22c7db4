#pragma once
// Context parallelism over `cp` (ring attention) as per-shard code. The sequence is cut into
// 2 cp chunks and device r holds chunks r and 2 cp - 1 - r (zigzag: under the causal mask every
// device then does the same share of the work). The keys and values travel around the ring with
// started ppermutes while each device attends to the block in hand (attention_block, the mask
// placing it), and the results join by their log-sum-exps (combine_attention).
#include <nax/nax.h>

#include <array>
#include <utility>
#include <vector>

namespace gptj {

// The two chunks of the sequence a device holds, `length` positions each.
struct Chunks {
  std::int64_t length = 0;
  std::array<std::int64_t, 2> index{};  // chunk numbers, of 2 cp, in the order held

  // The device's [2 length] block of seq as its two chunks.
  std::array<nax::Tensor, 2> halves(const nax::Tensor& x) const {
    return {nax::slice(x, "seq", 0, length), nax::slice(x, "seq", length, 2 * length)};
  }
};

inline Chunks zigzag_chunks(int device, int devices, std::int64_t held) { return {held / 2, {device, 2 * devices - 1 - device}}; }

// The global sequence in the order the cp devices hold it (device after device, each its two
// chunks): ids and targets alike, on the host, before they are cut along seq.
inline nax::Tensor zigzag_order(const nax::Tensor& tokens, int cp) {
  if (cp == 1) return tokens;
  const std::int64_t chunk = tokens.size("seq") / (2 * cp);
  std::vector<nax::Tensor> parts;
  for (int r = 0; r < cp; ++r)
    for (const std::int64_t c : zigzag_chunks(r, cp, 2 * chunk).index) parts.push_back(nax::slice(tokens, "seq", c * chunk, (c + 1) * chunk));
  return nax::concat(parts, "seq");
}

// The rotary embedding of each chunk at its own positions.
inline std::array<nax::Tensor, 2> rotary_chunks(const nax::Tensor& x, const Chunks& mine, std::int64_t rotary_dims) {
  std::array<nax::Tensor, 2> h = mine.halves(x);
  for (int i = 0; i < 2; ++i) h[i] = nax::rotary(h[i], "seq", "head_dim", rotary_dims, mine.index[i] * mine.length);
  return h;
}

// Causal attention of this device's queries (q: its two chunks) to the whole sequence's keys k and
// values v, of which each device holds its two chunks (one tensor each: they travel whole). A pair
// of chunks wholly after the queries is skipped, which leaves every received block used (its first
// chunk, from the first half of the sequence, comes before this device's second): a block some
// device left unused would keep that device out of the ppermute's transpose in the backward.
inline nax::Tensor ring_attention(const std::array<nax::Tensor, 2>& q, const nax::Tensor& k, const nax::Tensor& v, const Chunks& mine) {
  using namespace nax;
  const Shard& s = *Shard::current();
  const int n = s.mesh().axis_size("cp"), r = s.coord("cp");
  std::vector<std::pair<int, int>> next;
  for (int i = 0; i < n; ++i) next.push_back({i, (i + 1) % n});
  std::array<AttentionBlock, 2> total;
  Tensor k_block = k, v_block = v;
  for (int step = 0; step < n; ++step) {
    Pending<Tensor> k_next, v_next;
    if (step + 1 < n) k_next = start_ppermute(k_block, "cp", next), v_next = start_ppermute(v_block, "cp", next);
    const Chunks theirs = zigzag_chunks((r - step + n) % n, n, k_block.size("seq"));
    const auto keys = theirs.halves(k_block), values = theirs.halves(v_block);
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b) {
        if (theirs.index[b] > mine.index[a]) continue;
        const AttentionMask mask = theirs.index[b] == mine.index[a] ? AttentionMask::causal() : AttentionMask::full();
        const AttentionBlock part = attention_block(q[a], keys[b], values[b], "seq", "head_dim", mask);
        total[a] = total[a].out.defined() ? combine_attention(total[a], part) : part;
      }
    if (step + 1 < n) k_block = k_next.wait(), v_block = v_next.wait();
  }
  return concat({total[0].out, total[1].out}, "seq");
}

}  // namespace gptj
