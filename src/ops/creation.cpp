// Tensor creation: constants, ranges, host data and counter-based random tensors.
#include <algorithm>
#include <cmath>
#include <thread>

#include "nax/core/rng.h"
#include "ops/internal.h"

namespace nax {

Tensor full(const Shape& shape, double value, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  detail::kernels_of(t).fill(dtype, t.raw_mutable(), t.numel(), value);
  return value == 0.0 && !std::signbit(value) ? t.as_known_zero() : t;
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
  return detail::transfer(host, Device::current());
}
template Tensor from_vector<float>(const Shape&, const std::vector<float>&, DType);
template Tensor from_vector<double>(const Shape&, const std::vector<double>&, DType);
template Tensor from_vector<std::int32_t>(const Shape&, const std::vector<std::int32_t>&, DType);
template Tensor from_vector<bf16>(const Shape&, const std::vector<bf16>&, DType);

namespace {
// Where the elements of a random block come from: local element i (row-major in `local`) is global
// element index_of(i) of the tensor of shape `global`; runs of `run` elements (the trailing axes up
// to and including the last cut one: the whole block when nothing is cut) are consecutive.
struct BlockIndex {
  std::vector<std::int64_t> local_strides, global_strides, offsets, sizes;
  std::int64_t run = 1;

  std::uint64_t index_of(std::int64_t i) const {
    std::uint64_t g = 0;
    for (std::size_t d = 0; d < sizes.size(); ++d)
      g += static_cast<std::uint64_t>((i / local_strides[d] % sizes[d] + offsets[d]) * global_strides[d]);
    return g;
  }
};

// Elements [begin, end) of the block, in chunks of consecutive counters converted straight to dtype.
void fill_random(const BlockIndex& block, std::int64_t begin, std::int64_t end, rng::Key key, DType dtype, bool normal,
                 double a, double b, std::byte* out) {
  constexpr std::int64_t chunk = 2048;
  std::vector<double> values(chunk);
  std::vector<float> floats(dtype == DType::bf16 ? chunk : 0);
  const std::size_t size = dtype_size(dtype);
  auto& cpu = *kernels::cpu_kernels_ptr();
  for (std::int64_t i = begin; i < end;) {
    const std::int64_t n = std::min({chunk, end - i, block.run - i % block.run});
    const std::uint64_t first = block.index_of(i);
    std::byte* dst = out + static_cast<std::size_t>(i) * size;
    if (normal && dtype == DType::f32) {
      rng::normal_run_f32(key, first, n, a, reinterpret_cast<float*>(dst));
    } else if (normal && dtype == DType::bf16) {
      rng::normal_run_f32(key, first, n, a, floats.data());
      cpu.convert(DType::f32, floats.data(), dtype, dst, n);
    } else {
      if (normal) {
        rng::normal_run(key, first, n, values.data());
        for (std::int64_t j = 0; j < n; ++j) values[j] = a * values[j];
      } else {
        rng::uniform_run(key, first, n, values.data());
        for (std::int64_t j = 0; j < n; ++j) values[j] = a + (b - a) * values[j];
      }
      cpu.convert(DType::f64, values.data(), dtype, dst, n);
    }
    i += n;
  }
}
}  // namespace

namespace detail {
// The block of a global random tensor of shape `global` that starts at `offsets`, of shape `local`:
// generated on the host by every core (vectorised Philox), then moved to the current device.
Tensor random_block(const Shape& global, const Shape& local, const std::vector<std::int64_t>& offsets,
                    std::uint64_t seed, std::string_view name, DType dtype, bool normal, double a, double b) {
  if (!is_floating(dtype)) fail("random", "dtype {} is not a floating type", dtype_name(dtype));
  const rng::Key key = rng::make_key(seed, name);
  BlockIndex block{local.strides(), global.strides(), offsets, {}};
  for (int d = 0; d < local.rank(); ++d) block.sizes.push_back(local[d].size);
  for (int d = local.rank(); d-- > 0;) {
    block.run *= local[d].size;
    if (local[d].size != global[d].size) break;
  }
  block.run = std::max<std::int64_t>(block.run, 1);
  Tensor host = Tensor::empty(local, dtype, Device::host());
  auto* out = static_cast<std::byte*>(host.raw_mutable());
  const std::int64_t numel = local.numel();
  constexpr std::int64_t per_thread = std::int64_t{1} << 18;
  const auto threads = static_cast<std::int64_t>(
      std::clamp<std::int64_t>(numel / per_thread, 1, std::max(1u, std::thread::hardware_concurrency())));
  std::vector<std::thread> workers;
  for (std::int64_t t = 1; t < threads; ++t)
    workers.emplace_back(fill_random, std::cref(block), numel * t / threads, numel * (t + 1) / threads, key, dtype, normal, a, b, out);
  fill_random(block, 0, numel / threads, key, dtype, normal, a, b, out);
  for (auto& w : workers) w.join();
  return detail::transfer(host, Device::current());
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
