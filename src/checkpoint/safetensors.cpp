#include "checkpoint/sealed.h"
#include "nax/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "io/crash_point.h"
#include "nax/io/files.h"
#include "nax/checkpoint/run_folder.h"
#include "nax/io/json.h"
#include "nax/ops/ops.h"

namespace nax::checkpoint {

using nlohmann::json;

namespace {

constexpr const char* kChecksumKey = "nax.checksum";
constexpr const char* kAxesKey = "nax.axes";
constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;  // the safetensors specification's limit
constexpr int kMaxRank = 16;
const std::string kZeroChecksum(16, '0');

constexpr const char* kHalf = "F16";

DType dtype_from(const std::string& s, const std::string& path, const std::string& name) {
  for (auto d : {DType::f32, DType::f64, DType::bf16, DType::i32})
    if (safetensors_dtype(d) == s) return d;
  if (s == kHalf) return DType::f32;  // read converted
  fail("safetensors", "'{}': tensor '{}' has dtype '{}' (nax reads F32, F64, F16, BF16 and I32)", path, name, s);
}

std::uint64_t stored_element_size(const TensorInfo& t) { return t.f16 ? 2 : dtype_size(t.dtype); }

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  std::uint32_t u = 0;
  if (exponent == 0) {  // zero or subnormal: mantissa x 2^-24, exact in f32
    const float f = std::ldexp(static_cast<float>(mantissa), -24);
    std::memcpy(&u, &f, sizeof u);
    u |= sign;
  } else if (exponent == 31) {
    u = sign | 0x7f800000u | (mantissa << 13);  // infinity or NaN
  } else {
    u = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Rounded to nearest even; beyond the largest half (65504, up to the rounding midpoint) infinity.
std::uint16_t float_to_half(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal half, in units of 2^-24
    float a = 0;
    std::memcpy(&a, &magnitude, sizeof a);
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(a * 16777216.0f)));
  }
  std::uint32_t h = (((magnitude >> 23) - 112) << 10) | ((magnitude & 0x7fffffu) >> 13);
  const std::uint32_t rest = magnitude & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<std::uint16_t>(sign | h);
}

std::string little_endian(std::uint64_t n) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return bytes;
}

// Where the checksum's digits sit in a header's text, or npos.
std::size_t checksum_position(const std::string& header, const std::string& digits) {
  const std::string pattern = fmt::format("\"{}\":\"{}\"", kChecksumKey, digits);
  const auto at = header.find(pattern);
  return at == std::string::npos ? at : at + pattern.size() - 1 - digits.size();
}

std::uint64_t element_count(const std::vector<std::int64_t>& dims, const std::string& path, const std::string& name) {
  std::uint64_t n = 1;
  for (auto d : dims)
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n))
      fail("safetensors", "'{}': tensor '{}' has a shape of more than 2^64 elements", path, name);
  return n;
}

// The header through nax's bounded JSON reader (duplicate names, deep nesting and excess refused).
io::JsonValue parse_header(const std::string& text, const std::string& path) {
  return io::parse_json(text, path, io::kSafetensorsHeaderCaps, "safetensors");
}

std::int64_t dim_from(const json& d, const std::string& path, const std::string& name) {
  if (!d.is_number_integer() || (d.is_number_integer() && !d.is_number_unsigned() && d.get<std::int64_t>() < 0))
    fail("safetensors", "'{}': tensor '{}' has shape entry {}, not a non-negative integer", path, name, d.dump());
  const auto v = d.get<std::uint64_t>();
  if (v > static_cast<std::uint64_t>(INT64_MAX)) fail("safetensors", "'{}': tensor '{}' has shape entry {} out of range", path, name, v);
  return static_cast<std::int64_t>(v);
}

std::uint64_t offset_from(const json& d, const std::string& path, const std::string& name) {
  if (!d.is_number_unsigned()) fail("safetensors", "'{}': tensor '{}' has data_offsets entry {}, not a non-negative integer", path, name, d.dump());
  return d.get<std::uint64_t>();
}

