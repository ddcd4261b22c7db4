// The records deterministic mode keeps beside tensors: the terms of a sum of partial sums and a
// local mean's sum and count. Each device's ops run on one thread, so each thread keeps its own;
// a record is found by the tensor's storage and vary type (a view with another vary type is
// another value) and dropped once no tensor holds the storage.
#include <unordered_map>

#include "deterministic/deterministic.h"
#include "nax/trace/trace.h"
#include "tensor/copies.h"

namespace nax::deterministic {

namespace {

struct Record {
  std::weak_ptr<const void> alive;
  VaryType vary;
  std::vector<Tensor> terms;
  std::optional<LocalMean> mean;
};

thread_local std::unordered_map<std::uint64_t, Record> t_records;

const Record* find(const Tensor& x) {
  if (t_records.empty() || !x.defined()) return nullptr;
  const auto it = t_records.find(x.storage_id());
  return it != t_records.end() && it->second.vary == x.vary() ? &it->second : nullptr;
}

// A fresh record for x, after dropping those of storages no tensor holds any more (there are few
// at once: the sums and means of one step not yet finished).
Record& record_of(const Tensor& x) {
  std::erase_if(t_records, [](const auto& entry) { return entry.second.alive.expired(); });
  Record& r = t_records[x.storage_id()];
  if (r.alive.expired() || !(r.vary == x.vary())) r = Record{x.storage_handle(), x.vary(), {}, {}};
  return r;
}

bool common_partial_sum(const Tensor& a, const Tensor& b) {
  for (const auto& m : a.vary().partial_mesh_axes())
    if (a.vary().partial_sum(m) && b.vary().partial_sum(m)) return true;
  return false;
}

// t as a term of a sum of shape `shape`: broadcast (with its own terms) where the add broadcast it.
Tensor term_of_shape(const Tensor& t, const Shape& shape) {
  if (t.shape() == shape) return t;
  Tensor wide = detail::broadcast_to(t, shape);
  const std::vector<Tensor> terms = terms_of(t);
  if (terms.empty()) return wide;
  std::vector<Tensor> wide_terms{term_of_shape(terms[0], shape), term_of_shape(terms[1], shape)};
  record_of(wide).terms = std::move(wide_terms);  // after the calls above, which may add records
  return wide;
}

// -b, for a - b kept as a + -b (negation is exact: psum of the terms then gives a - b's bits).
Tensor negated(const Tensor& b, std::string_view op) {
  if (!terms_of(b).empty())  // negating would lose its terms
    fail(op, "deterministic mode: {} is a sum of partial sums that no psum has finished; subtracting it would depend on the "
         "mesh's order of addition: psum it first", b.str());
  Tensor out = Tensor::empty(b.shape(), b.dtype(), b.device_ptr()).with_vary(b.vary());
  detail::kernels_of(out).unary(kernels::UnaryOp::neg, b.dtype(), b.raw(), out.raw_mutable(), b.numel());
  return out;
}

}  // namespace

void keep_terms_of_sum(const Tensor& sum, const Tensor& a, const Tensor& b, bool negate_b) {
  if (!on() || !common_partial_sum(a, b)) return;
  std::vector<Tensor> terms{term_of_shape(a, sum.shape()), term_of_shape(negate_b ? negated(b, "sub") : b, sum.shape())};
  if (trace::Observer* o = trace::observer()) o->terms_kept(sum, terms);
  record_of(sum).terms = std::move(terms);  // each keeps its own terms: psum redoes the adds in order
}

const std::vector<Tensor>& terms_of(const Tensor& x) {
  static const std::vector<Tensor> none;
  const Record* r = find(x);
  return r != nullptr ? r->terms : none;
}

void keep_local_mean(const Tensor& mean, const Tensor& sum, std::int64_t count) { record_of(mean).mean = LocalMean{sum, count}; }

std::optional<LocalMean> local_mean_of(const Tensor& mean) {
  const Record* r = find(mean);
  return r != nullptr ? r->mean : std::nullopt;
}

}  // namespace nax::deterministic
