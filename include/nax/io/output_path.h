#pragma once
// Checking an output path before the work that fills it: a run that cannot write its trace,
// metrics or results at the end should be refused at the start, not after hours.
#include <string>

namespace nax::io {

// Refuses, naming `flag` and `path`, a path that cannot be created or written: its folder missing
// or not a folder or not writable, or the path itself a folder or an unwritable file. A device or a
// FIFO passes (writing to /dev/stdout is legitimate); what a write then reports is the writer's to
// check.
void check_writable(const std::string& path, const std::string& flag);

}  // namespace nax::io
