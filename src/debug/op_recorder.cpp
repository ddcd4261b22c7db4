// The op recorder, a trace::Observer: it learns each op's extent from its trace slice and the
// tensors the op made from make_result. When the outermost op's slice
// closes, the op's locals are gone: of the tensors it made, those still held elsewhere are what it
// returned and what it saved for its backward; its result is the last of them (an op makes its
// result from its intermediates).
#include "nax/debug/op_recorder.h"

#include <fmt/format.h>

#include <exception>

#include "nax/trace/trace.h"
#include "deterministic/deterministic.h"

namespace nax::debug {

namespace {

bool is_op(std::string_view category) { return category == "op" || category == "collective"; }

// A slice open on this thread.
struct OpenSlice {
  std::string name;
  bool op = false;
  bool context = false;  // a step or phase: named in the context of the ops inside it
};

}  // namespace

struct OpRecorder::Observer final : trace::Observer {
  std::vector<OpRecord> records;
  std::vector<OpenSlice> open;
  int ops_open = 0;
  int exceptions_at_open = 0;
  bool reading = false;         // copying values: the reads' own slices and tensors are not the program's
  std::vector<Tensor> made_now;  // by the outermost open op
  std::vector<Tensor> kept_last;  // the values recorded of the last op, until the next begins
  std::vector<std::pair<Tensor, std::vector<Tensor>>> terms_now;  // terms kept by values of the open op
  bool filled_later_now = false;
  trace::Observer* previous = nullptr;

  void opened(std::string_view category, std::string_view name) override {
    if (reading) return;
    const bool op = is_op(category);
    open.push_back({std::string(name), op, !op && category != "wait"});
    if (!op || ops_open++ > 0) return;
    OpRecord r;
    r.index = records.size();
    r.op = std::string(name);
    r.collective = category == "collective";
    for (const auto& s : open)
      if (s.context) r.context += (r.context.empty() ? "" : "/") + s.name;
    records.push_back(std::move(r));
    made_now.clear();
    kept_last.clear();
    terms_now.clear();
    filled_later_now = false;
    exceptions_at_open = std::uncaught_exceptions();
  }

  void closed() override {
    if (reading || open.empty()) return;
    const bool op = open.back().op;
    open.pop_back();
    if (!op || --ops_open > 0) return;
    finish(records.back());
  }

  void made(const Tensor& result) override {
    if (!reading && ops_open > 0) made_now.push_back(result);
  }
  void filled_later() override {
    if (!reading && ops_open > 0) filled_later_now = true;
  }
  // add keeps the terms after its slice has closed (or inside an enclosing op's).
  void terms_kept(const Tensor& sum, const std::vector<Tensor>& terms) override {
    if (reading) return;
    if (ops_open > 0) {
      terms_now.emplace_back(sum, terms);
      return;
    }
    if (records.empty()) return;
    attach_terms(records.back(), kept_last, sum, terms);
  }

  static OpValue value_of(const Tensor& t) {
    OpValue v{t.shape(), t.dtype(), t.vary(), t.to_vector<double>(), {}, {}, 0};
    for (const Tensor& term : deterministic::terms_of(t)) v.terms.push_back(value_of(term));
    if (const auto mean = deterministic::local_mean_of(t)) v.mean_sum = mean->sum.to_vector<double>(), v.mean_count = mean->count;
    return v;
  }

  void attach_terms(OpRecord& r, const std::vector<Tensor>& kept, const Tensor& sum, const std::vector<Tensor>& terms) {
    reading = true;
    try {
      for (std::size_t k = 0; k < kept.size() && k < r.values.size(); ++k) {
        if (!kept[k].same_storage(sum) || !r.values[k].terms.empty()) continue;
        for (const Tensor& t : terms) r.values[k].terms.push_back(value_of(t));
        break;
      }
    } catch (const std::exception& e) {
      r.unread = fmt::format("reading its terms failed: {}", e.what());
    }
    reading = false;
  }

  // The values of the op that just returned: those it made that are still held elsewhere.
  void finish(OpRecord& r) {
    std::vector<Tensor> made = std::move(made_now);
    made_now.clear();
    if (std::uncaught_exceptions() > exceptions_at_open) r.unread = "the op failed";
    else if (filled_later_now) r.unread = "a started collective (its result arrives at wait)";
    if (!r.unread.empty()) return;
    reading = true;
    try {
      for (auto t = made.rbegin(); t != made.rend(); ++t)
        if (t->referenced_elsewhere()) {
          r.values.push_back(value_of(*t)), kept_last.push_back(*t);
          break;
        }
    } catch (const std::exception& e) {
      r.values.clear();
      r.unread = fmt::format("reading it failed: {}", e.what());
    }
    reading = false;
    for (const auto& [sum, terms] : std::exchange(terms_now, {})) attach_terms(r, kept_last, sum, terms);
  }
};

OpRecorder::OpRecorder() : observer_(std::make_unique<Observer>()) {
  observer_->previous = trace::set_thread_observer(observer_.get());
}

OpRecorder::~OpRecorder() {
  trace::set_thread_observer(observer_->previous);
}

const std::vector<OpRecord>& OpRecorder::records() const { return observer_->records; }

std::vector<OpRecord> OpRecorder::take() { return std::exchange(observer_->records, {}); }

}  // namespace nax::debug
