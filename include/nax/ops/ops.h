#pragma once
// Ops by axis name. Elementwise ops broadcast by name: the result has the left operand's axes in
// order, then the right operand's other axes. Every op propagates the vary type (docs/ops.md).
#include <cstdint>
#include <utility>
#include <vector>

#include "nax/core/names.h"
#include "nax/tensor/tensor.h"

namespace nax {

// --- creation (on the current shard's device, or the host outside Runtime::run) ---
Tensor zeros(const Shape& shape, DType dtype = DType::f32);
Tensor ones(const Shape& shape, DType dtype = DType::f32);
Tensor full(const Shape& shape, double value, DType dtype = DType::f32);
Tensor scalar(double value, DType dtype = DType::f32);
Tensor arange(const Axis& axis, DType dtype = DType::f32);  // 0, 1, ..., axis.size-1
template <typename T>
Tensor from_vector(const Shape& shape, const std::vector<T>& values, DType dtype = dtype_of<T>());
// Counter-based random tensors: element i depends only on (seed, name, i). Shard::random_* gives
// one device's block of a global random tensor.
Tensor random_uniform(const Shape& shape, std::uint64_t seed, std::string_view name, double low = 0,
                      double high = 1, DType dtype = DType::f32);
Tensor random_normal(const Shape& shape, std::uint64_t seed, std::string_view name,
                     double stddev = 1, DType dtype = DType::f32);

// --- elementwise ---
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
// Comparisons give 1 or 0 in the operands' dtype.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor square(const Tensor& x);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

// --- contraction: sum over `contract`; axes in both operands and not contracted are batch axes.
// Result axes: batch (left order), left free, right free. ---
Tensor dot(const Tensor& a, const Tensor& b, const Names& contract);

// --- reductions over named axes (a reduction over a Split axis gives a Varying partial value) ---
Tensor sum(const Tensor& x, const Names& axes);
Tensor max(const Tensor& x, const Names& axes);
Tensor min(const Tensor& x, const Names& axes);
Tensor mean(const Tensor& x, const Names& axes);

// --- layout ---
Tensor rename(const Tensor& x, const std::string& from, const std::string& to);
Tensor rename(const Tensor& x, const std::vector<std::pair<std::string, std::string>>& renames);
Tensor transpose(const Tensor& x, const Names& order);  // a permutation of x's axes
Tensor split_axis(const Tensor& x, const std::string& axis, const std::vector<Axis>& parts);
Tensor merge_axes(const Tensor& x, const Names& axes, const std::string& merged);
Tensor slice(const Tensor& x, const std::string& axis, std::int64_t start, std::int64_t stop);
Tensor concat(const std::vector<Tensor>& xs, const std::string& axis);
Tensor cast(const Tensor& x, DType dtype);
Tensor contiguous_copy(const Tensor& x);

}  // namespace nax
