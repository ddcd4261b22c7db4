#include "nax/checkpoint/run_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "nax/checkpoint/files.h"
#include "nax/core/error.h"

namespace nax::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kManifest = "manifest.json";

// The pid of a temporary's name "NAME.tmp.PID", or 0.
long temporary_pid(const std::string& name) {
  const auto at = name.rfind(".tmp.");
  if (at == std::string::npos) return 0;
  const std::string digits = name.substr(at + 5);
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::stol(digits);
}

bool process_alive(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

// The step of a committed folder's name "step_NNNNNN", or -1.
std::int64_t step_of(const std::string& name) {
  if (name.rfind("step_", 0) != 0) return -1;
  const std::string digits = name.substr(5);
  if (digits.size() < 6 || digits.size() > 15 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

void remove_tree(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec) fail("checkpoint", "cannot remove '{}': {}", p.string(), ec.message());
}

}  // namespace

void kill_point() {
  static const long target = [] {
    const char* v = std::getenv("NAX_CHECKPOINT_KILL_AT");
    return v == nullptr ? 0L : std::atol(v);
  }();
  static std::atomic<long> count{0};
  if (target > 0 && ++count == target) ::kill(::getpid(), SIGKILL);
}

std::string step_folder(const std::string& dir, std::int64_t step) { return fmt::format("{}/step_{:06d}", dir, step); }

RunFolder::RunFolder(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) fail("checkpoint", "cannot use '{}' as a checkpoint folder: {}", dir, ec ? ec.message() : "not a folder");
  const std::string lock = dir + "/.lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) fail("checkpoint", "cannot open '{}': {}", lock, std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {};
    const ssize_t n = ::pread(lock_fd_, pid, sizeof pid - 1, 0);
    ::close(lock_fd_);
    lock_fd_ = -1;
    fail("checkpoint", "'{}' is in use by another writer (pid {}): one training per checkpoint folder", dir,
         n > 0 ? std::string(pid, static_cast<std::size_t>(n)) : std::string("unknown"));
  }
  const std::string me = std::to_string(::getpid());
  if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
    fail("checkpoint", "cannot write '{}': {}", lock, std::strerror(errno));
  // Holding the lock, no other writer runs: temporaries of dead processes are leftovers.
  for (const auto& entry : fs::directory_iterator(dir)) {
    const long pid = temporary_pid(entry.path().filename().string());
    if (pid > 0 && pid != ::getpid() && !process_alive(pid)) remove_tree(entry.path());
  }
}

RunFolder::RunFolder(RunFolder&& other) noexcept : dir_(std::move(other.dir_)), lock_fd_(other.lock_fd_) { other.lock_fd_ = -1; }

RunFolder::~RunFolder() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // closing releases the flock
}

std::string RunFolder::begin_step(std::int64_t step) {
  if (step < 0) fail("checkpoint", "step {} is negative", step);
  const std::string tmp = fmt::format("{}.tmp.{}", step_folder(dir_, step), ::getpid());
  remove_tree(tmp);
  std::error_code ec;
  if (!fs::create_directory(tmp, ec)) fail("checkpoint", "cannot create '{}': {}", tmp, ec.message());
  return tmp;
}

void RunFolder::commit_step(const std::string& tmp, std::int64_t step, std::int64_t keep) {
  json files = json::object();
  for (const auto& entry : fs::directory_iterator(tmp)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file()) fail("checkpoint", "'{}' in '{}' is not a regular file", name, tmp);
    files[name] = {{"bytes", entry.file_size()}, {"checksum", file_checksum(entry.path().string())}};
  }
  const json manifest = {{"format", "nax.checkpoint"}, {"version", 1}, {"step", step}, {"files", files}};
  write_file_atomically(tmp + "/" + kManifest, manifest.dump(2) + "\n");
  fsync_directory(tmp);
  kill_point();
  const std::string final_dir = step_folder(dir_, step);
  if (fs::exists(final_dir)) {  // a step written again (e.g. by a resumed run): set the old aside first
    const std::string old = fmt::format("{}.old.tmp.{}", final_dir, ::getpid());
    if (std::rename(final_dir.c_str(), old.c_str()) != 0) fail("checkpoint", "cannot move '{}' aside: {}", final_dir, std::strerror(errno));
    remove_tree(old);
  }
  if (std::rename(tmp.c_str(), final_dir.c_str()) != 0)
    fail("checkpoint", "cannot rename '{}' to '{}': {}", tmp, final_dir, std::strerror(errno));
  fsync_directory(dir_);
  kill_point();
  if (keep <= 0) return;
  auto steps = committed_steps(dir_);
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < steps.size(); ++i) {
    // Renamed to a temporary first, so that a removal cut short never looks committed.
    const std::string old = step_folder(dir_, steps[i]), doomed = fmt::format("{}.tmp.{}", old, ::getpid());
    if (std::rename(old.c_str(), doomed.c_str()) != 0) fail("checkpoint", "cannot remove '{}': {}", old, std::strerror(errno));
    kill_point();
    remove_tree(doomed);
  }
  fsync_directory(dir_);
}

std::vector<std::int64_t> committed_steps(const std::string& dir) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::int64_t step = step_of(it->path().filename().string());
    if (step >= 0 && it->is_directory()) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

void verify_step_folder(const std::string& folder) {
  const std::string path = folder + "/" + kManifest;
  const json manifest = json::parse(read_file(path, 1 << 20), nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object()) fail("checkpoint", "'{}' is not a JSON object", path);
  if (manifest.value("format", json()) != "nax.checkpoint" || manifest.value("version", json()) != 1)
    fail("checkpoint", "'{}': format or version is not nax.checkpoint 1", path);
  const json step = manifest.value("step", json());
  const std::int64_t named = step_of(fs::path(folder).filename().string());
  if (!step.is_number_unsigned() || (named >= 0 && step.get<std::int64_t>() != named))
    fail("checkpoint", "'{}': field 'step' is {}, the folder's name says {}", path, step.dump(), named);
  const json files = manifest.value("files", json());
  if (!files.is_object() || files.empty()) fail("checkpoint", "'{}': field 'files' is not an object listing the files", path);
  std::set<std::string> listed{kManifest};
  for (const auto& [name, entry] : files.items()) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      fail("checkpoint", "'{}' lists '{}', not a file name", path, name);
    const std::string file = folder + "/" + name;
    if (!entry.is_object() || !entry.contains("bytes") || !entry["bytes"].is_number_unsigned() || !entry.contains("checksum") ||
        !entry["checksum"].is_string())
      fail("checkpoint", "'{}': the entry of '{}' needs bytes and checksum", path, name);
    if (!is_regular_file(file)) fail("checkpoint", "'{}' is missing or not a regular file (listed in {})", file, kManifest);
    const auto bytes = fs::file_size(file);
    if (bytes != entry["bytes"].get<std::uint64_t>())
      fail("checkpoint", "'{}' has {} bytes, its manifest says {}", file, bytes, entry["bytes"].get<std::uint64_t>());
    const std::string sum = file_checksum(file);
    if (sum != entry["checksum"].get<std::string>())
      fail("checkpoint", "'{}' fails its checksum (manifest {}, computed {}): the file is corrupt", file, entry["checksum"].get<std::string>(), sum);
    listed.insert(name);
  }
  for (const auto& entry : fs::directory_iterator(folder))
    if (!listed.contains(entry.path().filename().string()))
      fail("checkpoint", "'{}' holds '{}', which its manifest does not list", folder, entry.path().filename().string());
}

}  // namespace nax::checkpoint