TensorInfo entry_from(const std::string& name, const json& entry, const std::string& path) {
  if (!entry.is_object()) fail("safetensors", "'{}': the entry of tensor '{}' is not an object", path, name);
  for (const auto& [field, value] : entry.items())
    if (field != "dtype" && field != "shape" && field != "data_offsets")
      fail("safetensors", "'{}': tensor '{}' has an unknown field '{}'", path, name, field);
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(field)) fail("safetensors", "'{}': tensor '{}' has no '{}'", path, name, field);
  if (!entry["dtype"].is_string()) fail("safetensors", "'{}': tensor '{}' has a dtype that is not a string", path, name);
  TensorInfo info{name, dtype_from(entry["dtype"].get<std::string>(), path, name), {}, 0, 0};
  info.f16 = entry["dtype"] == kHalf;
  const json& shape = entry["shape"];
  if (!shape.is_array() || shape.size() > kMaxRank)
    fail("safetensors", "'{}': tensor '{}' has a shape that is not a list of at most {} sizes", path, name, kMaxRank);
  for (const auto& d : shape) info.dims.push_back(dim_from(d, path, name));
  const json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) fail("safetensors", "'{}': tensor '{}' has data_offsets that are not [begin, end]", path, name);
  info.begin = offset_from(offsets[0], path, name), info.end = offset_from(offsets[1], path, name);
  if (info.end < info.begin) fail("safetensors", "'{}': tensor '{}' has data_offsets [{}, {}) that end before they begin", path, name, info.begin, info.end);
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(element_count(info.dims, path, name), stored_element_size(info), &bytes) || bytes != info.nbytes())
    fail("safetensors", "'{}': tensor '{}' is {} [{}] ({} bytes by its dtype and shape) but data_offsets [{}, {}) hold {} bytes", path, name,
         entry["dtype"].get<std::string>(), fmt::join(info.dims, ", "), bytes, info.begin, info.end, info.nbytes());
  return info;
}

// NaNs and infinities in a host tensor (0 for integer dtypes).
std::uint64_t count_nonfinite(const Tensor& host) {
  const auto n = static_cast<std::size_t>(host.numel());
  std::uint64_t bad = 0;
  if (host.dtype() == DType::f32) {
    const auto* v = static_cast<const float*>(host.raw());
    for (std::size_t i = 0; i < n; ++i) bad += !std::isfinite(v[i]);
  } else if (host.dtype() == DType::f64) {
    const auto* v = static_cast<const double*>(host.raw());
    for (std::size_t i = 0; i < n; ++i) bad += !std::isfinite(v[i]);
  } else if (host.dtype() == DType::bf16) {
    const auto* v = static_cast<const std::uint16_t*>(host.raw());
    for (std::size_t i = 0; i < n; ++i) bad += (v[i] & 0x7f80u) == 0x7f80u;  // exponent all ones
  }
  return bad;
}

// "nax.axes": {"w": [["embed", 4], ["out", 8]], ...}, the global axes of each tensor that has them.
std::string axes_json(const std::vector<TensorInfo>& tensors) {
  json all = json::object();
  for (const auto& t : tensors) {
    if (t.axes.empty()) continue;
    json axes = json::array();
    for (const auto& a : t.axes) axes.push_back({a.name, a.size});
    all[t.name] = axes;
  }
  return all.empty() ? std::string() : all.dump();
}

std::vector<Axis> axes_from(const json& axes, const TensorInfo& t, const std::string& path) {
  auto refuse = [&](const std::string& why) { fail("safetensors", "'{}': metadata {} for tensor '{}' {}", path, kAxesKey, t.name, why); };
  if (!axes.is_array() || axes.size() > kMaxRank) refuse(fmt::format("is not a list of at most {} [name, size] pairs", kMaxRank));
  std::vector<Axis> out;
  std::set<std::string> names;
  std::int64_t nonzero = 1;  // the strides a read computes stay in range even beside an axis of size 0
  for (const auto& a : axes) {
    if (!a.is_array() || a.size() != 2 || !a[0].is_string() || !a[1].is_number_unsigned()) refuse(fmt::format("holds {}, not [name, size]", a.dump()));
    const auto name = a[0].get<std::string>();
    const auto size = a[1].get<std::uint64_t>();
    if (name.empty() || !names.insert(name).second) refuse(fmt::format("names axis '{}' empty or twice", name));
    if (size > static_cast<std::uint64_t>(INT64_MAX) || (size > 0 && __builtin_mul_overflow(nonzero, static_cast<std::int64_t>(size), &nonzero)))
      refuse(fmt::format("gives axis '{}' size {} out of range", name, size));
    out.push_back({name, static_cast<std::int64_t>(size)});
  }
  std::vector<std::int64_t> sizes;
  for (const auto& a : out) sizes.push_back(a.size);
  if (element_count(sizes, path, t.name) != element_count(t.dims, path, t.name))
    refuse(fmt::format("gives {} elements, the tensor is [{}]", element_count(sizes, path, t.name), fmt::join(t.dims, ", ")));
  return out;
}

