#pragma once

namespace nax::io {

// Test hook of the crash tests (tests/checkpoint/crash_tests.sh): with $NAX_CHECKPOINT_KILL_AT=N,
// the Nth point of a durable write (a file written, flushed or renamed; a folder renamed) kills
// the process with SIGKILL, as a crash would there.
void crash_point();

}  // namespace nax::io
