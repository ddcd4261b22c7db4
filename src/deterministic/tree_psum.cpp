// psum and psum_scatter in the canonical order: the ranks' values gathered and added in the
// halving tree, and a sum of partial sums finished term by term (docs/determinism.md).
#include <functional>

#include "deterministic/deterministic.h"
#include "nax/trace/trace.h"
#include "tensor/copies.h"

namespace nax::deterministic {

namespace {

// The ranks' values, gathered rank-major `stride` elements apart, are added over the ranks in the
// halving order of the canonical tree (pairs, then pairs of pairs) at `offset`..`offset + count`
// within each: ranks hold the global blocks in rank order, so the bits depend neither on the mesh
// nor on the backend's reduction algorithm. The sum is left in rank 0's part.
void add_ranks_in_tree(Tensor& gathered, int n, std::int64_t stride, std::int64_t offset, std::int64_t count) {
  auto& kernels = detail::kernels_of(gathered);
  const std::size_t es = dtype_size(gathered.dtype());
  auto* base = static_cast<char*>(gathered.raw_mutable());
  auto at = [&](int rank) { return base + (static_cast<std::int64_t>(rank) * stride + offset) * static_cast<std::int64_t>(es); };
  for (int step = 1; step < n; step *= 2)
    for (int i = 0; i + step < n; i += 2 * step)
      kernels.accumulate(ReduceOp::sum, gathered.dtype(), at(i), at(i + step), static_cast<std::size_t>(count));
}

// The sum psum finishes, as the tree of adds that made it: leaves are the partial sums psum adds
// over the ranks, inner nodes the adds of two of them (node index 0 is the root). A sum whose parts
// are not all partial sums over the reduced mesh axes is one leaf.
struct SumExpression {
  struct Node {
    int leaf = -1;  // index into leaves, or -1 for an add
    int left = -1, right = -1;
  };
  std::vector<Node> nodes;
  std::vector<Tensor> leaves;

  static SumExpression of(const Tensor& x, const Names& mesh_axes) {
    SumExpression e;
    if (!all_partial(x, mesh_axes)) {
      e.nodes.push_back({0, -1, -1});
      e.leaves.push_back(x);
      return e;
    }
    e.add(x);
    return e;
  }

