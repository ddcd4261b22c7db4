#pragma once
// The thread communicator for devices whose memory the host cannot read (CUDA devices of one
// process, in particular several mesh devices sharing one GPU, which NCCL refuses). Ranks
// rendezvous in a LocalGroup as the host version does, then move data with their device's
// kernels: peers' slices are copied into this device's memory before they are reduced, so no
// kernel reads another GPU's memory. Each rank's stream is drained before it publishes its
// buffers and before it leaves, which orders the collective with the compute around it.
#include <memory>

#include "comm/local/local_world.h"
#include "nax/comm/communicator.h"
#include "nax/kernels/device.h"

namespace nax::local {

// Rank `rank` of `group`, on `device`.
std::unique_ptr<Communicator> make_device_communicator(std::shared_ptr<LocalGroup> group, int rank, std::shared_ptr<Device> device);

}  // namespace nax::local
