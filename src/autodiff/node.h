#pragma once
// Moved to src/ops/node.h (the tape is the op layer's; autodiff walks it). This forwarder keeps
// branches written before the move compiling; scripts/check_layers.py flags its users in src/ops.
#include "ops/node.h"