// Fills in each tensor's axes from the metadata's "nax.axes" (absent: none recorded), read by the
// same bounded JSON reader as the header.
void read_axes(const Metadata& metadata, std::vector<TensorInfo>& tensors, const std::string& path) {
  const auto it = metadata.find(kAxesKey);
  if (it == metadata.end()) return;
  std::optional<io::JsonValue> parsed;
  try {
    parsed.emplace(io::parse_json(it->second, path, io::kSafetensorsHeaderCaps, "safetensors"));
  } catch (const Error& e) {
    fail("safetensors", "'{}': metadata {} is not valid: {}", path, kAxesKey, e.what());
  }
  const json& all = parsed->raw();
  if (!all.is_object()) fail("safetensors", "'{}': metadata {} is not a JSON object", path, kAxesKey);
  std::map<std::string, TensorInfo*> by_name;
  for (auto& t : tensors) by_name[t.name] = &t;
  for (const auto& [name, axes] : all.items()) {
    const auto t = by_name.find(name);
    if (t == by_name.end()) fail("safetensors", "'{}': metadata {} names tensor '{}', which the file does not hold", path, kAxesKey, name);
    t->second->axes = axes_from(axes, *t->second, path);
  }
}

// The elements after axis i of `axes` (its stride in row-major order).
std::int64_t stride_after(const std::vector<Axis>& axes, std::size_t i) {
  std::int64_t n = 1;
  for (std::size_t j = i + 1; j < axes.size(); ++j) n *= axes[j].size;
  return n;
}

// Whether every axis `shape` shares with `axes` has the same size and stride there: then reading
// the elements as `shape` keeps each shared axis's meaning (other axes merged, split or renamed).
bool positions_agree(const std::vector<Axis>& axes, const Shape& shape) {
  for (std::size_t i = 0; i < axes.size(); ++i) {
    const int j = shape.index_of(axes[i].name);
    if (j >= 0 && (shape[j].size != axes[i].size || stride_after(shape.axes(), static_cast<std::size_t>(j)) != stride_after(axes, i)))
      return false;
  }
  return true;
}

bool is_permutation_of(const std::vector<Axis>& axes, const Shape& shape) {
  if (static_cast<int>(axes.size()) != shape.rank()) return false;
  for (const auto& a : axes)
    if (!shape.has(a.name) || shape.size(a.name) != a.size) return false;
  return true;
}

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void pread_all(int fd, void* out, std::uint64_t n, std::uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("safetensors", "reading '{}' failed: {}", path, std::strerror(errno));
    if (r == 0) fail("safetensors", "'{}' ended early (it changed while being read)", path);
    p += r, n -= static_cast<std::uint64_t>(r), offset += static_cast<std::uint64_t>(r);
  }
}

}  // namespace

std::string safetensors_dtype(DType d) {
  switch (d) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
  }
  return "?";
}

std::string safetensors_dtype(const TensorInfo& info) { return info.f16 ? kHalf : safetensors_dtype(info.dtype); }

// --- writer ---

