#pragma once
// Durable files: writes that are either complete or absent (a temporary file, flushed, renamed,
// and the folder flushed), and the checksum that checkpoints and token files store.
#include <cstddef>
#include <cstdint>
#include <string>

namespace nax::io {

// A streaming 64-bit checksum (FNV-1a over 8-byte words, then the tail bytes): fast enough to
// cover every byte of a multi-gigabyte checkpoint, and any change of one byte changes it.
class Checksum {
 public:
  void update(const void* data, std::size_t n);
  std::uint64_t value() const;
  std::string hex() const;  // 16 lowercase hex digits

 private:
  std::uint64_t hash_ = 0xcbf29ce484222325ull;
  unsigned char pending_[8] = {};
  std::size_t pending_size_ = 0;
};

// The checksum of a whole file, read in chunks (bounded memory).
std::string file_checksum(const std::string& path);

// A file written as `path`.tmp.PID and renamed to `path` by commit(), after an fsync of the file
// and followed by one of its folder; destroyed uncommitted, the temporary is removed. Write errors
// (a full disk, a file size limit) raise a nax::Error naming the file.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  void write(const void* data, std::size_t n);
  void write(const std::string& text) { write(text.data(), text.size()); }
  // Overwrites bytes already written, at `offset` (e.g. a checksum reserved in a header).
  void write_at(std::uint64_t offset, const void* data, std::size_t n);
  std::uint64_t size() const { return size_; }
  void commit();

  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// Writes `text` to `path` atomically (AtomicFile).
void write_file_atomically(const std::string& path, const std::string& text);

// Flushes a folder's entries (after a rename or a new file in it) to disk.
void fsync_directory(const std::string& path);

}  // namespace nax::io
