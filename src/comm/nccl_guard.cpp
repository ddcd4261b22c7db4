#include "comm/nccl_guard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "nax/core/error.h"

namespace nax::comm {

namespace {

std::mutex registry_mutex;
std::vector<NcclGuard*>& registry() {
  static std::vector<NcclGuard*> guards;
  return guards;
}

void encode(const CollectiveSignature& sig, std::int64_t* words) {
  words[0] = static_cast<std::int64_t>(sig.kind);
  words[1] = static_cast<std::int64_t>(sig.dtype);
  words[2] = static_cast<std::int64_t>(sig.count);
  words[3] = sig.detail;
  words[4] = static_cast<std::int64_t>(sig.pairs_hash);
  words[5] = static_cast<std::int64_t>(sig.call_site);
  char origin[NcclGuard::kOriginWords * sizeof(std::int64_t)] = {};
  if (sig.origin != nullptr) std::memcpy(origin, sig.origin->data(), std::min(sig.origin->size(), sizeof origin - 1));
  std::memcpy(words + 6, origin, sizeof origin);
}

CollectiveSignature decode(const std::int64_t* words, std::string& origin) {
  char text[NcclGuard::kOriginWords * sizeof(std::int64_t)];
  std::memcpy(text, words + 6, sizeof text);
  text[sizeof text - 1] = '\0';
  origin = text;
  return CollectiveSignature{static_cast<CollectiveKind>(words[0]), static_cast<DType>(words[1]), static_cast<std::size_t>(words[2]),
                             static_cast<int>(words[3]), static_cast<std::uint64_t>(words[4]), origin.empty() ? nullptr : &origin,
                             static_cast<std::uint64_t>(words[5])};
}

}  // namespace

NcclGuard::NcclGuard(NcclOps ops, std::string label, std::vector<int> devices, int rank, std::chrono::duration<double> timeout,
                     std::chrono::microseconds poll)
    : ops_(std::move(ops)), label_(std::move(label)), devices_(std::move(devices)), rank_(rank), timeout_(timeout), poll_(poll) {
  std::lock_guard lock(registry_mutex);
  registry().push_back(this);
}

NcclGuard::~NcclGuard() {
  std::lock_guard lock(registry_mutex);
  std::erase(registry(), this);
}

void NcclGuard::check_usable(const std::string& what) const {
  if (aborted_) fail("nccl", "{} in {} on device {}: the communicator was aborted by an earlier failure", what, label_, devices_[rank_]);
}

void NcclGuard::abort_and_fail(const std::string& why) {
  if (!aborted_) {
    aborted_ = true;
    ops_.abort();
  }
  throw Error(why);
}

void NcclGuard::wait(const std::string& what) {
  std::lock_guard lock(wait_mutex_);
  check_usable(what);
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  for (;;) {
    const bool done = ops_.idle();
    if (ops_.async_error(message) == NcclOps::Status::error)
      abort_and_fail(fmt::format("nccl: {} on device {} in {} failed: {} (communicator aborted)", what, devices_[rank_], label_, message));
    if (done) return;
    if (std::chrono::steady_clock::now() - start > timeout_)
      abort_and_fail(fmt::format("nccl: {} on device {} in {} did not finish within {} s (NAX_COLLECTIVE_TIMEOUT_S): a peer never "
                                 "joined it or failed; communicator aborted",
                                 what, devices_[rank_], label_, timeout_.count()));
    std::this_thread::sleep_for(poll_);
  }
}

void NcclGuard::check_signature(const CollectiveSignature& sig) {
  const std::size_t ranks = devices_.size();
  std::int64_t mine[kSignatureWords];
  encode(sig, mine);
  check_usable(sig.str());
  const std::int64_t* all = ops_.all_gather_words(mine, kSignatureWords);
  wait(fmt::format("the signature check before {}", sig.str()));
  std::string first_origin, other_origin;
  const CollectiveSignature first = decode(all, first_origin);
  for (std::size_t r = 1; r < ranks; ++r) {
    const CollectiveSignature other = decode(all + r * kSignatureWords, other_origin);
    if (!(other == first))
      fail("nccl", "{}", mismatch_message(label_, devices_[0], first, devices_[r], other));
  }
}

void NcclGuard::drain_gpu(int gpu) {
  std::lock_guard lock(registry_mutex);  // no guard is destroyed meanwhile
  for (NcclGuard* guard : registry())
    if (!guard->aborted_ && (gpu < 0 || guard->ops_.gpu == gpu)) guard->wait("in-flight work before freeing device memory");
}

}  // namespace nax::comm
