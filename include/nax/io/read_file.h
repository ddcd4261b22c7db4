#pragma once
// Reading a file nax is given: regular files only (a folder, a device such as /dev/zero, a FIFO or
// a socket is refused without blocking), and only up to a size stated beforehand.
#include <cstdint>
#include <string>

#include "nax/io/caps.h"

namespace nax::io {

// The whole of `path`, which must be a regular file (after links) of at most `max_bytes`; anything
// else is a nax::Error naming it (and the cap).
std::string read_file(const std::string& path, std::uint64_t max_bytes = 64ull << 20);
// The same with the cap of a kind of file, which the refusal names.
std::string read_file(const std::string& path, const FileCaps& caps);

// Whether `path` is a regular file (following links).
bool is_regular_file(const std::string& path);

// "64 MiB", "100000000 bytes": a cap as the messages give it.
std::string format_bytes(std::uint64_t bytes);

}  // namespace nax::io