struct SafetensorsWriter::State {
  explicit State(std::string path) : file(std::move(path)) {}
  io::AtomicFile file;
  std::vector<TensorInfo> tensors;
  std::size_t next = 0;
  std::uint64_t checksum_at = 0;  // file offset of the checksum's digits
  io::Checksum sum;
};

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<TensorInfo> tensors, const Metadata& metadata) {
  json header = json::object();
  std::uint64_t offset = 0;
  std::set<std::string> names;
  for (auto& t : tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second)
      fail("save_safetensors", "'{}': tensor name '{}' is reserved or repeated", path, t.name);
    if (t.f16 && t.dtype != DType::f32) fail("save_safetensors", "'{}': tensor '{}' is stored as F16 from f32 tensors only", path, t.name);
    std::uint64_t bytes = element_count(t.dims, path, t.name) * stored_element_size(t);
    t.begin = offset, t.end = offset + bytes, offset = t.end;
    header[t.name] = {{"dtype", safetensors_dtype(t)}, {"shape", t.dims}, {"data_offsets", {t.begin, t.end}}};
    std::vector<std::int64_t> sizes;
    for (const auto& a : t.axes) sizes.push_back(a.size);
    if (!t.axes.empty() && element_count(sizes, path, t.name) != element_count(t.dims, path, t.name))
      fail("save_safetensors", "'{}': tensor '{}' announced with axes {} but stored as [{}]: the element counts differ", path, t.name,
           Shape(t.axes).str(), fmt::join(t.dims, ", "));
  }
  json meta = json::object();
  for (const auto& [k, v] : metadata) meta[k] = v;
  meta.erase(kAxesKey);  // nax's own, from the tensors' axes (a caller's copy may describe another file)
  if (const std::string axes = axes_json(tensors); !axes.empty()) meta[kAxesKey] = axes;
  meta[kChecksumKey] = kZeroChecksum;
  header["__metadata__"] = meta;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data aligned to 8 bytes
  const std::string prefix = little_endian(text.size()) + text;
  state_ = std::make_unique<State>(std::move(path));
  state_->tensors = std::move(tensors);
  state_->checksum_at = 8 + checksum_position(text, kZeroChecksum);
  state_->file.write(prefix);
  state_->sum.update(prefix.data(), prefix.size());
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::write(const Tensor& t) {
  State& s = *state_;
  if (s.next >= s.tensors.size()) fail("save_safetensors", "'{}': more tensors written than the {} announced", s.file.path(), s.tensors.size());
  const TensorInfo& info = s.tensors[s.next];
  if (!t.device().is_host() && !t.device().host_accessible())
    fail("save_safetensors", "'{}': tensor '{}' is {} on {}: gather it to the host first", s.file.path(), info.name, t.str(), t.device().str());
  if (t.dtype() != info.dtype || static_cast<std::uint64_t>(t.numel()) * stored_element_size(info) != info.nbytes())
    fail("save_safetensors", "'{}': tensor '{}' is {}, announced as {} of {} bytes", s.file.path(), info.name, t.str(),
         safetensors_dtype(info), info.nbytes());
  if (!info.axes.empty() && t.shape().axes() != info.axes)
    fail("save_safetensors", "'{}': tensor '{}' is {}, announced with axes {}", s.file.path(), info.name, t.str(), Shape(info.axes).str());
  if (info.f16) {
    std::vector<std::uint16_t> halves(static_cast<std::size_t>(t.numel()));
    const auto* values = static_cast<const float*>(t.raw());
    for (std::size_t i = 0; i < halves.size(); ++i) halves[i] = float_to_half(values[i]);
    s.file.write(halves.data(), info.nbytes());
    s.sum.update(halves.data(), info.nbytes());
  } else {
    s.file.write(t.raw(), t.nbytes());
    s.sum.update(t.raw(), t.nbytes());
  }
  ++s.next;
  io::crash_point();
}

void SafetensorsWriter::commit() {
  State& s = *state_;
  if (s.next != s.tensors.size())
    fail("save_safetensors", "'{}': {} of {} tensors written before commit", s.file.path(), s.next, s.tensors.size());
  const std::string digits = s.sum.hex();
  s.file.write_at(s.checksum_at, digits.data(), digits.size());
  s.file.commit();
  detail::remember_sealed(s.file.path(), digits);
}

// --- reader ---

struct SafetensorsReader::State {
  std::string path;
  NonFinitePolicy nonfinite = NonFinitePolicy::allow;
  std::shared_ptr<Fd> fd;
  std::uint64_t data_start = 0;
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::size_t> index;
  Metadata metadata;
};

