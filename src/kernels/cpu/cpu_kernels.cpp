// The CPU backend of the kernel interface: each method is the CPU kernel of the same name (host
// memory, finished on return; bf16 is widened to f32 by the op layer, except by copy and convert).
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/lookup.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/pointwise.h"

namespace nax::kernels {

namespace {

// f32 GEMMs go to OpenBLAS, or with NAX_F32_GEMM=onednn to oneDNN where it has an f32 kernel here
// (1.08x of OpenBLAS over a transformer's shapes, onednn_gemm.cpp); OpenBLAS keeps accumulations
// into C, products too small to repay oneDNN's per-call cost, and shapes oneDNN has no kernel for.
// OpenBLAS is the default: deterministic mode's tree GEMM and the bf16 path keep their measured
// ratios to it (README).
bool takes_onednn(DType dtype, const GemmShape& g) {
  static const bool chosen = [] {
    const char* library = std::getenv("NAX_F32_GEMM");
    if (library != nullptr && std::string_view(library) != "onednn" && std::string_view(library) != "openblas")
      fail("gemm", "NAX_F32_GEMM must be onednn or openblas, got '{}'", library);
    return library != nullptr && std::string_view(library) == "onednn" && cpu::onednn_gemm_available(DType::f32);
  }();
  constexpr double kMinProduct = 64.0 * 64 * 64;
  return dtype == DType::f32 && chosen && g.beta == 0 && static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k) >= kMinProduct;
}

class CpuKernels final : public Kernels {
 public:
  Backend backend() const override { return Backend::cpu; }
  bool computes(DType dtype) const override { return dtype != DType::bf16; }
  bool gemm_computes(DType dtype) const override { return computes(dtype) || (dtype == DType::bf16 && cpu::onednn_gemm_available(dtype)); }
  bool binary_computes(DType dtype) const override { return computes(dtype) || dtype == DType::bf16; }

  void copy_from_host(void* dst, const void* src, std::size_t bytes) override { copy_bytes(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override { copy_bytes(dst, src, bytes); }
  void copy_bytes(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void synchronize() override {}

  void binary(BinaryOp op, DType dtype, const void* a, const void* b, void* out, const Layout<3>& layout) override {
    cpu::binary(op, dtype, a, b, out, layout);
  }
  void unary(UnaryOp op, DType dtype, const void* in, void* out, std::int64_t n) override { cpu::unary(op, dtype, in, out, n); }
  void fill(DType dtype, void* out, std::int64_t n, double value) override { cpu::fill(dtype, out, n, value); }
  void copy(std::size_t element_size, const void* src, void* dst, const Layout<2>& layout) override {
    cpu::copy(element_size, src, dst, layout);
  }
  void convert(DType from, const void* src, DType to, void* dst, std::int64_t n) override { cpu::convert(from, src, to, dst, n); }
  void where(DType dtype, const void* cond, const void* a, const void* b, void* out, const Layout<4>& layout) override {
    cpu::where(dtype, cond, a, b, out, layout);
  }
  void reduce(ReduceOp op, DType dtype, const void* in, void* out, std::int64_t out_count, const Layout<2>& layout,
              const SumTree& tree) override {
    cpu::reduce(op, dtype, in, out, out_count, layout, tree);
  }
  void accumulate(ReduceOp op, DType dtype, void* dst, const void* src, std::size_t n) override {
    cpu::accumulate(op, dtype, dst, src, n);
  }

  void adamw(std::int64_t n, const float* p, const float* m, const float* v, const float* g, float* p_out, float* m_out, float* v_out,
             const AdamWStep& step) override {
    cpu::adamw(n, p, m, v, g, p_out, m_out, v_out, step);
  }

  void gemm(DType dtype, const GemmShape& g, const void* a, const void* b, void* c) override {
    if (g.tree.on) return cpu::tree_gemm(dtype, g, a, b, c);
    if (dtype == DType::bf16) {
      cpu::onednn_gemm(dtype, g, a, b, c);
      return;
    }
    if (takes_onednn(dtype, g) && cpu::onednn_gemm(dtype, g, a, b, c)) return;
    const std::size_t es = dtype_size(dtype);
    for (std::int64_t t = 0; t < g.batch; ++t)
      cpu::gemm(dtype, g.trans_a, g.trans_b, g.m, g.n, g.k, static_cast<const char*>(a) + t * g.stride_a * es, g.lda,
                static_cast<const char*>(b) + t * g.stride_b * es, g.ldb, static_cast<char*>(c) + t * g.stride_c * es, g.ldc,
                g.beta);
  }

  void gelu_forward(DType dtype, std::int64_t n, const void* x, void* y) override { cpu::gelu_forward(dtype, n, x, y); }
  void gelu_backward(DType dtype, std::int64_t n, const void* x, const void* dy, void* dx) override {
    cpu::gelu_backward(dtype, n, x, dy, dx);
  }
  void layer_norm_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale, const void* bias,
                          double eps, void* y, void* mean, void* rstd) override {
    cpu::layer_norm_forward(dtype, rows, n, x, scale, bias, eps, y, mean, rstd);
  }
  void layer_norm_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale, const void* mean,
                           const void* rstd, const void* dy, void* dx, void* dscale, void* dbias, const SumTree& rows_tree) override {
    cpu::layer_norm_backward(dtype, rows, n, x, scale, mean, rstd, dy, dx, dscale, dbias, rows_tree);
  }
  void softmax_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, void* y, bool log) override {
    cpu::softmax_forward(dtype, rows, n, x, y, log);
  }
  void softmax_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* y, const void* dy, void* dx,
                        bool log) override {
    cpu::softmax_backward(dtype, rows, n, y, dy, dx, log);
  }

