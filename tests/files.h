#pragma once
// Files for tests: a scratch path per name and process, a file's bytes, a file written anew.
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace nax::testing {

// A path under the temporary folder unique to `name` and this process, emptied of what an earlier
// run left there; not created.
inline std::string scratch_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("nax_test_{}_{}", name, ::getpid());
  std::filesystem::remove_all(dir);
  return dir.string();
}

inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A new file each time: rewriting one by truncation makes ext4 flush it (auto_da_alloc), slowly.
inline void replace_file(const std::string& path, const std::string& bytes) {
  std::filesystem::remove(path);
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace nax::testing
