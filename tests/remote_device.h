#pragma once
// A test double for a device whose memory the host cannot touch (as a GPU's): its "device
// addresses" are host addresses moved by 2^47, which no host code can dereference (they are not
// canonical x86-64 addresses: a stray read faults at once). Its kernels move them back and run
// the CPU kernels, so results must equal the CPU backend's bit for bit, and any op that reads
// device memory on the host instead of going through the device's kernels crashes.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "nax/kernels/kernels.h"
#include "nax/core/allocator.h"
#include "nax/kernels/device.h"

namespace nax::testing {

inline constexpr std::uintptr_t kRemoteShift = std::uintptr_t{1} << 47;

template <typename T>
T* local(T* remote) {
  if (remote == nullptr) return nullptr;
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(remote) - kRemoteShift);
}
template <typename T>
T* remote(T* local) {
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(local) + kRemoteShift);
}

class RemoteAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes) override { return remote(host_->allocate(bytes)); }
  void deallocate(void* ptr, std::size_t bytes) override { host_->deallocate(local(ptr), bytes); }
  AllocatorStats stats() const override { return host_->stats(); }
  void reset_peak() override { host_->reset_peak(); }
  void empty_cache() override { host_->empty_cache(); }

 private:
  std::shared_ptr<Allocator> host_ = make_caching_host_allocator();
};

class RemoteKernels : public kernels::Kernels {
 public:
  Backend backend() const override { return Backend::cpu; }
  bool host_accessible() const override { return false; }
  bool computes(DType dtype) const override { return cpu().computes(dtype); }

  void copy_from_host(void* dst, const void* src, std::size_t bytes) override { cpu().copy_bytes(local(dst), src, bytes); }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override { cpu().copy_bytes(dst, local(src), bytes); }
  void copy_bytes(void* dst, const void* src, std::size_t bytes) override { cpu().copy_bytes(local(dst), local(src), bytes); }
  void synchronize() override {}

