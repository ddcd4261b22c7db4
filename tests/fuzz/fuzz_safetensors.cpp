// libFuzzer target: nax::checkpoint::SafetensorsReader on arbitrary bytes. Every input must load
// or raise a nax::Error; anything else (a crash, a sanitizer report, another exception, a hang)
// is a finding. The first byte picks the mode: odd resealed (the file's nax.checksum recomputed,
// so that mutations reach the structural checks behind it), even as is.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "nax/io/files.h"
#include "nax/checkpoint/safetensors.h"

namespace {

void reseal(std::string& file) {
  if (file.size() < 8) return;
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[static_cast<std::size_t>(i)]);
  if (n > file.size() - 8) return;
  const std::string key = "\"nax.checksum\":\"";
  const auto at = file.find(key, 8);
  if (at == std::string::npos || at + key.size() + 16 > 8 + n) return;
  const std::size_t digits = at + key.size();
  file.replace(digits, 16, std::string(16, '0'));
  nax::io::Checksum sum;
  sum.update(file.data(), file.size());
  file.replace(digits, 16, sum.hex());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const int fd = ::memfd_create("fuzz_safetensors", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (size == 0) return 0;
  std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) reseal(file);
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, file.data(), file.size(), 0) != static_cast<ssize_t>(file.size())) return 0;
  try {
    nax::checkpoint::SafetensorsReader reader(path);
    for (const auto& t : reader.tensors()) reader.read(t.name);
  } catch (const nax::Error&) {
  }
  return 0;
}
