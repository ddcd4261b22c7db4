#pragma once
// Collective calls whose host-side arguments every device must pass alike (a save's or a load's
// list of tensors): devices that disagree would write one device's names over another's blocks.
// Compared with one small all-reduce of a hash; on a difference every device raises the same
// error, naming the first entry that differs and each device's version of it.
#include <string>
#include <string_view>
#include <vector>

#include <functional>

#include "nax/checkpoint/sharded.h"
#include "nax/runtime/runtime.h"

namespace nax::checkpoint::detail {

// `entries` describe this device's arguments, one each ("tensor 2: 'x' f32[a=4, b=2]"); `what`
// says what they are for the message ("tensors (names in the same order, global shapes, ...)").
// Collective over every device of the mesh, also on a mesh of one (so that every mesh runs the
// same ops).
void require_same_on_every_device(Shard& s, std::string_view op, std::string_view what, const std::vector<std::string>& entries);

// The entry of tensor k of a save or a load: "tensor 2: 'w' f32[heads=4, embed=8] stored as [32]"
// (the dtype, when given, and the stored dims, when they are not the global shape's).
std::string tensor_entry(std::size_t k, const std::string& name, std::string_view dtype, const Shape& global,
                         const std::vector<std::int64_t>& stored);

// load_sharded over any source (a file, a folder of files): the devices' lists checked alike, then
// each tensor read from `read` by the devices that hold it and cut by `rules`, one global tensor at
// a time; an undefined tensor where this device does not hold it.
std::vector<Tensor> load_blocks(Shard& s, std::string_view source, const std::vector<ShardedRead>& tensors, const AxisRules& rules,
                                const std::function<Tensor(const ShardedRead&)>& read);

}  // namespace nax::checkpoint::detail