 private:
  static bool all_partial(const Tensor& x, const Names& mesh_axes) {
    for (const auto& t : terms_of(x))
      if (!all_partial(t, mesh_axes)) return false;
    for (const auto& m : mesh_axes.list())
      if (!x.vary().partial_sum(m)) return false;
    return true;
  }
  int add(const Tensor& x) {
    const int index = static_cast<int>(nodes.size());
    nodes.emplace_back();
    const std::vector<Tensor> terms = terms_of(x);
    if (terms.size() != 2) {
      nodes[static_cast<std::size_t>(index)].leaf = static_cast<int>(leaves.size());
      leaves.push_back(x);
      return index;
    }
    const int left = add(terms[0]);
    const int right = add(terms[1]);
    nodes[static_cast<std::size_t>(index)].left = left, nodes[static_cast<std::size_t>(index)].right = right;
    return index;
  }
};

// The expression's value from its leaves' sums over the ranks (count elements each, leaf i at
// sums + i * stride elements): each add in place into its left operand's buffer, in the order the
// adds were made.
char* evaluate(const SumExpression& e, int node, char* sums, std::int64_t count, std::int64_t stride, DType dtype,
               kernels::Kernels& kernels) {
  const auto& n = e.nodes[static_cast<std::size_t>(node)];
  if (n.leaf >= 0) return sums + static_cast<std::size_t>(n.leaf) * static_cast<std::size_t>(stride) * dtype_size(dtype);
  char* left = evaluate(e, n.left, sums, count, stride, dtype, kernels);
  const char* right = evaluate(e, n.right, sums, count, stride, dtype, kernels);
  kernels.accumulate(ReduceOp::sum, dtype, left, right, static_cast<std::size_t>(count));
  return left;
}

// Every leaf of the expression (in its summed dtype, laid out by `arrange`) end to end, and the
// started all_gather of all ranks' copies of that, rank-major: [ranks, leaves * whole].
Tensor gather_leaves(Communicator& comm, const Call& call, const SumExpression& expression, DType dtype, std::int64_t whole,
                     const std::function<Tensor(const Tensor&)>& arrange, detail::Launch& launch) {
  const std::size_t es = dtype_size(dtype);
  const std::int64_t total = whole * static_cast<std::int64_t>(expression.leaves.size());
  Tensor stacked = Tensor::empty(Shape{{"leaves", total}}, dtype, expression.leaves[0].device_ptr());
  for (std::size_t t = 0; t < expression.leaves.size(); ++t) {
    const Tensor leaf = arrange(detail::converted(expression.leaves[t], dtype));
    detail::kernels_of(stacked).copy_bytes(static_cast<char*>(stacked.raw_mutable()) + t * whole * es, leaf.raw(), whole * es);
  }
  Tensor gathered = Tensor::empty(Shape{{"ranks", comm.size()}, {"leaves", total}}, dtype, stacked.device_ptr());
  launch.keep({stacked, gathered});
  launch.all_gather(comm, stacked.raw(), gathered.raw_mutable(), static_cast<std::size_t>(total), dtype, call);
  return gathered;
}

// The expression's value over elements [offset, offset + block) of every leaf, from the gathered
// copies: each leaf's ranks added in the canonical tree, then the expression's adds redone, written
// to `out`.
void sum_block(Tensor& gathered, const SumExpression& expression, int n, std::int64_t whole, std::int64_t offset, std::int64_t block,
               Tensor& out) {
  const std::int64_t total = whole * static_cast<std::int64_t>(expression.leaves.size());
  for (std::size_t t = 0; t < expression.leaves.size(); ++t)
    add_ranks_in_tree(gathered, n, total, static_cast<std::int64_t>(t) * whole + offset, block);
  auto& kernels = detail::kernels_of(gathered);
  const std::size_t es = dtype_size(gathered.dtype());
  char* first = static_cast<char*>(gathered.raw_mutable()) + static_cast<std::size_t>(offset) * es;
  kernels.copy_bytes(out.raw_mutable(), evaluate(expression, 0, first, block, whole, gathered.dtype(), kernels),
                     static_cast<std::size_t>(block) * es);
}

// The psum's result in the operand's dtype: rounded from the summed one, a result of its own.
Tensor narrowed(const Tensor& out, DType dtype) { return out.dtype() == dtype ? out : trace::made(detail::converted(out, dtype)); }

}  // namespace

DType summed_dtype(DType dtype) { return dtype == DType::bf16 ? DType::f32 : dtype; }

Tensor psum(Communicator& comm, const Call& call, const Tensor& x, const Names& mesh_axes, const VaryType& vary, detail::Launch& launch) {
  const SumExpression expression = SumExpression::of(x, mesh_axes);
  const std::int64_t whole = x.numel();
  Tensor gathered = gather_leaves(comm, call, expression, summed_dtype(x.dtype()), whole, [](const Tensor& t) { return t; }, launch);
  return launch.then([gathered, expression, n = comm.size(), whole, shape = x.shape(), vary, narrow = x.dtype()]() mutable {
    Tensor out = Tensor::empty(shape, gathered.dtype(), gathered.device_ptr());
    if (!vary.invariant()) out = out.with_vary(vary);
    trace::made(out);
    sum_block(gathered, expression, n, whole, 0, whole, out);
    return narrowed(out, narrow);
  });
}

Tensor psum_scatter(Communicator& comm, const Call& call, const Tensor& x, const Names& mesh_axes, Tensor out, std::int64_t outer,
                    detail::Launch& launch) {
  const SumExpression expression = SumExpression::of(x, mesh_axes);
  const std::int64_t whole = x.numel(), block = out.numel();
  const int n = comm.size();
  auto by_rank = [&](const Tensor& leaf) {
    if (outer == 1) return leaf;
    Tensor grouped = Tensor::empty(Shape{{"rank", n}, {"block", block}}, leaf.dtype(), leaf.device_ptr());
    detail::regroup(leaf, grouped, outer, n, block / outer, false);
    return grouped;
  };
  Tensor gathered = gather_leaves(comm, call, expression, out.dtype(), whole, by_rank, launch);
  return launch.then([gathered, out, expression, n, rank = comm.rank(), whole, block, narrow = x.dtype()]() mutable {
    sum_block(gathered, expression, n, whole, static_cast<std::int64_t>(rank) * block, block, out);
    return narrowed(out, narrow);
  });
}

}  // namespace nax::deterministic
