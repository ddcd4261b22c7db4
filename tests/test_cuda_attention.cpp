// The CUDA fused causal attention (src/kernels/cuda/attention.h) against the CPU kernels
// (src/kernels/cpu/attention.h) run in f64 on the same inputs: out, lse, dq, dk and dv, f32 and
// bf16, for several (batches, tq, tk, head_dim) including tq < tk, tq = 1, sizes that are not
// multiples of the tiles, head_dim 8 to 256, and batches laid out contiguously, as heads
// interleaved in rows, with odd row strides (the scalar load path) and in an order no affine
// formula gives (the offsets-table path, over several launches). Inputs hold NaN between the
// matrices and outputs start as NaN everywhere: a read or a write outside the matrices, or an
// element never written, fails the comparison. Without a GPU the program prints one line and
// exits 77, which CTest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "comparison.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/check.h"
#include "nax/core/dtype.h"
#include "nax/core/error.h"

namespace {

using nax::DType;

constexpr unsigned char kPoison = 0xff;  // every byte: NaN as f32 and as bf16

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    NAX_CUDA_CHECK(cudaMalloc(&ptr_, std::max<std::size_t>(bytes, 16)));
    NAX_CUDA_CHECK(cudaMemset(ptr_, kPoison, std::max<std::size_t>(bytes, 16)));
  }
  ~DeviceBuffer() { (void)cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  void upload(const std::vector<unsigned char>& host) {
    REQUIRE(host.size() == bytes_);
    NAX_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice));
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> host(bytes_);
    NAX_CUDA_CHECK(cudaDeviceSynchronize());
    NAX_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

// How the batches' matrices sit in one allocation.
enum class Layout {
  contiguous,   // [batches, rows, head_dim]
  interleaved,  // [batches / heads, rows, heads, head_dim]: rows heads * head_dim apart
  odd_stride,   // rows head_dim + 3 apart, each matrix starting one element in: scalar loads
  shuffled,     // contiguous blocks in a random order: no affine formula, the offsets table
};

struct Case {
  DType dtype;
  std::int64_t batches, tq, tk, head_dim;
  Layout layout = Layout::contiguous;
  std::optional<std::int64_t> query_offset = {};  // tk - tq unless given: the causal layout
  bool with_dlse = false;                          // the backward also gets a gradient of lse
  std::int64_t offset() const { return query_offset.value_or(tk - tq); }
};

std::string describe(const Case& c) {
  const char* layouts[] = {"contiguous", "interleaved", "odd_stride", "shuffled"};
  return std::string(nax::dtype_name(c.dtype)) + " batches " + std::to_string(c.batches) + " tq " + std::to_string(c.tq) + " tk " +
         std::to_string(c.tk) + " head_dim " + std::to_string(c.head_dim) + " " + layouts[static_cast<int>(c.layout)] + " query_offset " +
         std::to_string(c.offset()) + (c.with_dlse ? " with dlse" : "");
}

struct Placement {
  std::vector<std::int64_t> offsets;
  std::int64_t row_stride = 0;
  std::int64_t elements = 0;  // of the allocation
};

Placement place(const Case& c, std::int64_t rows, std::mt19937_64& rng) {
  Placement p;
  const std::int64_t d = c.head_dim;
  switch (c.layout) {
    case Layout::contiguous:
      p.row_stride = d;
      for (std::int64_t b = 0; b < c.batches; ++b) p.offsets.push_back(b * rows * d);
      p.elements = c.batches * rows * d;
      break;
    case Layout::interleaved: {
      std::int64_t heads = 1;
      for (std::int64_t h = 4; h > 1; --h)
        if (c.batches % h == 0) {
          heads = h;
          break;
        }
      p.row_stride = heads * d;
      for (std::int64_t b = 0; b < c.batches; ++b) p.offsets.push_back((b / heads) * rows * heads * d + (b % heads) * d);
      p.elements = c.batches * rows * d;
      break;
    }
    case Layout::odd_stride:
      p.row_stride = d + 3;
      for (std::int64_t b = 0; b < c.batches; ++b) p.offsets.push_back(1 + b * rows * p.row_stride);
      p.elements = 1 + c.batches * rows * p.row_stride;
      break;
    case Layout::shuffled: {
      std::vector<std::int64_t> order(static_cast<std::size_t>(c.batches));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      p.row_stride = d;
      for (std::int64_t b = 0; b < c.batches; ++b) p.offsets.push_back(order[static_cast<std::size_t>(b)] * rows * d);
      p.elements = c.batches * rows * d;
      break;
    }
  }
  return p;
}

