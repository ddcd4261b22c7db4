#include "comm/launch.h"

#include <utility>

#include <fmt/format.h>

#include "nax/trace/trace.h"

namespace nax::detail {

namespace {
thread_local std::uint64_t t_tickets = 0;
}  // namespace

Launch::Launch(std::string label) : label_(std::move(label)) {
  if (start()) ticket_ = ++t_tickets;
}

void Launch::all_reduce(Communicator& c, const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call) {
  if (start()) request_ = c.start_all_reduce(send, recv, count, dtype, op, {label_, call.site, ticket_}), started();
  else c.all_reduce(send, recv, count, dtype, op, call);
}

void Launch::all_reduce_parts(Communicator& c, const std::vector<const void*>& parts, void* recv, std::size_t count, DType dtype,
                              ReduceOp op, const Call& call) {
  if (start()) request_ = c.start_all_reduce_parts(parts, recv, count, dtype, op, {label_, call.site, ticket_}), started();
  else c.all_reduce_parts(parts, recv, count, dtype, op, call);
}

void Launch::all_gather(Communicator& c, const void* send, void* recv, std::size_t count, DType dtype, const Call& call) {
  if (start()) request_ = c.start_all_gather(send, recv, count, dtype, {label_, call.site, ticket_}), started();
  else c.all_gather(send, recv, count, dtype, call);
}

void Launch::reduce_scatter(Communicator& c, const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call) {
  if (start()) request_ = c.start_reduce_scatter(send, recv, count, dtype, op, {label_, call.site, ticket_}), started();
  else c.reduce_scatter(send, recv, count, dtype, op, call);
}

void Launch::permute(Communicator& c, const void* send, void* recv, std::size_t count, DType dtype,
                     const std::vector<std::pair<int, int>>& pairs, const Call& call) {
  if (start()) request_ = c.start_permute(send, recv, count, dtype, pairs, {label_, call.site, ticket_}), started();
  else c.permute(send, recv, count, dtype, pairs, call);
}

void Launch::keep(const std::vector<Tensor>& buffers) {
  if (start()) kept_.insert(kept_.end(), buffers.begin(), buffers.end());
}

void Launch::started() {
  for (const auto& t : kept_) t.set_pending(label_);
}

void Launch::release() {
  for (const auto& t : kept_) t.set_pending({});
}

Launch::~Launch() {
  request_.reset();  // waits for a call still in flight before its buffers go
  release();
}

Tensor Launch::then(std::function<Tensor()> finish) {
  if (request_ == nullptr) return finish();
  if (trace::Observer* o = trace::observer()) o->filled_later();
  finish_ = std::move(finish);
  return Tensor();
}

Tensor Launch::complete() {
  // A started collective's slice covers its start; finishing it (Pending::wait) is a slice of its own.
  const trace::Span span("collective", "complete a started collective", [&] { return fmt::format("\"ticket\": {}", ticket_); });
  std::exchange(request_, nullptr)->wait();
  release();
  kept_.clear();
  return std::exchange(finish_, nullptr)();
}

}  // namespace nax::detail
