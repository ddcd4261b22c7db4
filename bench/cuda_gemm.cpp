// bench_cuda_gemm: nax's GEMM at two levels against cuBLASLt called directly with the same
// settings (bf16 inputs and output, f32 accumulation, the same 32 MiB workspace), its plan made
// once outside the timed loop. Square M=N=K bf16 GEMMs on GPU 0:
//   - nax::cuda::gemm_lt (the wrapper, with its plan cache) and direct cuBLASLt, each run timed
//     with CUDA events, interleaved, median of --reps runs after --warmup runs;
//   - nax `dot` on a CUDA device of Runtime::local (the whole op: checks, result allocation from
//     the caching allocator, dispatch, the GEMM), --reps calls back to back timed on the host
//     clock, against --reps direct calls timed the same way.
// Prints TFLOP/s of each and the ratios to direct (goal: dot >= 95% of direct).
//
//   build-gpu/bin/bench_cuda_gemm [--sizes 4096,8192] [--reps 30] [--warmup 5] [--json FILE]
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <nax/nax.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kernels.h"

namespace {

using nax::cuda::bf16_t;

struct Options {
  std::vector<int> sizes{4096, 8192};
  int reps = 30, warmup = 5;
  std::string json;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--reps") o.reps = std::stoi(next());
    else if (arg == "--warmup") o.warmup = std::stoi(next());
    else if (arg == "--json") o.json = next();
    else if (arg == "--sizes") {
      o.sizes.clear();
      for (std::int64_t size : bench::parse_integer_list(next(), arg)) o.sizes.push_back(static_cast<int>(size));
    } else throw std::runtime_error("unknown argument " + arg + " (--sizes, --reps, --warmup, --json)");
  }
  return o;
}

// cuBLASLt directly: the same problem as gemm_lt's row-major C = A B, planned once.
class DirectGemm {
 public:
  DirectGemm(cublasLtHandle_t handle, int size, void* workspace, std::size_t workspace_bytes)
      : handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes) {
    NAX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const std::uint64_t s = static_cast<std::uint64_t>(size);
    NAX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_, CUDA_R_16BF, s, s, size));
    cublasLtMatmulPreference_t preference = nullptr;
    NAX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    NAX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                          sizeof workspace_bytes_));
    int found = 0;
    NAX_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, desc_, layout_, layout_, layout_, layout_, preference, 1, &result_, &found));
    cublasLtMatmulPreferenceDestroy(preference);
    if (found == 0) throw std::runtime_error("cuBLASLt found no algorithm");
  }
  ~DirectGemm() {
    cublasLtMatrixLayoutDestroy(layout_);
    cublasLtMatmulDescDestroy(desc_);
  }
  DirectGemm(const DirectGemm&) = delete;
  DirectGemm& operator=(const DirectGemm&) = delete;

  void run(const void* a, const void* b, void* c, cudaStream_t stream) const {
    const float alpha = 1.0f, beta = 0.0f;
    NAX_CUBLAS_CHECK(cublasLtMatmul(handle_, desc_, &alpha, b, layout_, a, layout_, &beta, c, layout_, c, layout_, &result_.algo,
                                    workspace_, workspace_bytes_, stream));
  }

 private:
  cublasLtHandle_t handle_;
  void* workspace_;
  std::size_t workspace_bytes_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t layout_ = nullptr;
  cublasLtMatmulHeuristicResult_t result_{};
};

// Seconds per call of `reps` calls of nax dot on a bf16 size^3 GEMM (after `warmup` calls).
double dot_seconds(int size, int reps, int warmup) {
  nax::RuntimeOptions options;
  options.backend = nax::Backend::cuda;
  nax::Runtime rt = nax::Runtime::local(nax::Mesh::parse("x=1"), options);
  double seconds = 0;
  rt.run([&](nax::Shard& s) {
    using nax::Shape;
    const nax::Tensor a = nax::random_normal(Shape{{"m", size}, {"k", size}}, 1, "a", 1.0, nax::DType::bf16);
    const nax::Tensor b = nax::random_normal(Shape{{"k", size}, {"n", size}}, 2, "b", 1.0, nax::DType::bf16);
    for (int i = 0; i < warmup; ++i) nax::dot(a, b, "k");
    s.synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) nax::dot(a, b, "k");
    s.synchronize();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
  });
  return seconds;
}