SafetensorsReader::SafetensorsReader(const std::string& path, ChecksumPolicy policy, NonFinitePolicy nonfinite) {
  auto st = std::make_shared<State>();
  st->path = path;
  st->nonfinite = nonfinite;
  st->fd = std::make_shared<Fd>(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (st->fd->fd < 0) fail("safetensors", "cannot read '{}': {}", path, std::strerror(errno));
  struct stat info {};
  if (::fstat(st->fd->fd, &info) != 0) fail("safetensors", "cannot stat '{}': {}", path, std::strerror(errno));
  if (S_ISDIR(info.st_mode)) fail("safetensors", "'{}' is a folder, not a safetensors file", path);
  if (!S_ISREG(info.st_mode)) fail("safetensors", "'{}' is not a regular file (a device, FIFO or socket)", path);
  const auto file_size = static_cast<std::uint64_t>(info.st_size);
  if (file_size < 8) fail("safetensors", "'{}' is truncated: {} bytes, fewer than the 8 of the header length", path, file_size);
  unsigned char length[8];
  pread_all(st->fd->fd, length, 8, 0, path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length[i];
  if (n > file_size - 8 || n > kMaxHeaderBytes)
    fail("safetensors", "'{}' is truncated or corrupt: its header length {} does not fit the {}-byte file (or the {}-byte limit)", path, n,
         file_size, kMaxHeaderBytes);
  std::string text(n, '\0');
  pread_all(st->fd->fd, text.data(), n, 8, path);
  st->data_start = 8 + n;
  const std::uint64_t data_size = file_size - st->data_start;
  const io::JsonValue parsed = parse_header(text, path);
  const json& header = parsed.raw();
  if (!header.is_object()) fail("safetensors", "'{}': the header is not a JSON object", path);

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("safetensors", "'{}': __metadata__ is not an object", path);
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail("safetensors", "'{}': metadata '{}' is not a string", path, k);
        st->metadata[k] = v.get<std::string>();
      }
      continue;
    }
    st->tensors.push_back(entry_from(name, entry, path));
  }
  read_axes(st->metadata, st->tensors, path);
  std::sort(st->tensors.begin(), st->tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t covered = 0;
  for (const auto& t : st->tensors) {
    if (t.begin != covered)
      fail("safetensors", "'{}': tensor '{}' begins at byte {} of the data, where {} (the end of the tensor before it) was expected: {}",
           path, t.name, t.begin, covered, t.begin < covered ? "it overlaps another" : "a gap is left");
    covered = t.end;
  }
  if (covered != data_size)
    fail("safetensors", "'{}': the tensors cover {} bytes of data, the file holds {} after its header", path, covered, data_size);
  for (std::size_t i = 0; i < st->tensors.size(); ++i) st->index[st->tensors[i].name] = i;

  auto checksum = st->metadata.find(kChecksumKey);
  if (policy == ChecksumPolicy::verified || (checksum == st->metadata.end() && policy == ChecksumPolicy::if_present)) {
    state_ = std::move(st);
    return;
  }
  if (checksum == st->metadata.end()) fail("safetensors", "'{}' has no {} in its metadata (not written by nax?)", path, kChecksumKey);
  const std::string want = checksum->second;
  const auto at = want.size() == 16 ? checksum_position(text, want) : std::string::npos;
  if (at == std::string::npos) fail("safetensors", "'{}': metadata {} is malformed", path, kChecksumKey);
  std::string zeroed = text;
  zeroed.replace(at, 16, kZeroChecksum);
  io::Checksum sum;
  sum.update(length, 8);
  sum.update(zeroed.data(), zeroed.size());
  std::vector<char> buffer(std::min<std::uint64_t>(data_size, 1 << 20));
  for (std::uint64_t done = 0; done < data_size;) {
    const std::uint64_t chunk = std::min<std::uint64_t>(buffer.size(), data_size - done);
    pread_all(st->fd->fd, buffer.data(), chunk, st->data_start + done, path);
    sum.update(buffer.data(), chunk);
    done += chunk;
  }
  if (sum.hex() != want)
    fail("safetensors", "'{}' fails its checksum (stored {}, computed {}): the file is corrupt or truncated", path, want, sum.hex());
  state_ = std::move(st);
}

const std::string& SafetensorsReader::path() const { return state_->path; }
const std::vector<TensorInfo>& SafetensorsReader::tensors() const { return state_->tensors; }
const Metadata& SafetensorsReader::metadata() const { return state_->metadata; }
std::optional<std::string> SafetensorsReader::own_checksum() const {
  const auto it = state_->metadata.find(kChecksumKey);
  return it == state_->metadata.end() ? std::nullopt : std::optional<std::string>(it->second);
}

const TensorInfo* SafetensorsReader::find(const std::string& name) const {
  auto it = state_->index.find(name);
  return it == state_->index.end() ? nullptr : &state_->tensors[it->second];
}

