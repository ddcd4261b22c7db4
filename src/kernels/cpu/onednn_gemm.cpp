// GEMM through oneDNN's matmul. bf16: on the processor's bf16 dot-product instructions (AVX512-BF16,
// AMX), with the contract of the cuBLASLt path: bf16 operands, f32 sums, each element rounded once
// to bf16; without oneDNN, or where oneDNN has only its reference kernel for bf16, it is unavailable
// and the op layer widens bf16 to f32 instead. f32 (on request): oneDNN's kernels run the shapes of
// a transformer's projections at 1.01-1.23x OpenBLAS's sgemm on one core (AVX-512), the batch in
// one call; OpenBLAS keeps what they do not take (beta != 0, small products, layouts with only
// oneDNN's reference loops).
#include "kernels/cpu/kernels.h"

#if NAX_HAS_DNNL
#include <omp.h>

#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <tuple>
#endif

namespace nax::cpu {

#if NAX_HAS_DNNL
namespace {

using dnnl::memory;

dnnl::engine& engine() {
  static dnnl::engine cpu = [] {
    // Each device thread keeps its own primitives (made_for): oneDNN's process-wide cache would
    // only be shared state between the devices.
    dnnl::set_primitive_cache_capacity(0);
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return cpu;
}

// rows x cols, stored row-major with leading dimension ld, or transposed (stored cols x rows); a
// batch of them `stride` elements apart.
memory::desc operand(memory::data_type type, std::int64_t batch, std::int64_t rows, std::int64_t cols, std::int64_t ld, bool trans,
                     std::int64_t stride) {
  const memory::dim r = trans ? 1 : ld, c = trans ? ld : 1;
  if (batch == 1) return memory::desc({rows, cols}, type, memory::dims{r, c});
  return memory::desc({batch, rows, cols}, type, memory::dims{stride, r, c});
}

memory::data_type type_of(DType dtype) { return dtype == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32; }

using Key = std::tuple<DType, bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       std::int64_t, std::int64_t, std::int64_t>;

// A shape's matmul and its memory layouts, made once per thread (making one costs far more than a
// small GEMM). Bounded: sampling with a KV cache meets a new shape every token. An f32 shape that
// oneDNN has only its reference loops for, or refuses, is remembered as none (OpenBLAS takes it).
struct Made {
  std::optional<dnnl::matmul::primitive_desc> pd;
  std::optional<dnnl::matmul> matmul;
};

const Made& made_for(DType dtype, const GemmShape& g) {
  thread_local std::map<Key, Made> made;
  const Key key{dtype, g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batch, g.stride_a, g.stride_b, g.stride_c};
  auto it = made.find(key);
  if (it != made.end()) return it->second;
  if (made.size() >= 256) made.clear();
  const memory::data_type type = type_of(dtype);
  Made entry;
  try {
    const dnnl::matmul::desc desc(operand(type, g.batch, g.m, g.k, g.lda, g.trans_a, g.stride_a),
                                  operand(type, g.batch, g.k, g.n, g.ldb, g.trans_b, g.stride_b),
                                  operand(type, g.batch, g.m, g.n, g.ldc, false, g.stride_c));
    dnnl::matmul::primitive_desc pd(desc, engine());
    if (dtype != DType::f32 || std::string(pd.impl_info_str()).find("ref") == std::string::npos) {
      entry.matmul.emplace(pd);
      entry.pd.emplace(std::move(pd));
    }
  } catch (const dnnl::error& e) {
    if (dtype != DType::f32) fail("gemm", "oneDNN refused a bf16 GEMM of {} x {} x {}: {}", g.m, g.n, g.k, e.what());
  }
  return made.emplace(key, std::move(entry)).first->second;
}

// Whether oneDNN has a kernel of its own (not its reference loops) for this dtype here.
bool has_kernel(memory::data_type type) {
  try {
    const memory::desc square({32, 32}, type, memory::format_tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(square, square, square), engine());
    return std::string(pd.impl_info_str()).find("ref") == std::string::npos;
  } catch (const dnnl::error&) {
    return false;
  }
}

}  // namespace

bool onednn_gemm_available(DType dtype) {
  static const bool bf16 = has_kernel(memory::data_type::bf16), f32 = has_kernel(memory::data_type::f32);
  return dtype == DType::bf16 ? bf16 : dtype == DType::f32 && f32;
}

bool onednn_gemm(DType dtype, const GemmShape& g, const void* a, const void* b, void* c) {
  if (g.beta != 0) fail("gemm", "oneDNN's GEMM does not accumulate into C (beta {})", g.beta);
  thread_local int threads = 0;  // this thread's GEMMs use the device's share of the cores: set once, and when it changes
  if (const int wanted = blas_threads(); wanted != threads) omp_set_num_threads(threads = wanted);
  const Made& made = made_for(dtype, g);
  if (!made.matmul) return false;
  thread_local dnnl::stream stream(engine());
  made.matmul->execute(stream, {{DNNL_ARG_SRC, memory(made.pd->src_desc(), engine(), const_cast<void*>(a))},
                                {DNNL_ARG_WEIGHTS, memory(made.pd->weights_desc(), engine(), const_cast<void*>(b))},
                                {DNNL_ARG_DST, memory(made.pd->dst_desc(), engine(), c)}});
  stream.wait();
  return true;
}

#else

bool onednn_gemm_available(DType) { return false; }
bool onednn_gemm(DType, const GemmShape&, const void*, const void*, void*) { fail("gemm", "nax was built without oneDNN"); }

#endif

}  // namespace nax::cpu
