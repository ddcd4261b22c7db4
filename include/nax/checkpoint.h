#pragma once
// Checkpoints: durable files, validated safetensors, named global tensors saved from and loaded to
// any mesh, and run folders of step checkpoints that are each one unit (docs/checkpoints.md).
#include "nax/checkpoint/files.h"
#include "nax/checkpoint/run_folder.h"
#include "nax/checkpoint/safetensors.h"
#include "nax/checkpoint/safetensors_folder.h"
#include "nax/checkpoint/sharded.h"