  void binary(kernels::BinaryOp op, DType dtype, const void* a, const void* b, void* out, const kernels::Layout<3>& layout) override {
    cpu().binary(op, dtype, local(a), local(b), local(out), layout);
  }
  void unary(kernels::UnaryOp op, DType dtype, const void* in, void* out, std::int64_t n) override {
    cpu().unary(op, dtype, local(in), local(out), n);
  }
  void fill(DType dtype, void* out, std::int64_t n, double value) override { cpu().fill(dtype, local(out), n, value); }
  void copy(std::size_t element_size, const void* src, void* dst, const kernels::Layout<2>& layout) override {
    cpu().copy(element_size, local(src), local(dst), layout);
  }
  void convert(DType from, const void* src, DType to, void* dst, std::int64_t n) override {
    cpu().convert(from, local(src), to, local(dst), n);
  }
  void where(DType dtype, const void* cond, const void* a, const void* b, void* out, const kernels::Layout<4>& layout) override {
    cpu().where(dtype, local(cond), local(a), local(b), local(out), layout);
  }
  void reduce(ReduceOp op, DType dtype, const void* in, void* out, std::int64_t out_count, const kernels::Layout<2>& layout,
              const SumTree& tree) override {
    cpu().reduce(op, dtype, local(in), local(out), out_count, layout, tree);
  }
  void accumulate(ReduceOp op, DType dtype, void* dst, const void* src, std::size_t n) override {
    cpu().accumulate(op, dtype, local(dst), local(src), n);
  }
  void adamw(std::int64_t n, const float* p, const float* m, const float* v, const float* g, float* p_out, float* m_out, float* v_out,
             const kernels::AdamWStep& step) override {
    cpu().adamw(n, local(p), local(m), local(v), local(g), local(p_out), local(m_out), local(v_out), step);
  }
  void gemm(DType dtype, const kernels::GemmShape& shape, const void* a, const void* b, void* c) override {
    cpu().gemm(dtype, shape, local(a), local(b), local(c));
  }
  void gelu_forward(DType dtype, std::int64_t n, const void* x, void* y) override { cpu().gelu_forward(dtype, n, local(x), local(y)); }
  void gelu_backward(DType dtype, std::int64_t n, const void* x, const void* dy, void* dx) override {
    cpu().gelu_backward(dtype, n, local(x), local(dy), local(dx));
  }
  void layer_norm_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale, const void* bias,
                          double eps, void* y, void* mean, void* rstd) override {
    cpu().layer_norm_forward(dtype, rows, n, local(x), local(scale), local(bias), eps, local(y), local(mean), local(rstd));
  }
  void layer_norm_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale, const void* mean,
                           const void* rstd, const void* dy, void* dx, void* dscale, void* dbias, const SumTree& rows_tree) override {
    cpu().layer_norm_backward(dtype, rows, n, local(x), local(scale), local(mean), local(rstd), local(dy), local(dx), local(dscale),
                              local(dbias), rows_tree);
  }
  void softmax_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, void* y, bool log) override {
    cpu().softmax_forward(dtype, rows, n, local(x), local(y), log);
  }
  void softmax_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* y, const void* dy, void* dx, bool log) override {
    cpu().softmax_backward(dtype, rows, n, local(y), local(dy), local(dx), log);
  }
  std::int64_t attention_forward_scratch(const kernels::AttentionSizes& sizes) override { return cpu().attention_forward_scratch(sizes); }
  std::int64_t attention_backward_scratch(const kernels::AttentionSizes& sizes) override { return cpu().attention_backward_scratch(sizes); }
  void causal_attention_forward(const kernels::AttentionSizes& sizes, const kernels::InMatrices& q, const kernels::InMatrices& k,
                                const kernels::InMatrices& v, const kernels::OutMatrices& out, void* lse, void* scratch) override {
    cpu().causal_attention_forward(sizes, moved(q), moved(k), moved(v), moved(out), local(lse), local(scratch));
  }
  void causal_attention_backward(const kernels::AttentionSizes& sizes, const kernels::InMatrices& q, const kernels::InMatrices& k,
                                 const kernels::InMatrices& v, const kernels::InMatrices& out, const kernels::InMatrices& dout,
                                 const void* lse, const void* dlse, const kernels::OutMatrices& dq, const kernels::OutMatrices& dk,
                                 const kernels::OutMatrices& dv, void* scratch) override {
    cpu().causal_attention_backward(sizes, moved(q), moved(k), moved(v), moved(out), moved(dout), local(lse), local(dlse), moved(dq), moved(dk),
                                    moved(dv), local(scratch));
  }
  void rotary_in_place(const kernels::RotarySizes& sizes, void* data, const std::int64_t* outer_offsets, std::int64_t outer_count) override {
    cpu().rotary_in_place(sizes, local(data), outer_offsets, outer_count);
  }
  void gather_rows(const std::int32_t* ids, std::int64_t count, kernels::VocabRange range, const void* table, std::size_t row_bytes,
                   void* out) override {
    cpu().gather_rows(local(ids), count, range, local(table), row_bytes, local(out));
  }
  void scatter_add_rows(DType dtype, const std::int32_t* ids, std::int64_t count, kernels::VocabRange range, const void* grad,
                        std::int64_t row, void* table_grad, const SumTree& tree) override {
    cpu().scatter_add_rows(dtype, local(ids), count, range, local(grad), row, local(table_grad), tree);
  }
  void pick_forward(const std::int32_t* targets, kernels::VocabRange range, const kernels::PickLayout& where, const void* logits,
                    std::size_t element_size, void* out) override {
    cpu().pick_forward(local(targets), range, where, local(logits), element_size, local(out));
  }
  void pick_backward(DType dtype, const std::int32_t* targets, kernels::VocabRange range, const kernels::PickLayout& where,
                     const void* grad, void* logits_grad, std::int64_t logits_count) override {
    cpu().pick_backward(dtype, local(targets), range, where, local(grad), local(logits_grad), logits_count);
  }

 protected:
  static kernels::Kernels& cpu() { return *kernels::cpu_kernels_ptr(); }

 private:
  template <typename P>
  static kernels::Matrices<P> moved(const kernels::Matrices<P>& m) {
    return {local(m.data), m.offsets, m.row_stride};
  }
};

// Mesh device d as a remote device (for RuntimeOptions::device_factory).
inline std::shared_ptr<Device> make_remote_device(int d) {
  return std::make_shared<Device>(d, Backend::cpu, std::make_shared<RemoteAllocator>(), std::make_shared<RemoteKernels>());
}

}  // namespace nax::testing