// Positions of the matrices' elements in the allocation, batch by batch, row-major.
std::vector<std::int64_t> positions(const Placement& p, std::int64_t batches, std::int64_t rows, std::int64_t head_dim) {
  std::vector<std::int64_t> out;
  for (std::int64_t b = 0; b < batches; ++b)
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < head_dim; ++j) out.push_back(p.offsets[static_cast<std::size_t>(b)] + r * p.row_stride + j);
  return out;
}

double round_to(DType dtype, double x) {
  if (dtype == DType::bf16) return static_cast<float>(nax::bf16(static_cast<float>(x)));
  return static_cast<float>(x);
}

std::vector<unsigned char> encode(DType dtype, const std::vector<double>& values) {
  std::vector<unsigned char> bytes(values.size() * nax::dtype_size(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::bf16) {
      const nax::bf16 x(static_cast<float>(values[i]));
      std::memcpy(bytes.data() + 2 * i, &x.bits, 2);
    } else {
      const float x = static_cast<float>(values[i]);
      std::memcpy(bytes.data() + 4 * i, &x, 4);
    }
  }
  return bytes;
}

std::vector<double> decode(DType dtype, const std::vector<unsigned char>& bytes) {
  const std::size_t n = bytes.size() / nax::dtype_size(dtype);
  std::vector<double> values(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (dtype == DType::bf16) {
      nax::bf16 x;
      std::memcpy(&x.bits, bytes.data() + 2 * i, 2);
      values[i] = static_cast<float>(x);
    } else {
      float x;
      std::memcpy(&x, bytes.data() + 4 * i, 4);
      values[i] = x;
    }
  }
  return values;
}

// An operand: its placement, f64 values (the matrices' elements, NaN in between) and buffer.
struct Operand {
  Placement placement;
  std::vector<std::int64_t> where;
  std::vector<double> values;
  std::int64_t rows = 0;
};

Operand make_operand(const Case& c, std::int64_t rows, std::mt19937_64& rng, bool random) {
  Operand o;
  o.rows = rows;
  o.placement = place(c, rows, rng);
  o.where = positions(o.placement, c.batches, rows, c.head_dim);
  o.values.assign(static_cast<std::size_t>(o.placement.elements), std::numeric_limits<double>::quiet_NaN());
  std::normal_distribution<double> normal(0.0, 1.0);
  for (std::int64_t at : o.where) o.values[static_cast<std::size_t>(at)] = random ? round_to(c.dtype, normal(rng)) : 0.0;
  return o;
}

nax::cpu::InMatrices cpu_in(const Operand& o) { return {o.values.data(), o.placement.offsets.data(), o.placement.row_stride}; }
nax::cpu::OutMatrices cpu_out(Operand& o) { return {o.values.data(), o.placement.offsets.data(), o.placement.row_stride}; }
nax::kernels::InMatrices cuda_in(const Operand& o, const DeviceBuffer& buffer) {
  return {buffer.get(), o.placement.offsets.data(), o.placement.row_stride};
}
nax::kernels::OutMatrices cuda_out(const Operand& o, DeviceBuffer& buffer) {
  return {buffer.get(), o.placement.offsets.data(), o.placement.row_stride};
}

std::size_t bytes_of(const Case& c, const Operand& o) { return o.values.size() * nax::dtype_size(c.dtype); }

// Elements of an output allocation outside its matrices must still hold the poison.
bool untouched_outside(const std::vector<unsigned char>& bytes, const Operand& o, std::size_t element) {
  std::vector<char> inside(o.values.size(), 0);
  for (std::int64_t at : o.where) inside[static_cast<std::size_t>(at)] = 1;
  for (std::size_t i = 0; i < inside.size(); ++i)
    if (!inside[i])
      for (std::size_t byte = 0; byte < element; ++byte)
        if (bytes[i * element + byte] != kPoison) return false;
  return true;
}

std::vector<std::int64_t> all_of(std::size_t n) {
  std::vector<std::int64_t> out(n);
  std::iota(out.begin(), out.end(), 0);
  return out;
}

