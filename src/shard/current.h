#pragma once
#include "nax/shard/shard.h"

namespace nax::detail {

// Makes `shard` the one Shard::current() returns on the calling thread (nullptr: none), with its
// device the thread's current one and its trace track the thread's.
void set_current_shard(Shard* shard);

}  // namespace nax::detail