  bool scan_rows(DType dtype, std::int64_t rows, std::int64_t n, const void* x, void* y, bool exclusive, bool reverse) override {
    cpu::scan_rows(dtype, rows, n, x, y, exclusive, reverse);
    return true;
  }
  bool top_k_rows(DType dtype, std::int64_t rows, std::int64_t n, std::int64_t k, bool largest, const void* x, void* values,
                  std::int32_t* indices) override {
    cpu::top_k_rows(dtype, rows, n, k, largest, x, values, indices);
    return true;
  }

  std::int64_t attention_forward_scratch(const AttentionSizes& sizes) override { return cpu::attention_forward_scratch(sizes); }
  std::int64_t attention_backward_scratch(const AttentionSizes& sizes) override { return cpu::attention_backward_scratch(sizes); }
  void causal_attention_forward(const AttentionSizes& sizes, const InMatrices& q, const InMatrices& k, const InMatrices& v,
                                const OutMatrices& out, void* lse, void* scratch) override {
    cpu::causal_attention_forward(sizes, q, k, v, out, lse, scratch);
  }
  void causal_attention_backward(const AttentionSizes& sizes, const InMatrices& q, const InMatrices& k, const InMatrices& v,
                                 const InMatrices& out, const InMatrices& dout, const void* lse, const void* dlse,
                                 const OutMatrices& dq, const OutMatrices& dk, const OutMatrices& dv, void* scratch) override {
    cpu::causal_attention_backward(sizes, q, k, v, out, dout, lse, dlse, dq, dk, dv, scratch);
  }
  void rotary_in_place(const RotarySizes& sizes, void* data, const std::int64_t* outer_offsets, std::int64_t outer_count) override {
    cpu::rotary_in_place(sizes, data, outer_offsets, outer_count);
  }

  void gather_rows(const std::int32_t* ids, std::int64_t count, VocabRange range, const void* table, std::size_t row_bytes,
                   void* out) override {
    cpu::gather_rows(ids, count, range, table, row_bytes, out);
  }
  void scatter_add_rows(DType dtype, const std::int32_t* ids, std::int64_t count, VocabRange range, const void* grad,
                        std::int64_t row, void* table_grad, const SumTree& tree) override {
    cpu::scatter_add_rows(dtype, ids, count, range, grad, row, table_grad, tree);
  }
  void pick_forward(const std::int32_t* targets, VocabRange range, const PickLayout& where, const void* logits,
                    std::size_t element_size, void* out) override {
    cpu::pick_forward(targets, range, where, logits, element_size, out);
  }
  void pick_backward(DType dtype, const std::int32_t* targets, VocabRange range, const PickLayout& where, const void* grad,
                     void* logits_grad, std::int64_t logits_count) override {
    cpu::pick_backward(dtype, targets, range, where, grad, logits_grad, logits_count);
  }
};

}  // namespace

const std::shared_ptr<Kernels>& cpu_kernels_ptr() {
  static const std::shared_ptr<Kernels> kernels = std::make_shared<CpuKernels>();
  return kernels;
}

}  // namespace nax::kernels