void run_case(const Case& c) {
  INFO(describe(c));
  std::mt19937_64 rng(0x5eed + static_cast<std::uint64_t>(c.batches * 1000003 + c.tq * 1009 + c.tk * 31 + c.head_dim) +
                      static_cast<std::uint64_t>(c.layout) * 7 + (c.dtype == DType::bf16 ? 11 : 0));
  const double scale = 1.0 / std::sqrt(static_cast<double>(std::max<std::int64_t>(c.head_dim, 1)));
  // Element-wise, from the dtype and the longest sum (keys for out and dq, queries for dk and dv),
  // with 4x headroom in the sum's bound for the exponentials and the online softmax's rescalings.
  const double tolerance = nax::testing::accumulated_tolerance(c.dtype, 16 * std::max(c.tq, c.tk));
  const double lse_tolerance = nax::testing::accumulated_tolerance(DType::f32, 16 * c.tk);
  using nax::testing::check_close_scaled;
  const std::size_t element = nax::dtype_size(c.dtype);

  Operand q = make_operand(c, c.tq, rng, true), k = make_operand(c, c.tk, rng, true), v = make_operand(c, c.tk, rng, true);
  Operand dout = make_operand(c, c.tq, rng, true);
  Operand out = make_operand(c, c.tq, rng, false);
  Operand dq = make_operand(c, c.tq, rng, false), dk = make_operand(c, c.tk, rng, false), dv = make_operand(c, c.tk, rng, false);

  // The reference, f64 on the same (dtype-rounded) inputs.
  nax::cpu::AttentionSizes cs;
  cs.dtype = DType::f64;
  cs.batches = c.batches;
  cs.tq = c.tq;
  cs.tk = c.tk;
  cs.head_dim = c.head_dim;
  cs.query_offset = c.offset();
  cs.scale = scale;
  cs.block_rows = 16;
  std::vector<double> lse_ref(static_cast<std::size_t>(c.batches * c.tq));
  std::vector<double> scratch(static_cast<std::size_t>(
      std::max(nax::cpu::attention_forward_scratch(cs), nax::cpu::attention_backward_scratch(cs)) + 1));
  nax::cpu::causal_attention_forward(cs, cpu_in(q), cpu_in(k), cpu_in(v), cpu_out(out), lse_ref.data(), scratch.data());
  // The backward's inputs as the device sees them: out rounded to the dtype, lse in f32.
  const std::vector<double> out_ref = out.values;
  for (std::int64_t at : out.where) out.values[static_cast<std::size_t>(at)] = round_to(c.dtype, out.values[static_cast<std::size_t>(at)]);
  std::vector<double> lse_f32(lse_ref.size());
  for (std::size_t i = 0; i < lse_ref.size(); ++i) lse_f32[i] = static_cast<float>(lse_ref[i]);
  std::vector<double> dlse(c.with_dlse ? lse_ref.size() : 0);
  std::normal_distribution<double> normal;
  for (double& x : dlse) x = static_cast<float>(normal(rng));
  const double* dlse_ref = c.with_dlse ? dlse.data() : nullptr;
  nax::cpu::causal_attention_backward(cs, cpu_in(q), cpu_in(k), cpu_in(v), cpu_in(out), cpu_in(dout), lse_f32.data(), dlse_ref, cpu_out(dq),
                                      cpu_out(dk), cpu_out(dv), scratch.data());

  nax::kernels::AttentionSizes ks;
  ks.dtype = c.dtype;
  ks.batches = c.batches;
  ks.tq = c.tq;
  ks.tk = c.tk;
  ks.head_dim = c.head_dim;
  ks.query_offset = c.offset();
  ks.scale = scale;

  DeviceBuffer q_d(bytes_of(c, q)), k_d(bytes_of(c, k)), v_d(bytes_of(c, v)), dout_d(bytes_of(c, dout));
  q_d.upload(encode(c.dtype, q.values));
  k_d.upload(encode(c.dtype, k.values));
  v_d.upload(encode(c.dtype, v.values));
  dout_d.upload(encode(c.dtype, dout.values));

  // Forward.
  {
    DeviceBuffer out_d(bytes_of(c, out)), lse_d(lse_ref.size() * sizeof(float));
    DeviceBuffer scratch_d(static_cast<std::size_t>(nax::cuda::attention_forward_scratch(ks)) * element);
    nax::cuda::attention_forward(nullptr, ks, cuda_in(q, q_d), cuda_in(k, k_d), cuda_in(v, v_d), cuda_out(out, out_d), lse_d.get(),
                                 scratch_d.get());
    NAX_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<unsigned char> out_bytes = out_d.download();
    check_close_scaled(decode(c.dtype, out_bytes), out_ref, tolerance, "forward out", &out.where);
    const auto lse_where = all_of(lse_ref.size());
    check_close_scaled(decode(DType::f32, lse_d.download()), lse_ref, lse_tolerance, "forward lse", &lse_where);
    CHECK(untouched_outside(out_bytes, out, element));
  }

  // Backward, from the reference's out and lse.
  {
    DeviceBuffer out_d(bytes_of(c, out)), lse_d(lse_f32.size() * sizeof(float)), dlse_d(std::max<std::size_t>(dlse.size(), 1) * sizeof(float));
    out_d.upload(encode(c.dtype, out.values));
    lse_d.upload(encode(DType::f32, lse_f32));
    if (c.with_dlse) dlse_d.upload(encode(DType::f32, dlse));
    DeviceBuffer dq_d(bytes_of(c, dq)), dk_d(bytes_of(c, dk)), dv_d(bytes_of(c, dv));
    DeviceBuffer scratch_d(static_cast<std::size_t>(nax::cuda::attention_backward_scratch(ks)) * element);
    nax::cuda::attention_backward(nullptr, ks, cuda_in(q, q_d), cuda_in(k, k_d), cuda_in(v, v_d), cuda_in(out, out_d),
                                  cuda_in(dout, dout_d), lse_d.get(), c.with_dlse ? dlse_d.get() : nullptr, cuda_out(dq, dq_d), cuda_out(dk, dk_d), cuda_out(dv, dv_d),
                                  scratch_d.get());
    NAX_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<unsigned char> dq_bytes = dq_d.download(), dk_bytes = dk_d.download(), dv_bytes = dv_d.download();
    check_close_scaled(decode(c.dtype, dq_bytes), dq.values, tolerance, "backward dq", &dq.where);
    check_close_scaled(decode(c.dtype, dk_bytes), dk.values, tolerance, "backward dk", &dk.where);
    check_close_scaled(decode(c.dtype, dv_bytes), dv.values, tolerance, "backward dv", &dv.where);
    CHECK(untouched_outside(dq_bytes, dq, element));
    CHECK(untouched_outside(dk_bytes, dk, element));
    CHECK(untouched_outside(dv_bytes, dv, element));
  }
}

