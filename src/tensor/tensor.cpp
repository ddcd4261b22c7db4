#include "nax/tensor/tensor.h"

#include <fmt/format.h>

#include <atomic>
#include <ostream>

#include "nax/kernels/kernels.h"

namespace nax {

namespace {
std::atomic<std::uint64_t> next_storage_id{1};

struct Buffer {
  void* data = nullptr;
  std::size_t bytes = 0;
  std::shared_ptr<Allocator> allocator;
  std::uint64_t id = next_storage_id.fetch_add(1, std::memory_order_relaxed);
  std::atomic<bool> read{false};
  bool known_zero = false;
  std::string pending;  // set and read on the thread of the shard that owns the storage
  Buffer(std::size_t n, std::shared_ptr<Allocator> alloc) : bytes(n), allocator(std::move(alloc)) {
    data = allocator->allocate(bytes);
  }
  ~Buffer() { allocator->deallocate(data, bytes); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};
}  // namespace

struct Tensor::Impl {
  Shape shape;
  DType dtype = DType::f32;
  VaryType vary;
  std::shared_ptr<Device> device;
  std::shared_ptr<Buffer> buffer;
  std::size_t offset = 0;  // bytes into the buffer (a piece of another tensor's storage)
  std::shared_ptr<autodiff::Node> grad_node;
};

Tensor Tensor::empty(const Shape& shape, DType dtype, std::shared_ptr<Device> device) {
  if (!device) device = Device::current();
  if (shape.rank() > kernels::kMaxRank) fail("Tensor", "rank {} of {} exceeds the maximum {}", shape.rank(), shape.str(), kernels::kMaxRank);
  auto impl = std::make_shared<Impl>();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->buffer = std::make_shared<Buffer>(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype), device->allocator_ptr());
  impl->device = std::move(device);
  return Tensor(std::move(impl));
}

namespace {
[[noreturn]] void undefined(std::string_view what) { fail(what, "the tensor is undefined (default-constructed)"); }
[[noreturn]] void dataless(std::string_view what, const std::string& tensor) {
  fail(what, "{} is the autodiff graph's record of an op's input, which keeps no data (a backward that reads an input must "
       "capture it)", tensor);
}
}  // namespace

const Shape& Tensor::shape() const {
  if (!impl_) undefined("Tensor::shape");
  return impl_->shape;
}
DType Tensor::dtype() const {
  if (!impl_) undefined("Tensor::dtype");
  return impl_->dtype;
}
const VaryType& Tensor::vary() const {
  if (!impl_) undefined("Tensor::vary");
  return impl_->vary;
}
const Device& Tensor::device() const { return *device_ptr(); }
const std::shared_ptr<Device>& Tensor::device_ptr() const {
  if (!impl_) undefined("Tensor::device");
  return impl_->device;
}
std::size_t Tensor::nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }

const void* Tensor::raw() const {
  if (!impl_) undefined("Tensor::data");
  if (!impl_->buffer) dataless("Tensor::data", str());
  return static_cast<const char*>(impl_->buffer->data) + impl_->offset;
}
void* Tensor::raw_mutable() {
  if (!impl_) undefined("Tensor::data");
  if (!impl_->buffer) dataless("Tensor::mutable_data", str());
  Buffer& b = *impl_->buffer;
  if (!b.pending.empty())
    fail("Tensor::mutable_data", "{} is read or written by {}, still in flight: wait() for it before writing (or write a copy)",
         str(), b.pending);
  if (b.read.load(std::memory_order_relaxed))
    fail("Tensor::mutable_data", "{} was already read by an op, and tensors are immutable once used (a gradient, a remat "
         "recompute or a started collective may read it again): write a fresh tensor instead (Tensor::empty, or contiguous_copy "
         "of this one)", str());
  b.known_zero = false;
  return static_cast<char*>(b.data) + impl_->offset;
}

Tensor Tensor::piece(std::size_t byte_offset, const Shape& shape) const {
  if (!impl_) undefined("Tensor::piece");
  if (!impl_->buffer) dataless("Tensor::piece", str());
  const std::size_t bytes = static_cast<std::size_t>(shape.numel()) * dtype_size(impl_->dtype);
  if (byte_offset + bytes > nbytes() || byte_offset % dtype_size(impl_->dtype) != 0)
    fail("Tensor::piece", "{} bytes from byte {} lie outside {} ({} bytes)", bytes, byte_offset, str(), nbytes());
  auto impl = std::make_shared<Impl>();
  impl->shape = shape;
  impl->dtype = impl_->dtype;
  impl->device = impl_->device;
  impl->buffer = impl_->buffer;
  impl->offset = impl_->offset + byte_offset;
  return Tensor(std::move(impl));
}

bool Tensor::known_zero() const { return has_data() && impl_->buffer->known_zero; }

Tensor Tensor::as_known_zero() const {
  if (has_data()) impl_->buffer->known_zero = true;
  return *this;
}

