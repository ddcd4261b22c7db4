// Row-major C = A B is column-major C^T = B^T A^T: cuBLASLt sees B as its first operand and A as
// its second, with m and n swapped; a row-major matrix r x c with row stride ld is the
// column-major c x r with leading dimension ld, so no data moves.
#include "kernels/cuda/gemm.h"

#include <map>
#include <tuple>

#include "kernels/cuda/check.h"
#include "nax/core/error.h"

namespace nax::cuda {

namespace {

template <typename Handle, auto Destroy>
struct Owned {
  Handle handle = nullptr;
  Owned() = default;
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (handle != nullptr) (void)Destroy(handle);
  }
};

using MatmulDesc = Owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using MatrixLayout = Owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using Preference = Owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

}  // namespace

// What the heuristic's choice depends on: everything in GemmArgs but the pointers and the scalars,
// plus how the pointers are aligned (an algorithm may need 16-byte-aligned operands).
struct GemmPlanKey {
  std::int64_t m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c;
  int batch;
  bool trans_a, trans_b;
  DType input, output;
  GemmEpilogue epilogue;
  std::uint32_t align_a, align_b, align_c;

  auto tied() const {
    return std::tie(m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, batch, trans_a, trans_b, input, output, epilogue, align_a,
                    align_b, align_c);
  }
  bool operator<(const GemmPlanKey& other) const { return tied() < other.tied(); }
};

struct GemmPlan {
  MatmulDesc desc;
  MatrixLayout first, second, result;  // cuBLASLt's A (our B), B (our A), C and D (our C)
  cublasLtMatmulAlgo_t algo{};
  bool f64 = false;  // alpha and beta are doubles
};

struct GemmPlanCache {
  static constexpr std::size_t kMaxPlans = 4096;  // a bound against unbounded shape churn
  std::map<GemmPlanKey, std::unique_ptr<GemmPlan>> plans;
};

GemmContext::GemmContext(int device, std::size_t workspace_bytes)
    : device_(device), workspace_bytes_(workspace_bytes), plans_(std::make_unique<GemmPlanCache>()) {
  DeviceGuard guard(device_);
  NAX_CUBLAS_CHECK(cublasLtCreate(&handle_));
  if (workspace_bytes_ > 0) {
    const cudaError_t status = cudaMalloc(&workspace_, workspace_bytes_);
    if (status != cudaSuccess) {
      cublasLtDestroy(handle_);
      NAX_CUDA_CHECK(status);
    }
  }
}

GemmContext::~GemmContext() {
  plans_.reset();
  QuietDeviceGuard guard(device_);
  if (workspace_ != nullptr) (void)cudaFree(workspace_);
  (void)cublasLtDestroy(handle_);
}

namespace {

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f64: return CUDA_R_64F;
    default: fail("gemm_lt", "dtype {} is not supported (f32, bf16 or f64)", dtype_name(dtype));
  }
}

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  NAX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof value));
}

// A column-major rows x cols matrix with leading dimension ld, batched by `batch` at `stride`.
void make_layout(MatrixLayout& layout, cudaDataType_t type, std::int64_t rows, std::int64_t cols, std::int64_t ld, int batch,
                 std::int64_t stride) {
  NAX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout.handle, type, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols), ld));
  if (batch > 1) {
    NAX_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout.handle, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
    NAX_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout.handle, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
}

// The largest power of two up to 256 dividing the address of every matrix of the batch.
std::uint32_t alignment(const void* p, std::int64_t stride, int batch, DType dtype) {
  auto bits = reinterpret_cast<std::uintptr_t>(p);
  if (batch > 1) bits |= static_cast<std::uintptr_t>(stride) * dtype_size(dtype);
  std::uint32_t align = 256;
  while (align > 1 && bits % align != 0) align /= 2;
  return align;
}

bool has_bias(GemmEpilogue e) { return e == GemmEpilogue::bias || e == GemmEpilogue::bias_gelu; }

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::gelu: return CUBLASLT_EPILOGUE_GELU;
    case GemmEpilogue::bias_gelu: return CUBLASLT_EPILOGUE_GELU_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The arguments with the default (packed) row strides filled in.
GemmArgs with_strides(GemmArgs args) {
  if (args.lda == 0) args.lda = args.trans_a ? args.m : args.k;
  if (args.ldb == 0) args.ldb = args.trans_b ? args.k : args.n;
  if (args.ldc == 0) args.ldc = args.n;
  return args;
}

GemmPlanKey key_of(const GemmArgs& g, const void* a, const void* b, const void* c) {
  return {g.m,
          g.n,
          g.k,
          g.lda,
          g.ldb,
          g.ldc,
          g.stride_a,
          g.stride_b,
          g.stride_c,
          g.batch,
          g.trans_a,
          g.trans_b,
          g.input,
          g.output,
          g.epilogue,
          alignment(a, g.stride_a, g.batch, g.input),
          alignment(b, g.stride_b, g.batch, g.input),
          alignment(c, g.stride_c, g.batch, g.output)};
}

