#pragma once
// CPU kernels of the row normalisations: layer_norm and (log-)softmax over contiguous rows of
// length n (the normalised axis innermost in memory), f32 or f64.
#include <cstdint>

#include "nax/core/dtype.h"
#include "nax/kernels/sum_tree.h"

namespace nax::cpu {

// y = (x - mean) * rstd * scale + bias per row, rstd = 1 / sqrt(var + eps); mean and rstd (one per
// row) are written for the backward pass. Mean and variance come from one pass over the row.
void layer_norm_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale, const void* bias,
                        double eps, void* y, void* mean, void* rstd);

// dx per row; dscale = sum over rows of dy * xhat and dbias = sum over rows of dy (overwritten).
void layer_norm_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* scale, const void* mean,
                         const void* rstd, const void* dy, void* dx, void* dscale, void* dbias,
                         const SumTree& rows_tree);
// dscale and dbias of layer_norm_backward with `rows_tree.on`: each column's terms summed over rows
// in the tree's order.
void tree_layer_norm_param_grads(DType dtype, std::int64_t rows, std::int64_t n, const void* x, const void* mean, const void* rstd,
                                 const void* dy, void* dscale, void* dbias, const SumTree& rows_tree);

// y = softmax(x) per row, or log_softmax(x) when `log`; stable (the row's max is subtracted).
void softmax_forward(DType dtype, std::int64_t rows, std::int64_t n, const void* x, void* y, bool log);

// dx from the forward's output y and dy: softmax: y * (dy - sum(dy * y)); log_softmax:
// dy - exp(y) * sum(dy).
void softmax_backward(DType dtype, std::int64_t rows, std::int64_t n, const void* y, const void* dy, void* dx, bool log);

}  // namespace nax::cpu