namespace nax::testing {

// A remote device whose kernels take bf16 themselves, as CUDA's do (computes(bf16) is true): the
// op layer then runs its bf16-native paths (no widening; f32 attention lse and layer_norm
// statistics), which the CPU backend never takes. Each bf16 kernel widens the elements it may
// touch to f32, runs the CPU kernel and rounds the outputs back, as a GPU kernel computing in f32
// inside would.
class Bf16RemoteKernels final : public RemoteKernels {
 public:
  bool computes(DType) const override { return true; }

  void binary(kernels::BinaryOp op, DType dtype, const void* a, const void* b, void* out, const kernels::Layout<3>& layout) override {
    if (dtype != DType::bf16) return RemoteKernels::binary(op, dtype, a, b, out, layout);
    Wide wa(a, extent(layout, 0)), wb(b, extent(layout, 1)), wo(out, extent(layout, 2));
    cpu().binary(op, DType::f32, wa.data(), wb.data(), wo.data(), layout);
    wo.store();
  }
  void unary(kernels::UnaryOp op, DType dtype, const void* in, void* out, std::int64_t n) override {
    if (dtype != DType::bf16) return RemoteKernels::unary(op, dtype, in, out, n);
    Wide wi(in, n), wo(out, n);
    cpu().unary(op, DType::f32, wi.data(), wo.data(), n);
    wo.store();
  }
  void where(DType dtype, const void* cond, const void* a, const void* b, void* out, const kernels::Layout<4>& layout) override {
    if (dtype != DType::bf16) return RemoteKernels::where(dtype, cond, a, b, out, layout);
    Wide wc(cond, extent(layout, 0)), wa(a, extent(layout, 1)), wb(b, extent(layout, 2)), wo(out, extent(layout, 3));
    cpu().where(DType::f32, wc.data(), wa.data(), wb.data(), wo.data(), layout);
    wo.store();
  }
  void reduce(ReduceOp op, DType dtype, const void* in, void* out, std::int64_t out_count, const kernels::Layout<2>& layout,
              const SumTree& tree) override {
    if (dtype != DType::bf16) return RemoteKernels::reduce(op, dtype, in, out, out_count, layout, tree);
    Wide wi(in, extent(layout, 0)), wo(out, out_count);
    cpu().reduce(op, DType::f32, wi.data(), wo.data(), out_count, layout, tree);
    wo.store();
  }
  void gemm(DType dtype, const kernels::GemmShape& g, const void* a, const void* b, void* c) override {
    if (dtype != DType::bf16) return RemoteKernels::gemm(dtype, g, a, b, c);
    const std::int64_t rows_a = g.trans_a ? g.k : g.m, cols_a = g.trans_a ? g.m : g.k;
    const std::int64_t rows_b = g.trans_b ? g.n : g.k, cols_b = g.trans_b ? g.k : g.n;
    Wide wa(a, (g.batch - 1) * g.stride_a + (rows_a - 1) * g.lda + cols_a);
    Wide wb(b, (g.batch - 1) * g.stride_b + (rows_b - 1) * g.ldb + cols_b);
    Wide wc(c, (g.batch - 1) * g.stride_c + (g.m - 1) * g.ldc + g.n, g.beta != 0);
    cpu().gemm(DType::f32, g, wa.data(), wb.data(), wc.data());
    wc.store();
  }
  void gelu_forward(DType dtype, std::int64_t n, const void* x, void* y) override {
    if (dtype != DType::bf16) return RemoteKernels::gelu_forward(dtype, n, x, y);
    Wide wx(x, n), wy(y, n);
    cpu().gelu_forward(DType::f32, n, wx.data(), wy.data());
    wy.store();
  }
  void gelu_backward(DType dtype, std::int64_t n, const void* x, const void* dy, void* dx) override {
    if (dtype != DType::bf16) return RemoteKernels::gelu_backward(dtype, n, x, dy, dx);
    Wide wx(x, n), wdy(dy, n), wdx(dx, n);
    cpu().gelu_backward(DType::f32, n, wx.data(), wdy.data(), wdx.data());
    wdx.store();
  }
  // Statistics (mean, rstd) are f32 for bf16 rows: passed through.
  void layer_norm_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale, const void* bias,
                          double eps, void* y, void* mean, void* rstd) override {
    if (dtype != DType::bf16) return RemoteKernels::layer_norm_forward(dtype, rows, n, x, scale, bias, eps, y, mean, rstd);
    Wide wx(x, rows * n), ws(scale, n), wb(bias, n), wy(y, rows * n);
    cpu().layer_norm_forward(DType::f32, rows, n, wx.data(), ws.data(), wb.data(), eps, wy.data(), local(mean), local(rstd));
    wy.store();
  }
  void layer_norm_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale, const void* mean,
                           const void* rstd, const void* dy, void* dx, void* dscale, void* dbias, const SumTree& rows_tree) override {
    if (dtype != DType::bf16)
      return RemoteKernels::layer_norm_backward(dtype, rows, n, x, scale, mean, rstd, dy, dx, dscale, dbias, rows_tree);
    Wide wx(x, rows * n), ws(scale, n), wdy(dy, rows * n), wdx(dx, rows * n), wds(dscale, n), wdb(dbias, n);
    cpu().layer_norm_backward(DType::f32, rows, n, wx.data(), ws.data(), local(mean), local(rstd), wdy.data(), wdx.data(), wds.data(),
                              wdb.data(), rows_tree);
    wdx.store(), wds.store(), wdb.store();
  }
  void softmax_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, void* y, bool log) override {
    if (dtype != DType::bf16) return RemoteKernels::softmax_forward(dtype, rows, n, x, y, log);
    Wide wx(x, rows * n), wy(y, rows * n);
    cpu().softmax_forward(DType::f32, rows, n, wx.data(), wy.data(), log);
    wy.store();
  }
  void softmax_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* y, const void* dy, void* dx, bool log) override {
    if (dtype != DType::bf16) return RemoteKernels::softmax_backward(dtype, rows, n, y, dy, dx, log);
    Wide wy(y, rows * n), wdy(dy, rows * n), wdx(dx, rows * n);
    cpu().softmax_backward(DType::f32, rows, n, wy.data(), wdy.data(), wdx.data(), log);
    wdx.store();
  }
  // The lse is f32 for bf16 inputs: passed through; the scratch is the CPU kernels' own, in f32.
  void causal_attention_forward(const kernels::AttentionSizes& s, const kernels::InMatrices& q, const kernels::InMatrices& k,
                                const kernels::InMatrices& v, const kernels::OutMatrices& out, void* lse, void* scratch) override {
    if (s.dtype != DType::bf16) return RemoteKernels::causal_attention_forward(s, q, k, v, out, lse, scratch);
    const kernels::AttentionSizes f = as_f32(s);
    Wide wq(q.data, extent(s, q, s.tq)), wk(k.data, extent(s, k, s.tk)), wv(v.data, extent(s, v, s.tk)), wo(out.data, extent(s, out, s.tq));
    std::vector<float> work(static_cast<std::size_t>(cpu().attention_forward_scratch(f)));
    cpu().causal_attention_forward(f, {wq.data(), q.offsets, q.row_stride}, {wk.data(), k.offsets, k.row_stride},
                                   {wv.data(), v.offsets, v.row_stride}, {wo.data(), out.offsets, out.row_stride}, local(lse), work.data());
    wo.store();
  }
  void causal_attention_backward(const kernels::AttentionSizes& s, const kernels::InMatrices& q, const kernels::InMatrices& k,
                                 const kernels::InMatrices& v, const kernels::InMatrices& out, const kernels::InMatrices& dout,
                                 const void* lse, const void* dlse, const kernels::OutMatrices& dq, const kernels::OutMatrices& dk,
                                 const kernels::OutMatrices& dv, void* scratch) override {
    if (s.dtype != DType::bf16) return RemoteKernels::causal_attention_backward(s, q, k, v, out, dout, lse, dlse, dq, dk, dv, scratch);
    const kernels::AttentionSizes f = as_f32(s);
    Wide wq(q.data, extent(s, q, s.tq)), wk(k.data, extent(s, k, s.tk)), wv(v.data, extent(s, v, s.tk));
    Wide wo(out.data, extent(s, out, s.tq)), wg(dout.data, extent(s, dout, s.tq));
    Wide wdq(dq.data, extent(s, dq, s.tq)), wdk(dk.data, extent(s, dk, s.tk)), wdv(dv.data, extent(s, dv, s.tk));
    std::vector<float> work(static_cast<std::size_t>(cpu().attention_backward_scratch(f)));
    cpu().causal_attention_backward(f, {wq.data(), q.offsets, q.row_stride}, {wk.data(), k.offsets, k.row_stride},
                                    {wv.data(), v.offsets, v.row_stride}, {wo.data(), out.offsets, out.row_stride},
                                    {wg.data(), dout.offsets, dout.row_stride}, local(lse), local(dlse), {wdq.data(), dq.offsets, dq.row_stride},
                                    {wdk.data(), dk.offsets, dk.row_stride}, {wdv.data(), dv.offsets, dv.row_stride}, work.data());
    wdq.store(), wdk.store(), wdv.store();
  }
  void rotary_in_place(const kernels::RotarySizes& s, void* data, const std::int64_t* outer, std::int64_t count) override {
    if (s.dtype != DType::bf16) return RemoteKernels::rotary_in_place(s, data, outer, count);
    std::int64_t last = 0;
    for (std::int64_t i = 0; i < count; ++i) last = std::max(last, outer[i]);
    kernels::RotarySizes f = s;
    f.dtype = DType::f32;
    Wide wd(data, count == 0 ? 0 : last + (s.seq_len - 1) * s.seq_stride + (s.rotary_dims - 1) * s.head_dim_stride + 1);
    cpu().rotary_in_place(f, wd.data(), outer, count);
    wd.store();
  }
  void scatter_add_rows(DType dtype, const std::int32_t* ids, std::int64_t count, kernels::VocabRange range, const void* grad,
                        std::int64_t row, void* table_grad, const SumTree& tree) override {
    if (dtype != DType::bf16) return RemoteKernels::scatter_add_rows(dtype, ids, count, range, grad, row, table_grad, tree);
    Wide wg(grad, count * row), wt(table_grad, range.local * row, false);
    cpu().scatter_add_rows(DType::f32, local(ids), count, range, wg.data(), row, wt.data(), tree);
    wt.store();
  }
  void pick_backward(DType dtype, const std::int32_t* targets, kernels::VocabRange range, const kernels::PickLayout& where,
                     const void* grad, void* logits_grad, std::int64_t logits_count) override {
    if (dtype != DType::bf16) return RemoteKernels::pick_backward(dtype, targets, range, where, grad, logits_grad, logits_count);
    Wide wg(grad, extent(where.layout, 0)), wl(logits_grad, logits_count, false);
    cpu().pick_backward(DType::f32, local(targets), range, where, wg.data(), wl.data(), logits_count);
    wl.store();
  }

 private:
  // The f32 copy of `count` bf16 elements at a remote address, written back by store().
  class Wide {
   public:
    Wide(const void* remote_bf16, std::int64_t count, bool read = true)
        : bf16_(static_cast<std::uint16_t*>(const_cast<void*>(local(remote_bf16)))), f32_(static_cast<std::size_t>(std::max<std::int64_t>(count, 0))) {
      if (read) cpu().convert(DType::bf16, bf16_, DType::f32, f32_.data(), static_cast<std::int64_t>(f32_.size()));
    }
    float* data() { return f32_.data(); }
    void store() { cpu().convert(DType::f32, f32_.data(), DType::bf16, bf16_, static_cast<std::int64_t>(f32_.size())); }

   private:
    std::uint16_t* bf16_;
    std::vector<float> f32_;
  };

  // One past the last element operand k of `layout` reaches (strides are non-negative here).
  template <int K>
  static std::int64_t extent(const kernels::Layout<K>& layout, int k) {
    std::int64_t last = 0;
    for (int d = 0; d < layout.rank; ++d) {
      if (layout.sizes[d] == 0) return 0;
      last += (layout.sizes[d] - 1) * layout.strides[k][d];
    }
    return last + 1;
  }
  template <typename P>
  static std::int64_t extent(const kernels::AttentionSizes& s, const kernels::Matrices<P>& m, std::int64_t rows) {
    std::int64_t last = 0;
    for (std::int64_t b = 0; b < s.batches; ++b) last = std::max(last, m.offsets[b]);
    return s.batches == 0 || rows == 0 ? 0 : last + (rows - 1) * m.row_stride + s.head_dim;
  }
  static kernels::AttentionSizes as_f32(kernels::AttentionSizes s) {
    s.dtype = DType::f32;
    return s;
  }
};

inline std::shared_ptr<Device> make_bf16_remote_device(int d) {
  return std::make_shared<Device>(d, Backend::cpu, std::make_shared<RemoteAllocator>(), std::make_shared<Bf16RemoteKernels>());
}

}  // namespace nax::testing
