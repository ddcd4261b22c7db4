// The CUDA attention's entry points: checks, the scratch layout, and the batches' offsets carried
// to the kernels by value (no copy to the device, no wait). The kernels: attention_forward.cuh,
// attention_backward.cuh and attention_deterministic_dq.cuh, launched by attention.cu.
//
// Offsets. Each operand's `offsets` (host memory, possibly freed when the call returns) is fitted
// to base + (b % inner) * inner_stride + (b / inner) * outer_stride, which every [.., heads]
// batch of a strided tensor is; when all operands fit, four numbers per operand travel in the
// kernel parameters and one launch covers all batches. Otherwise the offsets themselves travel
// in the parameters, kTableBatches batches per launch (several launches, still no copy and no
// synchronisation).
//
// Backward scratch (bytes, from `scratch` rounded up to 256): delta = rowsum(dout * out), one f32
// per row ([batches x tq], padded to 256 bytes), then dq_accum, [batches x tq x dq_stride] f32
// with dq_stride = head_dim rounded up to 8.
#include "kernels/cuda/attention.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include "kernels/cuda/attention_launch.h"
#include "nax/core/dtype.h"
#include "nax/core/error.h"

namespace nax::cuda {

namespace {

namespace ad = attention_detail;
using kernels::AttentionSizes;

void check_sizes(const AttentionSizes& s) {
  if (s.dtype != DType::f32 && s.dtype != DType::bf16)
    fail("attention", "the CUDA kernels compute f32 and bf16, not {}", dtype_name(s.dtype));
  if (s.batches < 0 || s.tq < 0 || s.tk < 0 || s.head_dim < 0)
    fail("attention", "bad sizes: batches {} tq {} tk {} head_dim {}", s.batches, s.tq, s.tk, s.head_dim);
  if (s.head_dim > ad::kMaxHeadDim)
    fail("attention", "head_dim {} is more than the CUDA kernels take ({})", s.head_dim, ad::kMaxHeadDim);
  if (s.tk > INT_MAX / 4 || s.tq > INT_MAX / 4) fail("attention", "{} queries and {} keys are more than the CUDA kernels take", s.tq, s.tk);
}

struct Operand {
  ad::Operand index;
  const void* data;
  const std::int64_t* offsets;
  std::int64_t row_stride;
  bool loaded;  // read as 16-byte tiles: decides the vector path
};

struct Affine {
  bool ok = false;
  std::int64_t base = 0, inner = 1, inner_stride = 0, outer_stride = 0;
};

// offsets[b] = base + (b % inner) * inner_stride + (b / inner) * outer_stride for every b?
Affine fit(const std::int64_t* offsets, std::int64_t n) {
  Affine a;
  a.base = offsets[0];
  if (n == 1) {
    a.ok = true;
    return a;
  }
  a.inner_stride = offsets[1] - offsets[0];
  a.inner = n;
  for (std::int64_t b = 2; b < n; ++b)
    if (offsets[b] != a.base + b * a.inner_stride) {
      a.inner = b;
      break;
    }
  if (a.inner < n) a.outer_stride = offsets[a.inner] - a.base;
  for (std::int64_t b = 0; b < n; ++b)
    if (offsets[b] != a.base + (b % a.inner) * a.inner_stride + (b / a.inner) * a.outer_stride) return a;
  a.ok = true;
  return a;
}

// Whether the loaded operands' rows can be read 16 bytes at a time.
bool vector_ok(const AttentionSizes& s, const std::vector<Operand>& operands) {
  const std::int64_t per = 16 / static_cast<std::int64_t>(dtype_size(s.dtype));
  if (s.head_dim % per != 0) return false;
  for (const Operand& o : operands) {
    if (!o.loaded) continue;
    if (reinterpret_cast<std::uintptr_t>(o.data) % 16 != 0 || o.row_stride % per != 0) return false;
    for (std::int64_t b = 0; b < s.batches; ++b)
      if (o.offsets[b] % per != 0) return false;
  }
  return true;
}

ad::Params base_params(const AttentionSizes& s, const std::vector<Operand>& operands) {
  ad::Params p;
  p.tq = static_cast<int>(s.tq);
  p.tk = static_cast<int>(s.tk);
  // Offsets beyond these see every key or none: clamped, the positions stay within int.
  p.shift = static_cast<int>(std::clamp<std::int64_t>(s.query_offset, -s.tq - 1, s.tk));
  p.head_dim = static_cast<int>(s.head_dim);
  p.scale = static_cast<float>(s.scale);
  p.scale_log2 = static_cast<float>(s.scale * 1.4426950408889634);
  p.vector = vector_ok(s, operands) ? 1 : 0;
  for (int op = 0; op < ad::kOperands; ++op) p.map.inner[op] = 1;
  for (const Operand& o : operands) p.stride[o.index] = o.row_stride;
  return p;
}

// Calls launch(params) for groups of batches covering all of them, the offsets set for each:
// one group when every operand's offsets fit the affine form (unless the grid would overflow),
// else groups of kTableBatches with the offsets tabulated. `blocks_per_batch`: the largest grid
// of the launch's kernels per batch.
template <typename Launch>
void for_batch_groups(const AttentionSizes& s, ad::Params p, const std::vector<Operand>& operands, std::int64_t blocks_per_batch,
                      Launch launch) {
  bool affine = true;
  for (const Operand& o : operands) {
    const Affine a = fit(o.offsets, s.batches);
    if (!a.ok) {
      affine = false;
      break;
    }
    p.map.base[o.index] = a.base;
    p.map.inner[o.index] = a.inner;
    p.map.inner_stride[o.index] = a.inner_stride;
    p.map.outer_stride[o.index] = a.outer_stride;
  }
  std::int64_t group = affine ? s.batches : ad::kTableBatches;
  group = std::min(group, std::max<std::int64_t>(1, INT_MAX / std::max<std::int64_t>(1, blocks_per_batch)));
  if (blocks_per_batch > INT_MAX) fail("attention", "sizes too large for one grid: tq {} tk {}", s.tq, s.tk);
  p.map.table = affine ? 0 : 1;
  for (std::int64_t first = 0; first < s.batches; first += group) {
    const std::int64_t count = std::min(group, s.batches - first);
    p.batch_begin = first;
    p.batches = static_cast<int>(count);
    if (!affine)
      for (const Operand& o : operands)
        for (std::int64_t i = 0; i < count; ++i) p.map.offsets[o.index][i] = o.offsets[first + i];
    launch(p);
  }
}


std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::int64_t attention_forward_scratch(const AttentionSizes&) { return 0; }

std::int64_t attention_backward_scratch(const AttentionSizes& s) {
  const auto bytes = static_cast<std::int64_t>(ad::backward_scratch_bytes(s.batches, s.tq, s.head_dim));
  const auto element = static_cast<std::int64_t>(std::max<std::size_t>(1, dtype_size(s.dtype)));
  return ceil_div(bytes, element);
}

void attention_forward(cudaStream_t stream, const AttentionSizes& s, const kernels::InMatrices& q, const kernels::InMatrices& k,
                       const kernels::InMatrices& v, const kernels::OutMatrices& out, void* lse, void* /*scratch*/) {
  check_sizes(s);
  if (s.batches == 0 || s.tq == 0) return;
  if (s.tk == 0) fail("attention", "no keys: the op layer writes the results of tk = 0");
  const std::vector<Operand> operands{{ad::kQ, q.data, q.offsets, q.row_stride, true},
                                      {ad::kK, k.data, k.offsets, k.row_stride, true},
                                      {ad::kV, v.data, v.offsets, v.row_stride, true},
                                      {ad::kO, out.data, out.offsets, out.row_stride, false}};
  ad::Params p = base_params(s, operands);
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.out = out.data;
  p.lse = static_cast<float*>(lse);
  const bool bf16 = s.dtype == DType::bf16;
  // Query tiles have at least 32 rows: a bound on the blocks per batch.
  const std::int64_t blocks = ceil_div(s.tq, 32);
  for_batch_groups(s, p, operands, blocks, [&](const ad::Params& group) { ad::launch_forward(stream, bf16, group); });
}

void attention_backward(cudaStream_t stream, const AttentionSizes& s, const kernels::InMatrices& q, const kernels::InMatrices& k,
                        const kernels::InMatrices& v, const kernels::InMatrices& out, const kernels::InMatrices& dout,
                        const void* lse, const void* dlse, const kernels::OutMatrices& dq, const kernels::OutMatrices& dk,
                        const kernels::OutMatrices& dv, void* scratch) {
  check_sizes(s);
  if (s.batches == 0) return;  // tq == 0 < tk still writes dk = dv = 0
  if (s.tk == 0) fail("attention", "no keys: the op layer writes the results of tk = 0");
  if (scratch == nullptr && s.tq > 0)
    fail("attention", "the backward needs {} elements of scratch, got none", attention_backward_scratch(s));
  const std::vector<Operand> operands{{ad::kQ, q.data, q.offsets, q.row_stride, true},
                                      {ad::kK, k.data, k.offsets, k.row_stride, true},
                                      {ad::kV, v.data, v.offsets, v.row_stride, true},
                                      {ad::kO, out.data, out.offsets, out.row_stride, false},
                                      {ad::kDout, dout.data, dout.offsets, dout.row_stride, true},
                                      {ad::kDq, dq.data, dq.offsets, dq.row_stride, false},
                                      {ad::kDk, dk.data, dk.offsets, dk.row_stride, false},
                                      {ad::kDv, dv.data, dv.offsets, dv.row_stride, false}};
  ad::Params p = base_params(s, operands);
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = out.data;
  p.dout = dout.data;
  p.dq = dq.data;
  p.dk = dk.data;
  p.dv = dv.data;
  p.lse = const_cast<float*>(static_cast<const float*>(lse));  // read only by the backward
  p.dlse = static_cast<const float*>(dlse);

  // Scratch: delta, then dq_accum (see the top of the file).
  const auto address = reinterpret_cast<std::uintptr_t>(scratch);
  char* base = reinterpret_cast<char*>((address + 255) / 256 * 256);
  const std::size_t rows = static_cast<std::size_t>(s.batches) * static_cast<std::size_t>(s.tq);
  p.delta = reinterpret_cast<float*>(base);
  p.dq_accum = reinterpret_cast<float*>(base + (rows * sizeof(float) + 255) / 256 * 256);
  p.dq_stride = ad::dq_accum_stride(s.head_dim);

  const bool bf16 = s.dtype == DType::bf16;
  p.deterministic = s.tree.on ? 1 : 0;
  // Key and query tiles have at least 32 rows and head_dim chunks 64 columns; row kernels take 8
  // rows a block.
  const std::int64_t blocks = std::max(ceil_div(s.tk, 32) * std::max<std::int64_t>(1, ceil_div(s.head_dim, 64)), ceil_div(s.tq, 8));
  for_batch_groups(s, p, operands, blocks, [&](const ad::Params& group) {
    ad::launch_backward_delta(stream, bf16, group);
    ad::launch_backward_main(stream, bf16, group);
    if (group.deterministic) ad::launch_backward_dq_deterministic(stream, bf16, group);
    else ad::launch_backward_dq(stream, bf16, group);
  });
}

}  // namespace nax::cuda
