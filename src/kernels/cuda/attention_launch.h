#pragma once
// Internal to the CUDA attention (attention.cpp, attention.cu and the kernels' attention_*.cuh):
// the kernel parameter block and the launchers. Plain C++17 and no fmt, so that nvcc compiles
// it; the public entry points and their checks are in attention.h / attention.cpp.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace nax::cuda::attention_detail {

// The operands, as indices into the per-operand arrays below. The forward writes kO; the
// backward reads it.
enum Operand : int { kQ = 0, kK, kV, kO, kDout, kDq, kDk, kDv, kOperands };

// Largest head_dim the kernels take (padded inside to 64, 128 or 256).
constexpr std::int64_t kMaxHeadDim = 256;

// Batches whose offsets travel in an explicit table: a launch covers at most this many (the
// parameter block stays under the 4 KiB classic kernel-parameter limit).
constexpr int kTableBatches = 32;

// Where operand `op`'s matrix of batch b starts (elements from its data pointer). Offsets lists
// that are a two-level affine pattern, base + (b % inner) * inner_stride + (b / inner) * outer_stride
// (any [.., heads]-style batch of a strided tensor), go by value and one launch covers every
// batch; any other list goes as a table of kTableBatches entries per launch.
struct BatchMap {
  int table = 0;
  std::int64_t base[kOperands] = {};
  std::int64_t inner[kOperands] = {};
  std::int64_t inner_stride[kOperands] = {};
  std::int64_t outer_stride[kOperands] = {};
  std::int64_t offsets[kOperands][kTableBatches] = {};
};

struct Params {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;     // backward: the forward's output
  const void* dout = nullptr;  // backward
  void* out = nullptr;         // forward
  void* dq = nullptr;          // backward outputs
  void* dk = nullptr;
  void* dv = nullptr;
  std::int64_t stride[kOperands] = {};  // row strides, elements
  float* lse = nullptr;                 // [batches x tq], all batches (indexed by the global batch)
  const float* dlse = nullptr;          // backward: the gradient of lse, or null
  float* delta = nullptr;               // backward scratch: rowsum(dout * o), [batches x tq]
  float* dq_accum = nullptr;            // backward scratch: dq in f32, [batches x tq x dq_stride]
  std::int64_t dq_stride = 0;
  std::int64_t batch_begin = 0;  // global index of this launch's first batch
  int batches = 0;               // batches in this launch
  int tq = 0, tk = 0, head_dim = 0;
  int shift = 0;            // query i sits at key position i + shift
  float scale = 1.0f;       // the scores' scale
  float scale_log2 = 1.0f;  // scale * log2(e): the kernels work in base 2
  int vector = 0;           // 1: q, k, v (and dout) rows allow 16-byte loads
  int deterministic = 0;    // 1: dq by launch_backward_dq_deterministic, no atomics
  BatchMap map;
};

// Scratch of the backward, bytes: 256 of alignment slack, delta, then dq_accum.
std::int64_t dq_accum_stride(std::int64_t head_dim);
std::size_t backward_scratch_bytes(std::int64_t batches, std::int64_t tq, std::int64_t head_dim);

// Each launches on `stream` the kernels of one launch group (p.batches batches from p.batch_begin)
// and checks the launches. bf16: the operands are __nv_bfloat16, else float.
void launch_forward(cudaStream_t stream, bool bf16, const Params& p);
// delta = rowsum(dout * o) per row, and dq_accum zeroed.
void launch_backward_delta(cudaStream_t stream, bool bf16, const Params& p);
// dk, dv written, dq accumulated into p.dq_accum (after launch_backward_delta).
void launch_backward_main(cudaStream_t stream, bool bf16, const Params& p);
// dq = dq_accum in the operands' dtype.
void launch_backward_dq(cudaStream_t stream, bool bf16, const Params& p);
// Deterministic mode (p.deterministic): dq computed per query tile, key tiles in order (after
// launch_backward_delta), in place of launch_backward_dq.
void launch_backward_dq_deterministic(cudaStream_t stream, bool bf16, const Params& p);

}  // namespace nax::cuda::attention_detail
