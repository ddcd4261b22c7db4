#include "nax/io/output_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "nax/core/error.h"

namespace nax::io {

void check_writable(const std::string& path, const std::string& flag) {
  if (path.empty()) fail(flag, "an empty path");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail(flag, "'{}' is a folder, not a file to write", path);
    if (::access(path.c_str(), W_OK) != 0) fail(flag, "cannot write '{}': {}", path, std::strerror(errno));
    return;
  }
  const auto slash = path.find_last_of('/');
  const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (::stat(folder.c_str(), &st) != 0) fail(flag, "cannot write '{}': its folder '{}': {}", path, folder, std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) fail(flag, "cannot write '{}': '{}' is not a folder", path, folder);
  if (::access(folder.c_str(), W_OK) != 0) fail(flag, "cannot write '{}': folder '{}': {}", path, folder, std::strerror(errno));
}

}  // namespace nax::io
