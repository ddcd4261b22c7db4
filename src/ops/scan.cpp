// cumsum: a prefix sum along one whole axis, by the device's row kernel (kernels::scan_rows), or
// where a backend has none as log2(n) shifted adds (Hillis-Steele) of the layout and elementwise
// ops. Its gradient is the reverse prefix sum.
#include "ops/tape.h"
#include "nax/ops/index_ops.h"
#include "ops/across_blocks.h"
#include "ops/row_ops.h"

namespace nax {

namespace {

// v shifted by `by` along `axis` (towards higher indices, or lower when `reverse`), zero-filled.
Tensor shifted(const Tensor& v, const std::string& axis, std::int64_t by, bool reverse) {
  const std::int64_t n = v.size(axis);
  if (by >= n) return zeros_like(v);
  const Tensor kept = reverse ? slice(v, axis, by, n) : slice(v, axis, 0, n - by);
  const Tensor fill = zeros_like(slice(v, axis, 0, by));
  return reverse ? concat({kept, fill}, axis) : concat({fill, kept}, axis);
}

// Prefix sums of v (no history) along `axis`: inclusive or exclusive, forwards or reversed.
Tensor composed_scan(const Tensor& v, const std::string& axis, bool exclusive, bool reverse) {
  Tensor y = v;
  for (std::int64_t by = 1; by < v.size(axis); by *= 2) y = y + shifted(y, axis, by, reverse);
  return exclusive ? shifted(y, axis, 1, reverse) : y;
}

Tensor scan(const Tensor& v, const std::string& axis, bool exclusive, bool reverse) {
  if (v.numel() == 0) return zeros_like(v);
  const std::int64_t n = v.size(axis);
  const Tensor rows = detail::permute_to(v, detail::order_with_last(v.shape(), axis));
  Tensor out = detail::make_result(rows.shape(), rows.dtype(), rows.vary(), rows.device_ptr());
  if (detail::kernels_of(out).scan_rows(rows.dtype(), rows.numel() / n, n, rows.raw(), out.raw_mutable(), exclusive, reverse))
    return detail::permute_to(out, v.shape().names());
  return composed_scan(v, axis, exclusive, reverse);
}

}  // namespace

Tensor cumsum(const Tensor& x, const std::string& axis, bool exclusive) {
  const auto op_span = detail::enter_op("cumsum", {{&x, OnPartial::scale}});
  x.shape().require(axis, "cumsum");
  if (!x.vary().split_mesh_axes(axis).empty()) return detail::cumsum_across_blocks(x, axis, exclusive);
  const Tensor out = detail::narrow_to(scan(detail::compute_values(x), axis, exclusive, false), x.dtype());
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record("cumsum", out, {x}, [axis, exclusive](const Tensor& g) {
    return std::vector<Tensor>{detail::narrow_to(scan(detail::widen(g), axis, exclusive, true), g.dtype())};
  });
}

}  // namespace nax
