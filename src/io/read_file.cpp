#include "nax/io/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "nax/core/error.h"

namespace nax::io {

namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string errno_text() { return std::strerror(errno); }

// Opens `path` for reading and checks what it is; its size.
std::uint64_t open_regular(const std::string& path, Fd& f) {
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // O_NONBLOCK: a FIFO does not block the open
  if (f.fd < 0) fail("read_file", "cannot read '{}': {}", path, errno_text());
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail("read_file", "cannot stat '{}': {}", path, errno_text());
  if (S_ISDIR(st.st_mode)) fail("read_file", "'{}' is a folder, not a file", path);
  if (!S_ISREG(st.st_mode)) fail("read_file", "'{}' is not a regular file (a device, FIFO or socket)", path);
  return static_cast<std::uint64_t>(st.st_size);
}

std::string read_all(const std::string& path, const Fd& f, std::uint64_t size) {
  std::string text(size, '\0');
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(f.fd, text.data() + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("read_file", "reading '{}' failed: {}", path, errno_text());
    if (n == 0) fail("read_file", "'{}' shrank while being read ({} of {} bytes)", path, done, size);
    done += static_cast<std::size_t>(n);
  }
  return text;
}

}  // namespace

std::string format_bytes(std::uint64_t bytes) {
  if (bytes >= kMiB && bytes % kMiB == 0) return bytes % (kMiB << 10) == 0 ? fmt::format("{} GiB", bytes >> 30) : fmt::format("{} MiB", bytes >> 20);
  return fmt::format("{} bytes", bytes);
}

std::string read_file(const std::string& path, std::uint64_t max_bytes) {
  Fd f;
  const std::uint64_t size = open_regular(path, f);
  if (size > max_bytes) fail("read_file", "'{}' has {} bytes, more than the {} expected of it", path, size, format_bytes(max_bytes));
  return read_all(path, f, size);
}

std::string read_file(const std::string& path, const FileCaps& caps) {
  Fd f;
  const std::uint64_t size = open_regular(path, f);
  if (size > caps.max_bytes) fail("read_file", "'{}' has {} bytes, over the cap of {} for a {}", path, size, format_bytes(caps.max_bytes), caps.kind);
  return read_all(path, f, size);
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace nax::io
