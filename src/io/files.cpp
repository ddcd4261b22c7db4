#include "nax/io/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <vector>

#include "io/crash_point.h"
#include "nax/core/error.h"

namespace nax::io {

namespace {
constexpr std::uint64_t kPrime = 0x100000001b3ull;

std::string errno_text() { return std::strerror(errno); }

// An fd closed on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void Checksum::update(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0 && pending_size_ > 0 && pending_size_ < 8) {
    pending_[pending_size_++] = *p++;
    --n;
    if (pending_size_ == 8) {
      std::uint64_t word;
      std::memcpy(&word, pending_, 8);
      hash_ = (hash_ ^ word) * kPrime;
      pending_size_ = 0;
    }
  }
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    hash_ = (hash_ ^ word) * kPrime;
  }
  for (; n > 0; --n) pending_[pending_size_++] = *p++;
}

std::uint64_t Checksum::value() const {
  std::uint64_t h = hash_;
  for (std::size_t i = 0; i < pending_size_; ++i) h = (h ^ pending_[i]) * kPrime;
  return (h ^ (h >> 29)) * kPrime;  // mixes the last word's high bits into the low ones
}

std::string Checksum::hex() const { return fmt::format("{:016x}", value()); }

std::string file_checksum(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) fail("checkpoint", "cannot read '{}': {}", path, errno_text());
  Checksum sum;
  std::vector<char> buffer(1 << 20);
  for (;;) {
    const ssize_t n = ::read(f.fd, buffer.data(), buffer.size());
    if (n < 0) fail("checkpoint", "reading '{}' failed: {}", path, errno_text());
    if (n == 0) break;
    sum.update(buffer.data(), static_cast<std::size_t>(n));
  }
  return sum.hex();
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(fmt::format("{}.tmp.{}", path_, ::getpid())) {
  // The rename at commit would put a regular file in place of a folder, a device or a FIFO.
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail("checkpoint", "cannot write '{}': it exists and is not a regular file (a folder, a device or a FIFO)", path_);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("checkpoint", "cannot create '{}': {}", tmp_, errno_text());
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("checkpoint", "writing '{}' failed after {} bytes: {}", tmp_, size_, w < 0 ? errno_text() : "no progress");
    p += w, n -= static_cast<std::size_t>(w), size_ += static_cast<std::uint64_t>(w);
  }
}

void AtomicFile::write_at(std::uint64_t offset, const void* data, std::size_t n) {
  if (offset + n > size_) fail("checkpoint", "write_at [{}, {}) past the {} bytes written to '{}'", offset, offset + n, size_, tmp_);
  if (::pwrite(fd_, data, n, static_cast<off_t>(offset)) != static_cast<ssize_t>(n))
    fail("checkpoint", "writing '{}' failed: {}", tmp_, errno_text());
}

void AtomicFile::commit() {
  if (fd_ < 0) fail("checkpoint", "'{}' was already committed", path_);
  const int fd = fd_;
  fd_ = -1;
  crash_point();
  if (::fsync(fd) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    ::unlink(tmp_.c_str());
    fail("checkpoint", "flushing '{}' failed: {}", tmp_, why);
  }
  if (::close(fd) != 0 || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp_.c_str());
    fail("checkpoint", "renaming '{}' to '{}' failed: {}", tmp_, path_, why);
  }
  crash_point();
  const auto slash = path_.find_last_of('/');
  fsync_directory(slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash));
}

void write_file_atomically(const std::string& path, const std::string& text) {
  AtomicFile file(path);
  file.write(text);
  file.commit();
}

void fsync_directory(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (f.fd < 0) fail("checkpoint", "cannot open folder '{}': {}", path, errno_text());
  if (::fsync(f.fd) != 0 && errno != EINVAL) fail("checkpoint", "flushing folder '{}' failed: {}", path, errno_text());
}

void crash_point() {
  static const long target = [] {
    const char* v = std::getenv("NAX_CHECKPOINT_KILL_AT");
    return v == nullptr ? 0L : std::atol(v);
  }();
  static std::atomic<long> count{0};
  if (target > 0 && ++count == target) ::kill(::getpid(), SIGKILL);
}

}  // namespace nax::io
