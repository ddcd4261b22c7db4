#pragma once
// Shared by embedding and pick: which block of a vocabulary cut over mesh axes this device holds,
// the check of integer ids against the whole vocabulary, and the vary type of a gradient scattered
// into the vocab-indexed input.
#include <string>
#include <string_view>
#include <vector>

#include "nax/kernels/kernels.h"
#include "nax/tensor/tensor.h"

namespace nax::detail {

struct VocabBlock {
  std::vector<std::string> mesh_axes;  // cutting the vocab axis, major first (empty: whole)
  kernels::VocabRange range;               // this device's ids
  std::int64_t total = 0;              // the whole vocabulary
};

// The block of `vocab` that `t` (the table or the logits) holds on the calling device.
VocabBlock vocab_block(std::string_view op, const Tensor& t, const std::string& vocab);

// Throws naming `op` unless `ids` is i32 and every id lies in [0, block.total) of `t`'s vocab. On a
// device the host cannot read, the range check runs there and is reported at this thread's next
// host read (resolve_deferred_id_checks, called by Tensor::on_host).
void check_ids(std::string_view op, std::string_view what, const Tensor& ids, const VocabBlock& block, const Tensor& t,
               const std::string& vocab);
// Reads the count of bad ids that check_ids left on the device and, if any, throws check_ids's
// error for the first; a no-op when nothing is deferred.
void resolve_deferred_id_checks();

// The vary type of the gradient of `input` (which holds the vocab axis) computed from `g`: input's
// Split axes stay Split (each device's block gets its own gradient); over any other mesh axis on
// which g varies the gradient is a per-device partial value (Varying), which the autodiff sums
// where the input is Invariant.
VaryType scattered_gradient_vary(const Tensor& input, const Tensor& g);

}  // namespace nax::detail
