#include "nax/checkpoint/run_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/sealed.h"
#include "io/crash_point.h"
#include "nax/checkpoint/safetensors.h"
#include "nax/io/files.h"
#include "nax/io/read_file.h"
#include "nax/core/error.h"
#include "nax/io/json.h"

namespace nax::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;  // the manifest as written

namespace {

constexpr const char* kManifest = "manifest.json";
// A manifest entry's "kind" for a safetensors file a writer of this process sealed: its checksum is
// the file's own (nax.checksum, taken while it was written), so the file is hashed once, not again
// at commit. Any other file is hashed whole.
constexpr const char* kSafetensorsKind = "safetensors";

// The manifest's entry for one file of a step being committed.
json manifest_entry(const fs::directory_entry& entry) {
  const std::string path = entry.path().string();
  json listed = {{"bytes", entry.file_size()}};
  if (const auto sealed = detail::take_sealed(path)) {
    // The header (read alone) must carry what the writer computed: a file replaced since is hashed.
    if (SafetensorsReader(path, ChecksumPolicy::verified).own_checksum() == sealed) {
      listed["checksum"] = *sealed;
      listed["kind"] = kSafetensorsKind;
      return listed;
    }
  }
  listed["checksum"] = io::file_checksum(path);
  return listed;
}

// The pid of a temporary's name "NAME.tmp.PID", or 0.
long temporary_pid(const std::string& name) {
  const auto at = name.rfind(".tmp.");
  if (at == std::string::npos) return 0;
  const std::string digits = name.substr(at + 5);
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::stol(digits);
}

bool process_alive(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

void remove_tree(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec) fail("checkpoint", "cannot remove '{}': {}", p.string(), ec.message());
}

}  // namespace

std::int64_t step_of_name(const std::string& name) {
  if (name.rfind("step_", 0) != 0) return -1;
  const std::string digits = name.substr(5);
  if (digits.size() < 6 || digits.size() > 15 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
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
    files[name] = manifest_entry(entry);
  }
  const json manifest = {{"format", "nax.checkpoint"}, {"version", 2}, {"step", step}, {"files", files}};
  io::write_file_atomically(tmp + "/" + kManifest, manifest.dump(2) + "\n");
  io::fsync_directory(tmp);
  io::crash_point();
  const std::string final_dir = step_folder(dir_, step);
  if (fs::exists(final_dir)) {  // a step written again (e.g. by a resumed run): set the old aside first
    const std::string old = fmt::format("{}.old.tmp.{}", final_dir, ::getpid());
    if (std::rename(final_dir.c_str(), old.c_str()) != 0) fail("checkpoint", "cannot move '{}' aside: {}", final_dir, std::strerror(errno));
    remove_tree(old);
  }
  if (std::rename(tmp.c_str(), final_dir.c_str()) != 0)
    fail("checkpoint", "cannot rename '{}' to '{}': {}", tmp, final_dir, std::strerror(errno));
  io::fsync_directory(dir_);
  io::crash_point();
  if (keep <= 0) return;
  auto steps = committed_steps(dir_);
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < steps.size(); ++i) {
    // Renamed to a temporary first, so that a removal cut short never looks committed.
    const std::string old = step_folder(dir_, steps[i]), doomed = fmt::format("{}.tmp.{}", old, ::getpid());
    if (std::rename(old.c_str(), doomed.c_str()) != 0) fail("checkpoint", "cannot remove '{}': {}", old, std::strerror(errno));
    io::crash_point();
    remove_tree(doomed);
  }
  io::fsync_directory(dir_);
}

std::vector<std::int64_t> committed_steps(const std::string& dir) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::int64_t step = step_of_name(it->path().filename().string());
    if (step >= 0 && it->is_directory()) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