void check(const GemmArgs& g) {
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0)
    fail("gemm_lt", "bad shape m={} n={} k={} batch={}", g.m, g.n, g.k, g.batch);
  if ((g.input == DType::f64) != (g.output == DType::f64))
    fail("gemm_lt", "f64 goes with f64 only, got {} -> {}", dtype_name(g.input), dtype_name(g.output));
  if (has_bias(g.epilogue) && g.bias == nullptr) fail("gemm_lt", "the bias epilogue needs a bias");
}

void set_alignment(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute, std::uint32_t bytes) {
  NAX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof bytes));
}

std::unique_ptr<GemmPlan> make_plan(const GemmContext& context, const GemmArgs& g, const GemmPlanKey& key) {
  auto plan = std::make_unique<GemmPlan>();
  plan->f64 = g.input == DType::f64;
  const cudaDataType_t in = cuda_type(g.input), out = cuda_type(g.output);
  NAX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc.handle, plan->f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
                                            plan->f64 ? CUDA_R_64F : CUDA_R_32F));
  // cuBLASLt's first operand is our B, its second our A.
  set(plan->desc.handle, CUBLASLT_MATMUL_DESC_TRANSA, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  set(plan->desc.handle, CUBLASLT_MATMUL_DESC_TRANSB, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  set(plan->desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(g.epilogue));
  if (has_bias(g.epilogue)) set(plan->desc.handle, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, out);

  // Column-major views: B^T is n x k (stored k x n row-major: ld ldb; transposed: stored n x k, a
  // k x n view with ld ldb), A^T is k x m likewise, C^T is n x m with ld ldc.
  if (g.trans_b) make_layout(plan->first, in, g.k, g.n, g.ldb, g.batch, g.stride_b);
  else make_layout(plan->first, in, g.n, g.k, g.ldb, g.batch, g.stride_b);
  if (g.trans_a) make_layout(plan->second, in, g.m, g.k, g.lda, g.batch, g.stride_a);
  else make_layout(plan->second, in, g.k, g.m, g.lda, g.batch, g.stride_a);
  make_layout(plan->result, out, g.n, g.m, g.ldc, g.batch, g.stride_c);

  Preference preference;
  NAX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference.handle));
  const std::size_t workspace = context.workspace_bytes();
  NAX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                        sizeof workspace));
  set_alignment(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);
  set_alignment(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
  set_alignment(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  set_alignment(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  NAX_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(context.handle(), plan->desc.handle, plan->first.handle, plan->second.handle,
                                                  plan->result.handle, plan->result.handle, preference.handle, 1, &result, &found));
  if (found == 0)
    fail("gemm_lt", "cuBLASLt has no algorithm for m={} n={} k={} lda={} ldb={} ldc={} batch={} {}->{}", g.m, g.n, g.k, g.lda, g.ldb,
         g.ldc, g.batch, dtype_name(g.input), dtype_name(g.output));
  plan->algo = result.algo;
  return plan;
}

GemmPlan& plan_for(GemmContext& context, const GemmArgs& g, const void* a, const void* b, const void* c) {
  auto& plans = context.plans().plans;
  const GemmPlanKey key = key_of(g, a, b, c);
  auto it = plans.find(key);
  if (it != plans.end()) return *it->second;
  if (plans.size() >= GemmPlanCache::kMaxPlans) plans.clear();
  return *plans.emplace(key, make_plan(context, g, key)).first->second;
}

}  // namespace

void gemm_lt(GemmContext& context, cudaStream_t stream, const GemmArgs& args, const void* a, const void* b, void* c) {
  check(args);
  const GemmArgs g = with_strides(args);
  DeviceGuard guard(context.device());
  GemmPlan& plan = plan_for(context, g, a, b, c);
  if (has_bias(g.epilogue)) set(plan.desc.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  const float alpha32 = static_cast<float>(g.alpha), beta32 = static_cast<float>(g.beta);
  const void* alpha = plan.f64 ? static_cast<const void*>(&g.alpha) : &alpha32;
  const void* beta = plan.f64 ? static_cast<const void*>(&g.beta) : &beta32;
  NAX_CUBLAS_CHECK(cublasLtMatmul(context.handle(), plan.desc.handle, alpha, b, plan.first.handle, a, plan.second.handle, beta, c,
                                  plan.result.handle, c, plan.result.handle, &plan.algo, context.workspace(),
                                  context.workspace_bytes(), stream));
}

}  // namespace nax::cuda