const TensorInfo& SafetensorsReader::expect(const std::string& name, const std::vector<std::int64_t>& dims) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) fail("safetensors", "'{}' has no tensor '{}'", path(), name);
  if (t->dims != dims)
    fail("safetensors", "'{}': tensor '{}' has shape [{}], expected [{}]", path(), name, fmt::join(t->dims, ", "), fmt::join(dims, ", "));
  return *t;
}

const TensorInfo& SafetensorsReader::expect(const std::string& name, const std::vector<std::int64_t>& dims, DType dtype) const {
  const TensorInfo& t = expect(name, dims);
  if (t.dtype != dtype)
    fail("safetensors", "'{}': tensor '{}' is {}, expected {}", path(), name, safetensors_dtype(t), safetensors_dtype(dtype));
  return t;
}

Tensor SafetensorsReader::read(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) fail("safetensors", "'{}' has no tensor '{}'", path(), name);
  if (!t->axes.empty()) return read(name, Shape(t->axes));
  std::vector<Axis> axes;
  for (auto d : t->dims) axes.push_back({fmt::format("d{}", axes.size()), d});
  return read(name, Shape(axes));
}

Shape SafetensorsReader::stored_as(const std::string& name, const Shape& shape) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) fail("safetensors", "'{}' has no tensor '{}'", path(), name);
  if (t->axes.empty() || positions_agree(t->axes, shape)) return shape;
  if (is_permutation_of(t->axes, shape)) return Shape(t->axes);
  fail("safetensors", "'{}': tensor '{}' was saved with axes {}, which {} names in other places or with other sizes: read as it "
       "asks, the data would be transposed or cut otherwise. Name the saved axes (in any order: they are permuted), or other "
       "axes entirely to read the elements in their stored order", path(), name, Shape(t->axes).str(), shape.str());
}

Tensor SafetensorsReader::read(const std::string& name, const Shape& shape) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) fail("safetensors", "'{}' has no tensor '{}'", path(), name);
  if (static_cast<std::uint64_t>(shape.numel()) * stored_element_size(*t) != t->nbytes())
    fail("safetensors", "'{}': tensor '{}' of {} bytes read as {}", path(), name, t->nbytes(), shape.str());
  if (const Shape stored = stored_as(name, shape); stored != shape) return transpose(read_as(*t, stored), shape.names());
  return read_as(*t, shape);
}

Tensor SafetensorsReader::read_as(const TensorInfo& info, const Shape& shape) const {
  Tensor out = Tensor::empty(shape, info.dtype, Device::host());
  if (!info.f16) {
    pread_all(state_->fd->fd, out.raw_mutable(), info.nbytes(), state_->data_start + info.begin, path());
  } else {
    std::vector<std::uint16_t> halves(static_cast<std::size_t>(shape.numel()));
    pread_all(state_->fd->fd, halves.data(), info.nbytes(), state_->data_start + info.begin, path());
    auto* values = static_cast<float*>(out.raw_mutable());
    for (std::size_t i = 0; i < halves.size(); ++i) values[i] = half_to_float(halves[i]);
  }
  if (state_->nonfinite == NonFinitePolicy::refuse)
    if (const std::uint64_t bad = count_nonfinite(out); bad > 0)
      fail("safetensors", "'{}': tensor '{}' holds {} non-finite values (NaN or infinity) among its {}: refused as weights", path(), info.name,
           bad, out.numel());
  return out;
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors, const Metadata& metadata) {
  std::vector<TensorInfo> infos;
  for (const auto& [name, t] : tensors) {
    std::vector<std::int64_t> dims;
    for (const auto& a : t.shape().axes()) dims.push_back(a.size);
    TensorInfo info{name, t.dtype(), dims};
    info.axes = t.shape().axes();
    infos.push_back(std::move(info));
  }
  SafetensorsWriter writer(path, std::move(infos), metadata);
  for (const auto& [name, t] : tensors) writer.write(t);
  writer.commit();
}

std::map<std::string, Tensor> load_safetensors(const std::string& path, Metadata* metadata) {
  SafetensorsReader reader(path);
  std::map<std::string, Tensor> out;
  for (const auto& t : reader.tensors()) out.emplace(t.name, reader.read(t.name));
  if (metadata != nullptr) *metadata = reader.metadata();
  return out;
}

}  // namespace nax::checkpoint
