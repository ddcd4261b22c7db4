// dot: contraction over named axes through BLAS GEMM. Each operand is viewed as a (batch of)
// strided matrices without copying when its axes allow; otherwise it is permuted once.
#include <fmt/format.h>

#include <optional>
#include <set>

#include "deterministic/deterministic.h"
#include "ops/tape.h"
#include "ops/internal.h"

namespace nax {

namespace {

struct Group {  // a set of axes collapsed to one matrix dimension
  std::int64_t extent = 1;
  std::int64_t stride = 0;
};

// The group's axes as one dimension of `x`, if their strides chain (size-1 axes are ignored).
std::optional<Group> collapse(const Tensor& x, const std::vector<std::string>& axes) {
  auto strides = x.shape().strides();
  Group g;
  std::optional<std::int64_t> previous;  // stride of the previous non-trivial axis
  for (const auto& name : axes) {
    int i = x.shape().index_of(name);
    std::int64_t size = x.shape()[i].size, stride = strides[static_cast<std::size_t>(i)];
    g.extent *= size;
    if (size == 1) continue;
    if (previous && *previous != stride * size) return std::nullopt;
    previous = stride;
    g.stride = stride;
  }
  return g;
}

struct MatrixView {
  bool trans = false;
  std::int64_t ld = 1;
};

// A rows x cols matrix with the given strides as a BLAS operand, if its layout allows.
std::optional<MatrixView> as_matrix(const Group& rows, const Group& cols) {
  const std::int64_t R = rows.extent, C = cols.extent;
  if (C <= 1 || cols.stride == 1) {
    std::int64_t ld = R <= 1 ? std::max<std::int64_t>(C, 1) : rows.stride;
    if (ld >= std::max<std::int64_t>(C, 1)) return MatrixView{false, ld};
  }
  if (R <= 1 || rows.stride == 1) {
    std::int64_t ld = C <= 1 ? std::max<std::int64_t>(R, 1) : cols.stride;
    if (ld >= std::max<std::int64_t>(R, 1)) return MatrixView{true, ld};
  }
  return std::nullopt;
}

struct Operand {
  MatrixView view;
  Group rows, cols;
};

std::optional<Operand> view_operand(const Tensor& x, const std::vector<std::string>& row_axes, const std::vector<std::string>& col_axes) {
  auto rows = collapse(x, row_axes);
  auto cols = collapse(x, col_axes);
  if (!rows || !cols) return std::nullopt;
  auto view = as_matrix(*rows, *cols);
  if (!view) return std::nullopt;
  return Operand{*view, *rows, *cols};
}

std::vector<std::string> in_memory_order(const Tensor& x, const std::set<std::string>& names) {
  std::vector<std::string> out;
  for (const auto& a : x.shape().axes())
    if (names.count(a.name)) out.push_back(a.name);
  return out;
}

std::vector<std::string> concat_names(std::initializer_list<const std::vector<std::string>*> lists) {
  std::vector<std::string> out;
  for (const auto* l : lists) out.insert(out.end(), l->begin(), l->end());
  return out;
}

struct GemmView {
  Operand a, b;
  std::int64_t m, n, k;
};

// The batch's operand offsets as one stride, when they step evenly.
std::optional<std::int64_t> even_stride(const std::vector<std::int64_t>& offsets) {
  const std::int64_t stride = offsets.size() > 1 ? offsets[1] - offsets[0] : 0;
  for (std::size_t t = 0; t < offsets.size(); ++t)
    if (offsets[t] != static_cast<std::int64_t>(t) * stride) return std::nullopt;
  return stride;
}

// out[t] = a[t] b[t] for every index t of the batch axes: one strided-batched GEMM when both
// operands step evenly through the batch, else one GEMM per index.
void run_gemms(const Tensor& a, const Tensor& b, Tensor& out, const std::vector<Axis>& batch_axes, const GemmView& g,
               const SumTree& tree) {
  const auto rank = static_cast<int>(batch_axes.size());
  const kernels::Dims sizes = detail::sizes_of(batch_axes);
  const auto offsets_a = kernels::strided_offsets(sizes.data(), detail::strides_in_order(a.shape(), batch_axes).data(), rank);
  const auto offsets_b = kernels::strided_offsets(sizes.data(), detail::strides_in_order(b.shape(), batch_axes).data(), rank);
  kernels::GemmShape shape{.trans_a = g.a.view.trans, .trans_b = g.b.view.trans, .m = g.m, .n = g.n, .k = g.k,
                           .lda = g.a.view.ld, .ldb = g.b.view.ld, .ldc = std::max<std::int64_t>(g.n, 1), .stride_c = g.m * g.n,
                           .tree = tree};
  const auto stride_a = even_stride(offsets_a), stride_b = even_stride(offsets_b);
  const std::size_t es = dtype_size(a.dtype());
  const auto* pa = static_cast<const char*>(a.raw());
  const auto* pb = static_cast<const char*>(b.raw());
  auto* pc = static_cast<char*>(out.raw_mutable());
  kernels::Kernels& kernels = detail::kernels_of(out);
  if (stride_a && stride_b) {
    shape.batch = static_cast<std::int64_t>(offsets_a.size()), shape.stride_a = *stride_a, shape.stride_b = *stride_b;
    kernels.gemm(a.dtype(), shape, pa, pb, pc);
    return;
  }
  for (std::size_t t = 0; t < offsets_a.size(); ++t)
    kernels.gemm(a.dtype(), shape, pa + offsets_a[t] * static_cast<std::int64_t>(es), pb + offsets_b[t] * static_cast<std::int64_t>(es),
                 pc + static_cast<std::int64_t>(t) * shape.stride_c * static_cast<std::int64_t>(es));
}

}  // namespace

Tensor dot_forward(const Tensor& a_in, const Tensor& b_in, const Names& contract) {
  const auto op_span = detail::enter_op("dot", {{&a_in, OnPartial::scale}, {&b_in, OnPartial::scale}});
  detail::check_same_dtype("dot", a_in, b_in);
  if (!is_floating(a_in.dtype())) fail("dot", "needs a floating dtype (f32, f64, bf16): {}", detail::describe({&a_in, &b_in}));
  std::set<std::string> k_set;
  for (const auto& k : contract.list()) {
    int ia = a_in.shape().index_of(k), ib = b_in.shape().index_of(k);
    if (ia < 0 || ib < 0)
      fail("dot", "contracted axis '{}' is missing on the {}: {}", k, ia < 0 ? "left" : "right", detail::describe({&a_in, &b_in}));
    if (a_in.shape()[ia].size != b_in.shape()[ib].size)
      fail("dot", "contracted axis '{}' has size {} on the left and {} on the right: {}", k, a_in.shape()[ia].size,
           b_in.shape()[ib].size, detail::describe({&a_in, &b_in}));
    if (!k_set.insert(k).second)
      fail("dot", "axis '{}' contracted twice in {}: {}", k, contract.str(), detail::describe({&a_in, &b_in}));
  }
  VaryType vary = detail::merge_vary("dot", {&a_in, &b_in}, contract.list());
  if (a_in.dtype() == DType::bf16 && deterministic::on())  // the message's text only when it may be needed
    deterministic::check_partial_result("dot", vary, a_in.dtype(), detail::describe({&a_in, &b_in}));
  // bf16 on a device that computes it in f32: widened, unless its GEMM takes bf16 itself (not in
  // deterministic mode, whose tree GEMM sums in f32).
  if (detail::needs_widening(a_in) && (deterministic::on() || !detail::kernels_of(a_in).gemm_computes(DType::bf16)))
    return detail::narrow_to(dot_forward(detail::widen(a_in), detail::widen(b_in), contract), DType::bf16);

  std::vector<std::string> batch, a_free, b_free;
  for (const auto& axis : a_in.shape().axes()) {
    if (k_set.count(axis.name)) continue;
    int ib = b_in.shape().index_of(axis.name);
    if (ib < 0) {
      a_free.push_back(axis.name);
    } else {
      if (b_in.shape()[ib].size != axis.size)
        fail("dot", "batch axis '{}' has size {} on the left and {} on the right: {}", axis.name, axis.size,
             b_in.shape()[ib].size, detail::describe({&a_in, &b_in}));
      batch.push_back(axis.name);
    }
  }
  for (const auto& axis : b_in.shape().axes())
    if (!k_set.count(axis.name) && !a_in.shape().has(axis.name)) b_free.push_back(axis.name);

  std::vector<Axis> out_axes;
  for (const auto& n : batch) out_axes.push_back({n, a_in.shape().size(n)});
  for (const auto& n : a_free) out_axes.push_back({n, a_in.shape().size(n)});
  for (const auto& n : b_free) out_axes.push_back({n, b_in.shape().size(n)});
  Shape shape(out_axes);
  Tensor out = detail::make_result(shape, a_in.dtype(), vary, a_in.device_ptr());
  std::int64_t K = 1;
  for (const auto& k : k_set) K *= a_in.shape().size(k);
  if (out.numel() == 0) return out;
  if (K == 0) {
    detail::kernels_of(out).fill(out.dtype(), out.raw_mutable(), out.numel(), 0.0);
    return out;
  }

  // Contracted axes in an order both operands can collapse, trying each operand's memory order.
  // Deterministic mode keeps the left operand's order: whether a view exists can depend on which
  // axes have one element on this device, and the order of the sum must not.
  Tensor a = a_in, b = b_in;
  std::vector<std::string> k_order = in_memory_order(a, k_set);
  auto va = view_operand(a, a_free, k_order);
  auto vb = view_operand(b, k_order, b_free);
  const SumTree tree = deterministic::sum_tree("dot", a, k_order);
  if ((!va || !vb) && !tree.on) {
    auto k_b = in_memory_order(b, k_set);
    auto va2 = view_operand(a, a_free, k_b);
    auto vb2 = view_operand(b, k_b, b_free);
    if (va2 && vb2) {
      k_order = k_b, va = va2, vb = vb2;
    }
  }
  if (!va) {
    a = detail::permute_to(a, concat_names({&batch, &a_free, &k_order}));
    va = view_operand(a, a_free, k_order);
  }
  if (!vb) {
    b = detail::permute_to(b, concat_names({&batch, &k_order, &b_free}));
    vb = view_operand(b, k_order, b_free);
  }
  if (!va || !vb) fail("dot", "internal error: no GEMM view of {}", detail::describe({&a, &b}));
  const std::int64_t M = va->rows.extent, N = vb->cols.extent;

  std::vector<Axis> batch_axes(out_axes.begin(), out_axes.begin() + static_cast<std::ptrdiff_t>(batch.size()));
  run_gemms(a, b, out, batch_axes, GemmView{*va, *vb, M, N, K}, tree);
  return out;
}

namespace {

// The axis order dot(x, y, contract) produces: batch axes (x's order), x's free axes, y's free axes.
std::vector<std::string> dot_result_order(const Tensor& x, const Tensor& y, const std::vector<std::string>& contract) {
  std::vector<std::string> batch, x_free, y_free;
  auto contracted = [&](const std::string& n) { return std::find(contract.begin(), contract.end(), n) != contract.end(); };
  for (const auto& a : x.shape().axes())
    if (!contracted(a.name)) (y.shape().has(a.name) ? batch : x_free).push_back(a.name);
  for (const auto& a : y.shape().axes())
    if (!contracted(a.name) && !x.shape().has(a.name)) y_free.push_back(a.name);
  return concat_names({&batch, &x_free, &y_free});
}

// dot(x, y, contract) or dot(y, x, contract), whichever comes out in `target`'s axis order (the
// same values either way; the right order spares the autodiff a transpose).
Tensor dot_in_order_of(const Tensor& target, const Tensor& x, const Tensor& y, const std::vector<std::string>& contract) {
  if (dot_result_order(x, y, contract) != target.shape().names() && dot_result_order(y, x, contract) == target.shape().names())
    return dot(y, x, contract);
  return dot(x, y, contract);
}

}  // namespace

// d/da = g . b over b's free axes; d/db = a . g over a's free axes (batch axes stay batch axes).
Tensor dot(const Tensor& a, const Tensor& b, const Names& contract) {
  Tensor out = dot_forward(a, b, contract);
  if (!autodiff::any_requires_grad({&a, &b})) return out;
  return autodiff::record("dot", out, {a, b}, [a, b](const Tensor& g) {
    std::vector<std::string> a_free, b_free;
    for (const auto& axis : a.shape().axes())
      if (!b.shape().has(axis.name)) a_free.push_back(axis.name);
    for (const auto& axis : b.shape().axes())
      if (!a.shape().has(axis.name)) b_free.push_back(axis.name);
    return std::vector<Tensor>{a.requires_grad() ? dot_in_order_of(a, g, b, b_free) : Tensor(),
                               b.requires_grad() ? dot_in_order_of(b, a, g, a_free) : Tensor()};
  });
}

}  // namespace nax
