// Row-major C = A B is column-major C^T = B^T A^T: cuBLASLt sees B as its first operand and A as
// its second, with m and n swapped; a row-major matrix r x c is the column-major c x r with
// leading dimension c, so no data moves.
#include "kernels/cuda/gemm.h"

#include "kernels/cuda/check.h"
#include "nax/core/error.h"

namespace nax::cuda {

GemmContext::GemmContext(int device, std::size_t workspace_bytes) : device_(device), workspace_bytes_(workspace_bytes) {
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
  DeviceGuard guard(device_);
  if (workspace_ != nullptr) (void)cudaFree(workspace_);
  (void)cublasLtDestroy(handle_);
}

namespace {

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    default: fail("gemm_lt", "dtype {} is not supported (f32 or bf16)", dtype_name(dtype));
  }
}

template <typename Handle, auto Destroy>
struct Owned {
  Handle handle = nullptr;
  ~Owned() {
    if (handle != nullptr) (void)Destroy(handle);
  }
};

using MatmulDesc = Owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using Layout = Owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using Preference = Owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  NAX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof value));
}

// A column-major rows x cols matrix with leading dimension ld, batched by `batch` at `stride`.
void make_layout(Layout& layout, cudaDataType_t type, std::int64_t rows, std::int64_t cols, std::int64_t ld, int batch,
                 std::int64_t stride) {
  NAX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout.handle, type, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols), ld));
  if (batch > 1) {
    NAX_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout.handle, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
    NAX_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout.handle, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
}

}  // namespace

void gemm_lt(GemmContext& context, cudaStream_t stream, const GemmArgs& args, const void* a, const void* b, void* c) {
  if (args.m <= 0 || args.n <= 0 || args.k <= 0 || args.batch <= 0)
    fail("gemm_lt", "bad shape m={} n={} k={} batch={}", args.m, args.n, args.k, args.batch);
  const bool with_bias = args.epilogue == GemmEpilogue::bias || args.epilogue == GemmEpilogue::bias_gelu;
  if (with_bias && args.bias == nullptr) fail("gemm_lt", "the bias epilogue needs a bias");
  const cudaDataType_t in = cuda_type(args.input), out = cuda_type(args.output);

  MatmulDesc desc;
  NAX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's first operand is our B, its second our A.
  set(desc.handle, CUBLASLT_MATMUL_DESC_TRANSA, args.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  set(desc.handle, CUBLASLT_MATMUL_DESC_TRANSB, args.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  switch (args.epilogue) {
    case GemmEpilogue::none: break;
    case GemmEpilogue::bias: epilogue = CUBLASLT_EPILOGUE_BIAS; break;
    case GemmEpilogue::gelu: epilogue = CUBLASLT_EPILOGUE_GELU; break;
    case GemmEpilogue::bias_gelu: epilogue = CUBLASLT_EPILOGUE_GELU_BIAS; break;
  }
  set(desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (with_bias) {
    set(desc.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER, args.bias);
    set(desc.handle, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, out);
  }

  // Column-major views: B^T is n x k (stored k x n row-major: ld n; transposed: stored n x k, ld k),
  // A^T is k x m likewise, C^T is n x m with ld n.
  Layout layout_b, layout_a, layout_c;
  if (args.trans_b) make_layout(layout_b, in, args.k, args.n, args.k, args.batch, args.stride_b);
  else make_layout(layout_b, in, args.n, args.k, args.n, args.batch, args.stride_b);
  if (args.trans_a) make_layout(layout_a, in, args.m, args.k, args.m, args.batch, args.stride_a);
  else make_layout(layout_a, in, args.k, args.m, args.k, args.batch, args.stride_a);
  make_layout(layout_c, out, args.n, args.m, args.n, args.batch, args.stride_c);

  Preference preference;
  NAX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference.handle));
  const std::size_t workspace = context.workspace_bytes();
  NAX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                        sizeof workspace));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  NAX_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(context.handle(), desc.handle, layout_b.handle, layout_a.handle, layout_c.handle,
                                                  layout_c.handle, preference.handle, 1, &result, &found));
  if (found == 0)
    fail("gemm_lt", "cuBLASLt has no algorithm for m={} n={} k={} batch={} {}->{}", args.m, args.n, args.k, args.batch,
         dtype_name(args.input), dtype_name(args.output));

  DeviceGuard guard(context.device());
  NAX_CUBLAS_CHECK(cublasLtMatmul(context.handle(), desc.handle, &args.alpha, b, layout_b.handle, a, layout_a.handle, &args.beta, c,
                                  layout_c.handle, c, layout_c.handle, &result.algo, context.workspace(), workspace, stream));
}

}  // namespace nax::cuda
