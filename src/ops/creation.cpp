// Tensor creation: constants, ranges, host data and counter-based random tensors.
#include "nax/core/rng.h"
#include "ops/internal.h"

namespace nax {

Tensor full(const Shape& shape, double value, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  detail::kernels_of(t).fill(dtype, t.raw_mutable(), t.numel(), value);
  return t;
}

Tensor zeros(const Shape& shape, DType dtype) { return full(shape, 0.0, dtype); }
Tensor ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }
Tensor scalar(double value, DType dtype) { return full(Shape{}, value, dtype); }

Tensor arange(const Axis& axis, DType dtype) {
  std::vector<double> values(static_cast<std::size_t>(axis.size));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i);
  return from_vector(Shape{axis}, values, dtype);
}

template <typename T>
Tensor from_vector(const Shape& shape, const std::vector<T>& values, DType dtype) {
  if (static_cast<std::int64_t>(values.size()) != shape.numel())
    fail("from_vector", "{} values for shape {} of {} elements", values.size(), shape.str(), shape.numel());
  Tensor host = Tensor::empty(shape, dtype, Device::host());
  kernels::cpu_kernels_ptr()->convert(dtype_of<T>(), values.data(), dtype, host.raw_mutable(), host.numel());
  return detail::transfer(host, detail::current_device());
}
template Tensor from_vector<float>(const Shape&, const std::vector<float>&, DType);
template Tensor from_vector<double>(const Shape&, const std::vector<double>&, DType);
template Tensor from_vector<std::int32_t>(const Shape&, const std::vector<std::int32_t>&, DType);
template Tensor from_vector<bf16>(const Shape&, const std::vector<bf16>&, DType);

namespace detail {
// The block of a global random tensor of shape `global` that starts at `offsets`, of shape `local`.
Tensor random_block(const Shape& global, const Shape& local, const std::vector<std::int64_t>& offsets,
                    std::uint64_t seed, std::string_view name, DType dtype, bool normal, double a, double b) {
  if (!is_floating(dtype)) fail("random", "dtype {} is not a floating type", dtype_name(dtype));
  rng::Key key = rng::make_key(seed, name);
  std::vector<double> values(static_cast<std::size_t>(local.numel()));
  auto global_strides = global.strides();
  std::vector<std::int64_t> index(static_cast<std::size_t>(local.rank()), 0);
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::uint64_t g = 0;
    for (std::size_t d = 0; d < index.size(); ++d) g += static_cast<std::uint64_t>((index[d] + offsets[d]) * global_strides[d]);
    values[i] = normal ? a * rng::normal(key, g) : a + (b - a) * rng::uniform(key, g);
    for (std::size_t d = index.size(); d-- > 0;) {
      if (++index[d] < local[static_cast<int>(d)].size) break;
      index[d] = 0;
    }
  }
  return from_vector(local, values, dtype);
}
}  // namespace detail

Tensor random_uniform(const Shape& shape, std::uint64_t seed, std::string_view name, double low, double high, DType dtype) {
  return detail::random_block(shape, shape, std::vector<std::int64_t>(static_cast<std::size_t>(shape.rank()), 0), seed, name,
                              dtype, false, low, high);
}

Tensor random_normal(const Shape& shape, std::uint64_t seed, std::string_view name, double stddev, DType dtype) {
  return detail::random_block(shape, shape, std::vector<std::int64_t>(static_cast<std::size_t>(shape.rank()), 0), seed, name,
                              dtype, true, stddev, 0);
}

}  // namespace nax
