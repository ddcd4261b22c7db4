#pragma once
// The recorded graph: one Node per op output that needs a gradient. A node keeps its inputs'
// descriptions without their data (and through them their nodes) and a backward function holding
// what the op saved; both are released when backward has run through the node.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "nax/ops/tape.h"

namespace nax::autodiff {

// d loss / d inputs from d loss / d output; an undefined Tensor means "no gradient".
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

struct Node {
  std::string op;
  std::vector<Tensor> inputs;  // without data (Tensor::without_data); empty for a parameter leaf
  BackwardFn backward;
  bool leaf = false;
  bool released = false;
  // The op's backward takes a gradient still to be summed over mesh axes: cast passes it through
  // unsummed, to be summed at the input instead (where it joins the other parameters' sums, in the
  // input's dtype); all_gather_invariant reduce-scatters it (the sum and its own block at once).
  bool passes_partial_sums = false;
  // Creation order (every node is made after its inputs' nodes): backward runs nodes from the
  // latest made, the reverse of the forward program, so that the backward of what ran between a
  // started collective's start and wait runs between its transpose's start and wait.
  std::uint64_t sequence = next_sequence();

  static std::uint64_t next_sequence();
};

// Records `out` as computed by `op` from `inputs` when grad mode is on and an input requires a
// gradient; returns `out`, carrying its node. `backward` receives the gradient of `out` and
// returns one gradient per input, in order.
Tensor record(std::string op, const Tensor& out, std::vector<Tensor> inputs, BackwardFn backward);

// What a backward rule captures of a value: the value where the rule reads it, else only its
// description (Tensor::without_data: shape, vary type, node), so that it keeps nothing alive.
inline Tensor kept(const Tensor& t, bool read) { return read ? t : t.without_data(); }

// Whether any of `inputs` needs a gradient (and grad mode is on): ops skip saving otherwise.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);

// While alive, ops on this thread record nothing, as under NoGrad, but every input they are given
// that needs a gradient is collected, once per node: since nothing inside records, these are the
// values from outside that the ops read (arguments and captured tensors alike). remat's forward
// keeps them, and only them, for its backward. Nests: an inner capture sees its own inputs only.
class CaptureInputs {
 public:
  CaptureInputs();
  ~CaptureInputs();
  CaptureInputs(const CaptureInputs&) = delete;
  CaptureInputs& operator=(const CaptureInputs&) = delete;

  void see(const Tensor& t);
  const std::vector<Tensor>& inputs() const { return inputs_; }

 private:
  bool previous_grad_;
  CaptureInputs* previous_;
  std::vector<Tensor> inputs_;
  std::unordered_set<const Node*> seen_;
};

// While alive, keeps what the ops on this thread read, in order: for a tensor from outside (made
// before it started) its storage, whether it needs a gradient; for every tensor a sample of its
// bytes; and how many NoGrad scopes the reading op runs under. remat's forward records the reads
// and its recompute must make the same ones: a function that reads a variable reassigned in
// between, other values (a seed drawn from a counter, a C++ value that changed) or takes its
// gradient through another path (a stop_gradient or NoGrad decided by a changed flag) is not the
// function the forward ran. Nests: every live one sees the reads made under it.
class ReadLog {
 public:
  struct Read {
    std::uint64_t storage = 0;  // outside tensors only
    std::uint64_t sample = 0;
    int no_grad = 0;
    bool needs_gradient = false;  // outside tensors only
    bool operator==(const Read&) const = default;
  };

  // Records, or (with `expected`) checks each read against the next expected one, naming the
  // tensor, the op that read it and what changed when they differ.
  explicit ReadLog(const std::vector<Read>* expected = nullptr);
  ~ReadLog();
  ReadLog(const ReadLog&) = delete;
  ReadLog& operator=(const ReadLog&) = delete;

  std::vector<Read> take() { return std::move(reads_); }
  // Checking: every expected read happened.
  void finish() const;
  friend void note_read(const Tensor& t, std::string_view op);

 private:
  void see(const Tensor& t, std::uint64_t sample, std::string_view op);
  std::uint64_t first_;  // storages with ids from here on were made inside
  int no_grad_;          // NoGrad scopes open when it started
  ReadLog* previous_;
  const std::vector<Read>* expected_;
  std::size_t next_ = 0;
  std::vector<Read> reads_;
};
// Tells the live ReadLogs that `op` reads t (check_operands calls it for every operand).
void note_read(const Tensor& t, std::string_view op);

// While alive, ops on this thread record (remat's recompute, run inside grad's NoGrad): the
// user's function again, so no longer Transposing.
class EnableGrad {
 public:
  EnableGrad();
  ~EnableGrad();
  EnableGrad(const EnableGrad&) = delete;
  EnableGrad& operator=(const EnableGrad&) = delete;

 private:
  bool previous_;
  CaptureInputs* previous_capture_;
  bool previous_transposing_;
};

// While alive, ops on this thread compute a backward pass: the transposes of ops the partial-value
// rules already admitted, whose gradient contributions are partial sums until their psum (a
// parameter's gradient over a cut batch), rounded to the forward's dtypes on the way. enter_op
// does not apply the partial-value rules to them (deterministic mode's refusals still hold).
class Transposing {
 public:
  Transposing();
  ~Transposing();
  Transposing(const Transposing&) = delete;
  Transposing& operator=(const Transposing&) = delete;

 private:
  bool previous_;
};
bool transposing();

}  // namespace nax::autodiff
