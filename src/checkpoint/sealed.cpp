#include "checkpoint/sealed.h"

#include <filesystem>
#include <map>
#include <mutex>

namespace nax::checkpoint::detail {

namespace {

std::mutex mutex;
std::map<std::string, std::string> sealed;  // by absolute, normalised path

std::string key_of(const std::string& path) { return std::filesystem::absolute(path).lexically_normal().string(); }

}  // namespace

void remember_sealed(const std::string& path, const std::string& checksum) {
  const std::lock_guard lock(mutex);
  sealed[key_of(path)] = checksum;
}

std::optional<std::string> take_sealed(const std::string& path) {
  const std::lock_guard lock(mutex);
  const auto it = sealed.find(key_of(path));
  if (it == sealed.end()) return std::nullopt;
  std::string checksum = std::move(it->second);
  sealed.erase(it);
  return checksum;
}

}  // namespace nax::checkpoint::detail
