#pragma once
// What a rank asks a group for in one collective call; every rank of the group must ask for the
// same thing. Shared by the backends that check it (local, mpi) so that their messages read alike.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nax/comm/communicator.h"

namespace nax {

struct CollectiveSignature {
  CollectiveKind kind = CollectiveKind::barrier;
  DType dtype = DType::f32;
  std::size_t count = 0;
  int detail = 0;                // ReduceOp or broadcast root
  std::uint64_t pairs_hash = 0;  // permute pairs; an all-reduce's number of parts (all_reduce_parts)
  // The named collective that issued it (the calling communicator's origin, stable while its
  // rank waits): read only to build messages, so the hot path copies no string.
  const std::string* origin = nullptr;
  std::uint64_t call_site = 0;  // CallSite::hash of the named collective's call

  bool operator==(const CollectiveSignature& o) const {
    return kind == o.kind && dtype == o.dtype && count == o.count && detail == o.detail && pairs_hash == o.pairs_hash &&
           call_site == o.call_site;
  }
  // "psum(f32[i=4] varying{mp}, mp) [all_reduce(sum, f32 x 4)]"
  std::string str() const;
  // Equal signatures hash alike (the origin is not part of it).
  std::uint64_t hash() const;
};

// The signature of a call of `kind` that `call` makes.
inline CollectiveSignature signature_of(const Call& call, CollectiveKind kind, DType dtype, std::size_t count, int detail = 0,
                                        std::uint64_t pairs_hash = 0) {
  return CollectiveSignature{kind, dtype, count, detail, pairs_hash, &call.origin, call.site};
}

// What to look for when a backward's collective finds the group out of step ("" for other calls).
std::string backward_hint(const CollectiveSignature& call);

// "collective mismatch in <group>: device a called <first> but device b called <other>", with
// backward_hint.
std::string mismatch_message(const std::string& group, int device_a, const CollectiveSignature& first, int device_b,
                             const CollectiveSignature& other);

// A hash of permute pairs, order-sensitive.
std::uint64_t hash_pairs(const std::vector<std::pair<int, int>>& pairs);

}  // namespace nax