std::vector<Case> cases_for(DType dtype) {
  return {
      {dtype, 2, 64, 64, 64},                            // one tile
      {dtype, 2, 200, 200, 128},                         // several tiles each way, dk/dv in two chunks
      {dtype, 3, 70, 130, 80, Layout::interleaved},      // tq < tk, odd sizes, head_dim padded to 128
      {dtype, 4, 1, 37, 64},                             // decoding: one query
      {dtype, 1, 130, 300, 64, Layout::interleaved},     // long key prefix
      {dtype, 2, 33, 45, 256},                           // GPT-J 6B's head_dim
      {dtype, 2, 45, 45, 20, Layout::odd_stride},        // scalar loads, head_dim not a multiple of 8
      {dtype, 3, 19, 19, 8},                             // tiny head_dim
      {dtype, 40, 9, 17, 64, Layout::shuffled},          // offsets table, two launch groups
      {dtype, 5, 66, 66, 96, Layout::shuffled},          // offsets table, one group
      {dtype, 2, 0, 5, 64},                              // no queries: dk = dv = 0
      {dtype, 2, 70, 70, 64, Layout::contiguous, 0, true},          // attention_block's own block, lse with a gradient
      {dtype, 2, 70, 50, 64, Layout::interleaved, 140, true},       // keys from before the queries: all seen (full mask)
      {dtype, 3, 64, 64, 128, Layout::contiguous, -20},             // keys partly after the queries: the first rows see none
      {dtype, 2, 40, 96, 64, Layout::shuffled, -64, true},          // a block of keys wholly after the queries: out 0, lse -inf
      {dtype, 2, 90, 30, 80, Layout::interleaved, 45},              // more queries than keys (tq > tk)
  };
}

}  // namespace

TEST_CASE("cuda attention: f32 against the f64 CPU kernels", "[cuda][attention]") {
  for (const Case& c : cases_for(DType::f32)) run_case(c);
}

TEST_CASE("cuda attention: bf16 against the f64 CPU kernels", "[cuda][attention]") {
  for (const Case& c : cases_for(DType::bf16)) run_case(c);
}

TEST_CASE("cuda attention: refuses other dtypes and too large head_dim", "[cuda][attention]") {
  nax::kernels::AttentionSizes s;
  s.dtype = DType::f64;
  s.batches = 1;
  s.tq = s.tk = 4;
  s.head_dim = 64;
  const std::int64_t offsets[1] = {0};
  const nax::kernels::InMatrices in{nullptr, offsets, 64};
  const nax::kernels::OutMatrices out{nullptr, offsets, 64};
  REQUIRE_THROWS_WITH(nax::cuda::attention_forward(nullptr, s, in, in, in, out, nullptr, nullptr), Catch::Contains("f64"));
  REQUIRE_THROWS_WITH(nax::cuda::attention_backward(nullptr, s, in, in, in, in, in, nullptr, nullptr, out, out, out, nullptr),
                      Catch::Contains("f64"));
  s.dtype = DType::bf16;
  s.head_dim = 300;
  REQUIRE_THROWS_WITH(nax::cuda::attention_forward(nullptr, s, in, in, in, out, nullptr, nullptr), Catch::Contains("head_dim"));
}

int main(int argc, char** argv) {
  if (nax::cuda::cuda_device_count() == 0) {
    std::puts("no CUDA device: skipping the cuda attention tests");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