std::uint64_t Tensor::storage_id() const { return has_data() ? impl_->buffer->id : 0; }
std::weak_ptr<const void> Tensor::storage_handle() const {
  return has_data() ? std::weak_ptr<const void>(impl_->buffer) : std::weak_ptr<const void>();
}
std::uint64_t Tensor::next_storage_id() { return nax::next_storage_id.load(std::memory_order_relaxed); }

void Tensor::mark_read() const {
  if (has_data() && !impl_->buffer->read.load(std::memory_order_relaxed)) impl_->buffer->read.store(true, std::memory_order_relaxed);
}

void Tensor::set_pending(std::string pending) const {
  if (has_data()) impl_->buffer->pending = std::move(pending);
}

void Tensor::check_element_type(DType requested) const {
  if (dtype() != requested)
    fail("Tensor::data", "requested {} elements of {}", dtype_name(requested), str());
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  if (!device().host_accessible()) return on_host().to_vector<T>();
  std::vector<T> out(static_cast<std::size_t>(numel()));
  if constexpr (std::is_same_v<T, bf16>) {
    kernels::cpu_kernels_ptr()->convert(dtype(), raw(), DType::bf16, out.data(), numel());
  } else {
    std::vector<double> wide(out.size());
    kernels::cpu_kernels_ptr()->convert(dtype(), raw(), DType::f64, wide.data(), numel());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(wide[i]);
  }
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<std::int32_t> Tensor::to_vector<std::int32_t>() const;
template std::vector<bf16> Tensor::to_vector<bf16>() const;

namespace {
std::atomic<void (*)()> t_after_host_read{nullptr};
}  // namespace

void Tensor::after_host_read(void (*hook)()) { t_after_host_read.store(hook); }

Tensor Tensor::on_host() const {
  if (device().host_accessible()) return *this;
  Tensor out = Tensor::empty(shape(), dtype(), Device::host()).with_vary(vary());
  device().kernels().copy_to_host(out.raw_mutable(), raw(), nbytes());
  if (auto* hook = t_after_host_read.load()) hook();
  return out;
}

double Tensor::item() const {
  if (numel() != 1) fail("Tensor::item", "needs exactly one element, got {}", str());
  return to_vector<double>()[0];
}

Tensor Tensor::with_vary(VaryType vary) const {
  auto impl = std::make_shared<Impl>(*impl_);
  impl->vary = std::move(vary);
  return Tensor(std::move(impl));
}

Tensor Tensor::with_shape(Shape shape) const {
  if (shape.numel() != numel()) fail("Tensor::with_shape", "{} has {} elements, {} has {}", str(), numel(), shape.str(), shape.numel());
  auto impl = std::make_shared<Impl>(*impl_);
  impl->shape = std::move(shape);
  return Tensor(std::move(impl));
}

bool Tensor::same_storage(const Tensor& other) const {
  return has_data() && other.has_data() && impl_->buffer == other.impl_->buffer;
}

bool Tensor::referenced_elsewhere() const { return has_data() && (impl_.use_count() > 1 || impl_->buffer.use_count() > 1); }

bool Tensor::has_data() const { return impl_ && impl_->buffer; }

Tensor Tensor::without_data() const {
  if (!impl_) return Tensor();
  auto impl = std::make_shared<Impl>(*impl_);
  impl->buffer = nullptr;
  impl->offset = 0;
  return Tensor(std::move(impl));
}

bool Tensor::requires_grad() const { return impl_ && impl_->grad_node != nullptr; }

const std::shared_ptr<autodiff::Node>& Tensor::grad_node() const {
  static const std::shared_ptr<autodiff::Node> none;
  return impl_ ? impl_->grad_node : none;
}

Tensor Tensor::with_grad_node(std::shared_ptr<autodiff::Node> node) const {
  auto impl = std::make_shared<Impl>(*impl_);
  impl->grad_node = std::move(node);
  return Tensor(std::move(impl));
}

std::string Tensor::str() const {
  if (!impl_) return "undefined";
  std::vector<std::string> parts;
  for (const auto& axis : impl_->shape.axes()) {
    auto mesh_axes = impl_->vary.split_mesh_axes(axis.name);
    if (mesh_axes.empty()) parts.push_back(fmt::format("{}={}", axis.name, axis.size));
    else parts.push_back(fmt::format("{}={}|{}", axis.name, axis.size, fmt::join(mesh_axes, ",")));
  }
  return fmt::format("{}[{}] {}", dtype_name(impl_->dtype), fmt::join(parts, ", "), impl_->vary.str());
}

std::string Tensor::format(int max_values) const {
  std::string out = str();
  if (!impl_) return out;
  auto values = to_vector<double>();
  std::vector<std::string> shown;
  for (std::size_t i = 0; i < values.size() && static_cast<int>(i) < max_values; ++i)
    shown.push_back(impl_->dtype == DType::i32 ? fmt::format("{}", static_cast<long long>(values[i])) : fmt::format("{:.4g}", values[i]));
  if (static_cast<int>(values.size()) > max_values) shown.push_back("...");
  return fmt::format("{} {{{}}}", out, fmt::join(shown, ", "));
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace nax