// The same for direct cuBLASLt calls on `stream`.
template <typename F>
double host_timed_seconds(cudaStream_t stream, int reps, F fn) {
  NAX_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  NAX_CUDA_CHECK(cudaStreamSynchronize(stream));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options options = parse(argc, argv);
  if (nax::cuda::cuda_device_count() == 0) {
    std::puts("no CUDA device");
    return 77;
  }
  cudaDeviceProp prop{};
  const double peak = bench::dense_bf16_peak_tflops();
  NAX_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream = nullptr;
  NAX_CUDA_CHECK(cudaStreamCreate(&stream));
  bench::EventTimer timer;
  nax::cuda::GemmContext context(0);
  nlohmann::json results = nlohmann::json::array();
  std::vector<std::string> rows;

  for (int size : options.sizes) {
    const std::size_t elements = static_cast<std::size_t>(size) * size;
    bf16_t *a = nullptr, *b = nullptr, *c = nullptr;
    NAX_CUDA_CHECK(cudaMalloc(&a, elements * sizeof(bf16_t)));
    NAX_CUDA_CHECK(cudaMalloc(&b, elements * sizeof(bf16_t)));
    NAX_CUDA_CHECK(cudaMalloc(&c, elements * sizeof(bf16_t)));
    bench::fill_random_bf16(a, elements, 1);
    bench::fill_random_bf16(b, elements, 2);
    DirectGemm direct(context.handle(), size, context.workspace(), context.workspace_bytes());
    nax::cuda::GemmArgs args;
    args.m = args.n = args.k = size;
    args.input = args.output = nax::DType::bf16;
    auto run_nax = [&] { nax::cuda::gemm_lt(context, stream, args, a, b, c); };
    auto run_direct = [&] { direct.run(a, b, c, stream); };
    for (int i = 0; i < options.warmup; ++i) {
      run_nax();
      run_direct();
    }
    NAX_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<double> nax_ms, direct_ms;
    for (int i = 0; i < options.reps; ++i) {
      nax_ms.push_back(timer.ms(stream, run_nax));
      direct_ms.push_back(timer.ms(stream, run_direct));
    }
    const double flops = 2.0 * size * size * static_cast<double>(size);
    const double t_nax = bench::median(nax_ms), t_direct = bench::median(direct_ms);
    const double tf_nax = flops / (t_nax * 1e-3) / 1e12, tf_direct = flops / (t_direct * 1e-3) / 1e12;
    const double tf_direct_host = flops / host_timed_seconds(stream, options.reps, run_direct) / 1e12;
    const double tf_dot = flops / dot_seconds(size, options.reps, options.warmup) / 1e12;
    results.push_back({{"size", size},
                       {"peak_tflops", peak},
                       {"nax_fraction_of_peak", peak > 0 ? tf_nax / peak : 0.0},
                       {"dtype", "bf16"},
                       {"nax_ms", t_nax},
                       {"direct_ms", t_direct},
                       {"nax_tflops", tf_nax},
                       {"direct_tflops", tf_direct},
                       {"ratio", tf_nax / tf_direct},
                       {"dot_tflops", tf_dot},
                       {"direct_host_timed_tflops", tf_direct_host},
                       {"dot_ratio", tf_dot / tf_direct_host},
                       {"nax_ms_all", nax_ms},
                       {"direct_ms_all", direct_ms}});
    rows.push_back(fmt::format("{:>6} {:>10.3f} {:>10.3f} {:>12.1f} {:>8} {:>12.1f} {:>7.3f} {:>12.1f} {:>12.1f} {:>7.3f}", size, t_nax,
                               t_direct, tf_nax, bench::fraction_of_peak(tf_nax, peak), tf_direct, tf_nax / tf_direct, tf_dot,
                               tf_direct_host, tf_dot / tf_direct_host));
    NAX_CUDA_CHECK(cudaFree(a));
    NAX_CUDA_CHECK(cudaFree(b));
    NAX_CUDA_CHECK(cudaFree(c));
  }

  fmt::print("bench_cuda_gemm on {} (bf16 in/out, f32 accumulate, median of {} after {} warm-up)\n", prop.name, options.reps,
             options.warmup);
  fmt::print("dense bf16 peak: {}\n", peak > 0 ? fmt::format("{:.0f} TFLOP/s", peak) : std::string("not known for this architecture"));
  fmt::print("{:>6} {:>10} {:>10} {:>12} {:>8} {:>12} {:>7} {:>12} {:>12} {:>7}\n", "size", "lt ms", "direct ms", "lt TFLOP/s", "of peak",
             "dir TFLOP/s", "ratio", "dot TFLOP/s", "dir(host)", "dot/dir");
  for (const auto& row : rows) fmt::print("{}\n", row);
  if (!options.json.empty()) {
    std::ofstream out(options.json);
    out << nlohmann::json{{"bench", "cuda_gemm"}, {"device", prop.name}, {"results", results}}.dump(2) << "\n";
  }
  NAX_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_cuda_gemm: %s\n", e.what());
  return 1;
}
