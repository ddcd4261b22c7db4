#include "tensor/copies.h"

namespace nax::detail {

kernels::Dims strides_in_order(const Shape& x, const std::vector<Axis>& axes) {
  kernels::Dims out{};
  auto strides = x.strides();
  for (std::size_t i = 0; i < axes.size(); ++i) {
    int j = x.index_of(axes[i].name);
    out[i] = j < 0 ? 0 : strides[static_cast<std::size_t>(j)];
  }
  return out;
}

kernels::Dims sizes_of(const std::vector<Axis>& axes) {
  kernels::Dims out{};
  for (std::size_t i = 0; i < axes.size(); ++i) out[i] = axes[i].size;
  return out;
}

Tensor broadcast_to(const Tensor& g, const Shape& shape) {
  Tensor out = Tensor::empty(shape, g.dtype(), g.device_ptr());
  if (!g.vary().invariant()) out = out.with_vary(g.vary());
  kernels_of(out).copy(dtype_size(g.dtype()), g.raw(), out.raw_mutable(), layout_over(shape.axes(), g.shape(), shape));
  return out;
}

void regroup(const Tensor& src, Tensor& dst, std::int64_t outer, std::int64_t n, std::int64_t chunk, bool inverse) {
  kernels::Layout<2> l;
  l.rank = 3;
  l.sizes = {outer, n, chunk};
  kernels::Dims by_outer{n * chunk, chunk, 1}, by_rank{chunk, outer * chunk, 1};
  l.strides[0] = inverse ? by_rank : by_outer;
  l.strides[1] = inverse ? by_outer : by_rank;
  kernels_of(dst).copy(dtype_size(src.dtype()), src.raw(), dst.raw_mutable(), l);
}

Tensor converted(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = Tensor::empty(x.shape(), dtype, x.device_ptr());
  if (!x.vary().invariant()) out = out.with_vary(x.vary());
  kernels_of(out).convert(x.dtype(), x.raw(), dtype, out.raw_mutable(), x.numel());
  return out;
}

}  // namespace nax::detail
