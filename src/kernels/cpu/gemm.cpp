#include <cblas.h>

#include "kernels/cpu/kernels.h"

namespace nax::cpu {

void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          const void* a, std::int64_t lda, const void* b, std::int64_t ldb, void* c, std::int64_t ldc, double beta,
          const SumTree& tree) {
  if (tree.on)
    return tree_gemm(dtype, {.trans_a = trans_a, .trans_b = trans_b, .m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc,
                             .beta = beta, .tree = tree},
                     a, b, c);
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  const auto M = static_cast<blasint>(m), N = static_cast<blasint>(n), K = static_cast<blasint>(k);
  switch (dtype) {
    case DType::f32:
      cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, static_cast<const float*>(a), static_cast<blasint>(lda),
                  static_cast<const float*>(b), static_cast<blasint>(ldb), static_cast<float>(beta), static_cast<float*>(c),
                  static_cast<blasint>(ldc));
      return;
    case DType::f64:
      cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, static_cast<const double*>(a), static_cast<blasint>(lda),
                  static_cast<const double*>(b), static_cast<blasint>(ldb), beta, static_cast<double*>(c),
                  static_cast<blasint>(ldc));
      return;
    default:
      fail("gemm", "unsupported dtype {}", dtype_name(dtype));
  }
}

void set_blas_threads(int threads) { openblas_set_num_threads(threads); }
int blas_threads() { return openblas_get_num_threads(); }

}  // namespace nax::cpu
