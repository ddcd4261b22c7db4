// embedding(table, ids, vocab): a row lookup. With the vocab cut over mesh axes each device looks
// up only the ids of its block (others give zero rows) and the result is a partial value to psum;
// no one-hot is built. The backward scatter-adds the gradient rows into a zero table gradient.
#include "deterministic/deterministic.h"
#include "ops/tape.h"
#include "nax/ops/transformer_ops.h"
#include "ops/row_ops.h"
#include "ops/vocab_parallel.h"

namespace nax {

namespace {

// The table's shape with `vocab` first: each id then selects one contiguous row.
Shape vocab_first(const Shape& table, const std::string& vocab) {
  std::vector<Axis> axes{table[table.index_of(vocab)]};
  for (const auto& a : table.axes())
    if (a.name != vocab) axes.push_back(a);
  return Shape(axes);
}

void check_embedding(const Tensor& table, const Tensor& ids, const std::string& vocab) {
  detail::check_floating("embedding", table);
  table.shape().require(vocab, "embedding");
  for (const auto& a : ids.shape().axes())
    if (table.shape().has(a.name))
      fail("embedding", "ids axis '{}' is also an axis of the table (rename one): ids {}, table {}", a.name, ids.str(), table.str());
}

Tensor embedding_backward(const Tensor& g, const Tensor& table, const Tensor& ids, const std::string& vocab,
                          const kernels::VocabRange& range) {
  const Tensor dy = detail::widen(g);
  Tensor grad = detail::make_result(vocab_first(table.shape(), vocab), dy.dtype(), detail::scattered_gradient_vary(table, g), table.device_ptr());
  const std::int64_t row = range.local == 0 ? 0 : table.numel() / range.local;
  detail::kernels_of(grad).scatter_add_rows(dy.dtype(), ids.data<std::int32_t>(), ids.numel(), range, dy.raw(), row, grad.raw_mutable(),
                                            deterministic::sum_tree("embedding", ids, ids.shape().names()));
  return grad;
}

}  // namespace

Tensor embedding(const Tensor& table, const Tensor& ids, const std::string& vocab) {
  const auto op_span = detail::enter_op("embedding", {{&table, OnPartial::move}, &ids});
  check_embedding(table, ids, vocab);
  const detail::VocabBlock block = detail::vocab_block("embedding", table, vocab);
  detail::check_ids("embedding", "id", ids, block, table, vocab);
  const VaryType vary = detail::merge_vary("embedding", {&table, &ids}, {vocab});

  const Tensor rows = detail::permute_to(stop_gradient(table), vocab_first(table.shape(), vocab).names());
  std::vector<Axis> axes = ids.shape().axes();
  for (int i = 1; i < rows.rank(); ++i) axes.push_back(rows.shape()[i]);
  Tensor out = detail::make_result(Shape(axes), table.dtype(), vary, table.device_ptr());
  const std::int64_t row = block.range.local == 0 ? 0 : table.numel() / block.range.local;
  detail::kernels_of(out).gather_rows(ids.data<std::int32_t>(), ids.numel(), block.range, rows.raw(),
                   static_cast<std::size_t>(row) * dtype_size(table.dtype()), out.raw_mutable());

  if (!autodiff::any_requires_grad({&table})) return out;
  return autodiff::record("embedding", out, {table},
                          [table = stop_gradient(table), ids, vocab, range = block.range](const Tensor& g) {
                            return std::vector<Tensor>{embedding_backward(g, table, ids, vocab, range)};
                          });
}

}  // namespace nax
