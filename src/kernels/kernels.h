#pragma once
// Moved to include/nax/kernels/kernels.h (the kernel interface is public); this forwarder keeps
// branches written before the move compiling. Include "nax/kernels/kernels.h".
#include "nax/kernels/kernels.h"
