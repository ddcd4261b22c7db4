#pragma once
// A test double for a device whose memory the host cannot touch (as a GPU's): its "device
// addresses" are host addresses moved by 2^47, which no host code can dereference (they are not
// canonical x86-64 addresses: a stray read faults at once). Its kernels move them back and run
// the CPU kernels, so results must equal the CPU backend's bit for bit, and any op that reads
// device memory on the host instead of going through the device's kernels crashes.
#include <cstdint>
#include <memory>

#include "kernels/kernels.h"
#include "nax/core/allocator.h"
#include "nax/core/device.h"

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
  void reduce(ReduceOp op, DType dtype, const void* in, void* out, std::int64_t out_count, const kernels::Layout<2>& layout) override {
    cpu().reduce(op, dtype, local(in), local(out), out_count, layout);
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
                           const void* rstd, const void* dy, void* dx, void* dscale, void* dbias) override {
    cpu().layer_norm_backward(dtype, rows, n, local(x), local(scale), local(mean), local(rstd), local(dy), local(dx), local(dscale),
                              local(dbias));
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
                                 const void* lse, const kernels::OutMatrices& dq, const kernels::OutMatrices& dk,
                                 const kernels::OutMatrices& dv, void* scratch) override {
    cpu().causal_attention_backward(sizes, moved(q), moved(k), moved(v), moved(out), moved(dout), local(lse), moved(dq), moved(dk),
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
                        std::int64_t row, void* table_grad) override {
    cpu().scatter_add_rows(dtype, local(ids), count, range, local(grad), row, local(table_grad));
  }
  void pick_forward(const std::int32_t* targets, kernels::VocabRange range, const kernels::PickLayout& where, const void* logits,
                    std::size_t element_size, void* out) override {
    cpu().pick_forward(local(targets), range, where, local(logits), element_size, local(out));
  }
  void pick_backward(DType dtype, const std::int32_t* targets, kernels::VocabRange range, const kernels::PickLayout& where,
                     const void* grad, void* logits_grad, std::int64_t logits_count) override {
    cpu().pick_backward(dtype, local(targets), range, where, local(grad), local(logits_grad), logits_count);
  }

 private:
  static kernels::Kernels& cpu() { return *kernels::cpu_kernels_ptr(); }
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