namespace {

// The manifest's entry for one file, checked against the file on disk.
void verify_listed_file(const std::string& folder, const std::string& name, const io::JsonValue& entry, std::int64_t version) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") entry.fail("does not name a file in the folder");
  const std::string file = folder + "/" + name;
  const auto bytes = static_cast<std::uint64_t>(entry.at("bytes").integer(0, INT64_MAX));
  const std::string& want = entry.at("checksum").string();
  if (!io::is_regular_file(file)) fail("checkpoint", "'{}' is missing or not a regular file (listed in '{}', field '{}')", file, entry.file(), entry.path());
  if (fs::file_size(file) != bytes)
    fail("checkpoint", "'{}' has {} bytes, its manifest says {} ('{}', field '{}.bytes')", file, fs::file_size(file), bytes, entry.file(), entry.path());
  if (const auto kind = entry.find("kind")) {
    if (version < 2) kind->fail("is given in a version-{} manifest, which lists whole-file checksums only", version);
    if (!kind->is_string() || kind->string() != kSafetensorsKind) kind->fail("is {}, not \"{}\"", kind->brief(), kSafetensorsKind);
    // The reader hashes the whole file against the checksum in its header; the manifest holds the same.
    const std::string own = SafetensorsReader(file, ChecksumPolicy::required).own_checksum().value_or("");
    if (own != want)
      fail("checkpoint", "'{}' carries checksum {}, its manifest says {}: the file was replaced ('{}', field '{}.checksum')", file, own,
           want, entry.file(), entry.path());
    return;
  }
  const std::string sum = io::file_checksum(file);
  if (sum != want)
    fail("checkpoint", "'{}' fails its checksum (manifest {}, computed {}): the file is corrupt ('{}', field '{}.checksum')", file, want, sum,
         entry.file(), entry.path());
}

}  // namespace

void verify_step_folder(const std::string& folder) {
  const std::string path = folder + "/" + kManifest;
  std::error_code ec;
  if (!fs::exists(path, ec))
    fail("checkpoint", "'{}' has no {}: a step folder without its manifest is not a committed checkpoint, and is not read", folder, kManifest);
  const io::JsonValue manifest = io::read_json(path, io::kManifestCaps, "checkpoint");
  if (!manifest.is_object()) manifest.fail("is {}, not an object", manifest.brief());
  const io::JsonValue format = manifest.at("format"), version = manifest.at("version");
  if (!format.is_string() || format.string() != "nax.checkpoint") format.fail("is {}, not \"nax.checkpoint\"", format.brief());
  const std::int64_t listing = version.integer(1, 2);  // 1: every checksum is the whole file's; 2: a safetensors file's may be its own
  const io::JsonValue step = manifest.at("step");
  const std::int64_t named = step_of_name(fs::path(folder).filename().string()), value = step.integer(0, INT64_MAX);
  if (named >= 0 && value != named) step.fail("is {}, the folder's name says {}", value, named);
  const io::JsonValue files = manifest.at("files");
  if (!files.is_object() || files.size() == 0) files.fail("is {}, not an object listing the files", files.brief());
  std::set<std::string> listed{kManifest};
  files.for_each_member([&](const std::string& name, const io::JsonValue& entry) {
    verify_listed_file(folder, name, entry, listing);
    listed.insert(name);
  });
  for (const auto& entry : fs::directory_iterator(folder))
    if (!listed.contains(entry.path().filename().string()))
      fail("checkpoint", "'{}' holds '{}', which its manifest does not list", folder, entry.path().filename().string());
}

bool looks_like_step_folder(const std::string& dir) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(dir, ec), ec);  // "." and links resolved to the folder's own name
  if (ec) return false;
  const std::string name = p.filename().string(), parent = p.parent_path().string();
  if (step_of_name(name) >= 0 || (name.rfind("step_", 0) == 0 && temporary_pid(name) > 0)) return true;
  return fs::exists(p / kManifest, ec) || fs::exists(fs::path(parent) / ".lock", ec) || !committed_steps(parent).empty();
}

}  // namespace nax::checkpoint
