// psum and psum_scatter in the canonical order: the ranks' values added in the halving tree, by
// the communicator's own reduction where it adds in that order (Communicator::adds_in_rank_tree),
// else gathered and added here; a sum of partial sums finished term by term (docs/determinism.md).
#include <atomic>
#include <functional>

#include "deterministic/deterministic.h"
#include "nax/trace/trace.h"
#include "tensor/copies.h"

namespace nax::deterministic {

namespace {

std::atomic<bool> gather_psums{false};  // GatherPsumsForTesting

// out = a + b over `count` elements (the last add of a tree, written where its result goes).
void add_into(kernels::Kernels& kernels, DType dtype, const void* a, const void* b, void* out, std::int64_t count) {
  const kernels::Layout<3> flat{.rank = 1, .sizes = {count}, .strides = {{{1}, {1}, {1}}}};
  kernels.binary(kernels::BinaryOp::add, dtype, a, b, out, flat);
}

// A psum's fresh result, typed `vary` and recorded as an op's (detail::make_result's work; that
// one lives in the op layer above).
Tensor fresh_result(const Shape& shape, DType dtype, const VaryType& vary, const std::shared_ptr<Device>& device) {
  Tensor out = Tensor::empty(shape, dtype, device);
  if (!vary.invariant()) out = out.with_vary(vary);
  return trace::made(out);
}

// The ranks' values, gathered rank-major `stride` elements apart, are added over the ranks in the
// halving order of the canonical tree (pairs, then pairs of pairs) at `offset`..`offset + count`
// within each: ranks hold the global blocks in rank order, so the bits depend neither on the mesh
// nor on the backend's reduction algorithm. The sum is left in rank 0's part, or with `root_out`
// the last add (the tree's root) writes it there instead.
void add_ranks_in_tree(Tensor& gathered, int n, std::int64_t stride, std::int64_t offset, std::int64_t count,
                       void* root_out = nullptr) {
  auto& kernels = detail::kernels_of(gathered);
  const std::size_t es = dtype_size(gathered.dtype());
  auto* base = static_cast<char*>(gathered.raw_mutable());
  auto at = [&](int rank) { return base + (static_cast<std::int64_t>(rank) * stride + offset) * static_cast<std::int64_t>(es); };
  for (int step = 1; step < n; step *= 2)
    for (int i = 0; i + step < n; i += 2 * step) {
      if (root_out != nullptr && i == 0 && 2 * step >= n)
        return add_into(kernels, gathered.dtype(), at(0), at(step), root_out, count);
      kernels.accumulate(ReduceOp::sum, gathered.dtype(), at(i), at(i + step), static_cast<std::size_t>(count));
    }
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
// adds were made; the last (the root's) writes `out`.
char* evaluate(const SumExpression& e, int node, char* sums, std::int64_t count, std::int64_t stride, DType dtype,
               kernels::Kernels& kernels, void* out = nullptr) {
  const auto& n = e.nodes[static_cast<std::size_t>(node)];
  if (n.leaf >= 0) {
    char* value = sums + static_cast<std::size_t>(n.leaf) * static_cast<std::size_t>(stride) * dtype_size(dtype);
    if (out != nullptr) kernels.copy_bytes(out, value, static_cast<std::size_t>(count) * dtype_size(dtype));
    return value;
  }
  char* left = evaluate(e, n.left, sums, count, stride, dtype, kernels);
  const char* right = evaluate(e, n.right, sums, count, stride, dtype, kernels);
  if (out == nullptr) {
    kernels.accumulate(ReduceOp::sum, dtype, left, right, static_cast<std::size_t>(count));
    return left;
  }
  add_into(kernels, dtype, left, right, out, count);
  return static_cast<char*>(out);
}

// Every leaf of the expression in `dtype`, laid out by `arrange` (each leaf `whole` elements after
// it), end to end as [leaves * whole]; a lone leaf is used where it is.
Tensor stacked_leaves(const SumExpression& expression, DType dtype, std::int64_t whole,
                      const std::function<Tensor(const Tensor&)>& arrange) {
  if (expression.leaves.size() == 1) return arrange(detail::converted(expression.leaves[0], dtype));
  const std::size_t es = dtype_size(dtype);
  Tensor stacked = Tensor::empty(Shape{{"leaves", whole * static_cast<std::int64_t>(expression.leaves.size())}}, dtype,
                                 expression.leaves[0].device_ptr());
  for (std::size_t t = 0; t < expression.leaves.size(); ++t) {
    const Tensor leaf = arrange(detail::converted(expression.leaves[t], dtype));
    detail::kernels_of(stacked).copy_bytes(static_cast<char*>(stacked.raw_mutable()) + t * whole * es, leaf.raw(), whole * es);
  }
  return stacked;
}

// Every leaf of the expression (in its summed dtype, laid out by `arrange`) end to end, and the
// started all_gather of all ranks' copies of that, rank-major: [ranks, leaves * whole].
Tensor gather_leaves(Communicator& comm, const Call& call, const SumExpression& expression, DType dtype, std::int64_t whole,
                     const std::function<Tensor(const Tensor&)>& arrange, detail::Launch& launch) {
  const std::int64_t total = whole * static_cast<std::int64_t>(expression.leaves.size());
  const Tensor stacked = stacked_leaves(expression, dtype, whole, arrange);
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
  if (expression.leaves.size() == 1 && n > 1) return add_ranks_in_tree(gathered, n, total, offset, block, out.raw_mutable());
  for (std::size_t t = 0; t < expression.leaves.size(); ++t)
    add_ranks_in_tree(gathered, n, total, static_cast<std::int64_t>(t) * whole + offset, block);
  auto& kernels = detail::kernels_of(gathered);
  const std::size_t es = dtype_size(gathered.dtype());
  char* first = static_cast<char*>(gathered.raw_mutable()) + static_cast<std::size_t>(offset) * es;
  evaluate(expression, 0, first, block, whole, gathered.dtype(), kernels, out.raw_mutable());
}

// The psum's result in the operand's dtype: rounded from the summed one, a result of its own.
Tensor narrowed(const Tensor& out, DType dtype) { return out.dtype() == dtype ? out : trace::made(detail::converted(out, dtype)); }

// The leaves' sums over the ranks, end to end in `sums`, in one call: read where they are by a
// communicator that reduces parts (the host threads'), else copied end to end first.
void all_reduce_leaves(Communicator& comm, const Call& call, const SumExpression& expression, DType dtype, std::int64_t whole,
                       Tensor& sums, detail::Launch& launch) {
  if (comm.reduces_parts() && expression.leaves.size() > 1) {
    std::vector<Tensor> leaves;
    std::vector<const void*> parts;
    for (const auto& leaf : expression.leaves) parts.push_back(leaves.emplace_back(detail::converted(leaf, dtype)).raw());
    leaves.push_back(sums);
    launch.keep(leaves);
    return launch.all_reduce_parts(comm, parts, sums.raw_mutable(), static_cast<std::size_t>(whole), dtype, ReduceOp::sum, call);
  }
  const Tensor stacked = stacked_leaves(expression, dtype, whole, [](const Tensor& t) { return t; });
  launch.keep({stacked, sums});
  launch.all_reduce(comm, stacked.raw(), sums.raw_mutable(), static_cast<std::size_t>(stacked.numel()), dtype, ReduceOp::sum, call);
}

// A communicator whose all-reduce adds the ranks in the halving tree (Communicator::
// adds_in_rank_tree: the host threads', MPI's single-copy path, any on two ranks) gives the
// canonical bits itself, with no gather of every rank's copy. The leaves go in one call, then the
// expression's adds are redone.
Tensor psum_in_rank_tree(Communicator& comm, const Call& call, const SumExpression& expression, std::int64_t whole,
                         const Shape& shape, const VaryType& vary, DType narrow, detail::Launch& launch) {
  const DType dtype = summed_dtype(narrow);
  const bool lone = expression.leaves.size() == 1;
  const Tensor& first = expression.leaves[0];
  if (lone && launch.over_input() && first.dtype() == dtype) {  // the caller's own buffer (a gradient bucket), summed where it is
    Tensor sums = first.with_vary(vary);
    launch.keep({first});
    void* in_place = const_cast<void*>(first.raw());  // (marked read by the op's checks; no one else holds it)
    launch.all_reduce(comm, in_place, in_place, static_cast<std::size_t>(whole), dtype, ReduceOp::sum, call);
    return launch.then([sums] { return sums; });
  }
  Tensor sums = lone ? fresh_result(shape, dtype, vary, first.device_ptr())
                     : Tensor::empty(Shape{{"leaves", whole * static_cast<std::int64_t>(expression.leaves.size())}}, dtype,
                                     first.device_ptr());
  all_reduce_leaves(comm, call, expression, dtype, whole, sums, launch);
  return launch.then([sums, expression, whole, shape, vary, narrow, lone]() mutable {
    if (lone) return narrowed(sums, narrow);
    Tensor out = fresh_result(shape, sums.dtype(), vary, sums.device_ptr());
    evaluate(expression, 0, static_cast<char*>(sums.raw_mutable()), whole, whole, sums.dtype(), detail::kernels_of(sums),
             out.raw_mutable());
    return narrowed(out, narrow);
  });
}

// The same for psum_scatter: each leaf arranged by rank, the leaves interleaved rank-major
// ([rank, leaves, block]) so that one reduce-scatter gives this rank every leaf's block.
Tensor psum_scatter_in_rank_tree(Communicator& comm, const Call& call, const SumExpression& expression, Tensor out,
                                 const std::function<Tensor(const Tensor&)>& by_rank, DType narrow, detail::Launch& launch) {
  const DType dtype = out.dtype();
  const int n = comm.size();
  const std::int64_t block = out.numel(), leaves = static_cast<std::int64_t>(expression.leaves.size());
  Tensor grouped = leaves == 1 ? by_rank(detail::converted(expression.leaves[0], dtype))
                               : Tensor::empty(Shape{{"rank", n}, {"leaves", leaves}, {"block", block}}, dtype, out.device_ptr());
  for (std::int64_t t = 0; leaves > 1 && t < leaves; ++t) {  // leaf t's [rank, block] into column t of [rank, leaves, block]
    const Tensor leaf = by_rank(detail::converted(expression.leaves[static_cast<std::size_t>(t)], dtype));
    const kernels::Layout<2> into{.rank = 2, .sizes = {n, block}, .strides = {{{block, 1}, {leaves * block, 1}}}};
    detail::kernels_of(grouped).copy(dtype_size(dtype), leaf.raw(),
                                     static_cast<char*>(grouped.raw_mutable()) + t * block * dtype_size(dtype), into);
  }
  Tensor sums = leaves == 1 ? out : Tensor::empty(Shape{{"leaves", leaves * block}}, dtype, grouped.device_ptr());
  launch.keep({grouped, sums});
  launch.reduce_scatter(comm, grouped.raw(), sums.raw_mutable(), static_cast<std::size_t>(leaves * block), dtype, ReduceOp::sum,
                        call);
  return launch.then([sums, out, expression, block, narrow]() mutable {
    if (expression.leaves.size() > 1)
      evaluate(expression, 0, static_cast<char*>(sums.raw_mutable()), block, block, sums.dtype(), detail::kernels_of(sums),
               out.raw_mutable());
    return narrowed(out, narrow);
  });
}

}  // namespace

bool adds_in_rank_tree(const Communicator& comm, CollectiveKind kind, std::int64_t count, DType dtype) {
  return !gather_psums.load(std::memory_order_relaxed) && comm.adds_in_rank_tree(kind, static_cast<std::size_t>(count), dtype);
}

DType summed_dtype(DType dtype) { return dtype == DType::bf16 ? DType::f32 : dtype; }

Tensor psum(Communicator& comm, const Call& call, const Tensor& x, const Names& mesh_axes, const VaryType& vary, detail::Launch& launch) {
  const SumExpression expression = SumExpression::of(x, mesh_axes);
  const std::int64_t whole = x.numel();
  if (adds_in_rank_tree(comm, CollectiveKind::all_reduce, whole * static_cast<std::int64_t>(expression.leaves.size()),
                        summed_dtype(x.dtype())))
    return psum_in_rank_tree(comm, call, expression, whole, x.shape(), vary, x.dtype(), launch);
  Tensor gathered = gather_leaves(comm, call, expression, summed_dtype(x.dtype()), whole, [](const Tensor& t) { return t; }, launch);
  return launch.then([gathered, expression, n = comm.size(), whole, shape = x.shape(), vary, narrow = x.dtype()]() mutable {
    Tensor out = fresh_result(shape, gathered.dtype(), vary, gathered.device_ptr());
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
  if (adds_in_rank_tree(comm, CollectiveKind::reduce_scatter, block * static_cast<std::int64_t>(expression.leaves.size()),
                        out.dtype()))
    return psum_scatter_in_rank_tree(comm, call, expression, out, by_rank, x.dtype(), launch);
  Tensor gathered = gather_leaves(comm, call, expression, out.dtype(), whole, by_rank, launch);
  return launch.then([gathered, out, expression, n, rank = comm.rank(), whole, block, narrow = x.dtype()]() mutable {
    sum_block(gathered, expression, n, whole, static_cast<std::int64_t>(rank) * block, block, out);
    return narrowed(out, narrow);
  });
}

GatherPsumsForTesting::GatherPsumsForTesting(bool on) : was_(gather_psums.exchange(on)) {}
GatherPsumsForTesting::~GatherPsumsForTesting() { gather_psums.store(was_); }

}  // namespace nax::deterministic
