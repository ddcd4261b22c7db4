#pragma once
// The checksums this process's safetensors writers took while writing, by file, until a run
// folder's commit lists them: a file the commit finds here need not be read again, and one it
// does not (written elsewhere, copied in) is hashed whole.
#include <optional>
#include <string>

namespace nax::checkpoint::detail {

void remember_sealed(const std::string& path, const std::string& checksum);
// The checksum a writer of this process sealed `path` with, once (the entry is taken).
std::optional<std::string> take_sealed(const std::string& path);

}  // namespace nax::checkpoint::detail
