#pragma once
// Tensor: an eager, immutable block of memory with named axes, a dtype, a device and a vary type.
// Per-shard code holds these; ops never mutate their inputs.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nax/kernels/device.h"
#include "nax/core/dtype.h"
#include "nax/core/error.h"
#include "nax/core/shape.h"
#include "nax/core/vary.h"

namespace nax {

namespace autodiff {
struct Node;  // a recorded op: see src/autodiff/
}

class Tensor {
 public:
  Tensor() = default;

  // A fresh, uninitialised tensor on `device` (the current shard's device when null).
  static Tensor empty(const Shape& shape, DType dtype, std::shared_ptr<Device> device = nullptr);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  DType dtype() const;
  const VaryType& vary() const;
  const Device& device() const;
  const std::shared_ptr<Device>& device_ptr() const;
  std::int64_t numel() const { return shape().numel(); }
  std::size_t nbytes() const;
  std::int64_t size(const std::string& axis) const { return shape().size(axis); }
  int rank() const { return shape().rank(); }

  const void* raw() const;
  // Writable only until an op reads it: tensors are immutable once used (autodiff, remat and
  // started collectives read them again later); a write after that is an error naming the reader.
  void* raw_mutable();
  template <typename T>
  const T* data() const {
    check_element_type(dtype_of<T>());
    return static_cast<const T*>(raw());
  }
  template <typename T>
  T* mutable_data() {
    check_element_type(dtype_of<T>());
    return static_cast<T*>(raw_mutable());
  }

  // Values converted to T (any dtype to any arithmetic T).
  template <typename T>
  std::vector<T> to_vector() const;
  double item() const;  // the value of a one-element tensor
  // The same values in host memory (this tensor itself when the host reads its device's memory).
  Tensor on_host() const;
  // (internal) Called after every read of a device's memory by the host, when set: the device has
  // drained its queue there, so results kept on it (the op layer's checks of ids on a device) are
  // cheap to read.
  static void after_host_read(void (*hook)());

  // Same data, another vary type / shape of equal layout (used by ops; no copy).
  Tensor with_vary(VaryType vary) const;
  Tensor with_shape(Shape shape) const;

  std::string str() const;                         // "f32[batch=4|dp, seq=128] varying{}"
  std::string format(int max_values = 64) const;   // str() plus the values

  bool same_storage(const Tensor& other) const;
  // (internal) `shape`'s elements of this dtype from byte `byte_offset` on, in this tensor's storage
  // (shared, not copied; Invariant, no gradient): autodiff hands out a summed bucket's gradients so.
  Tensor piece(std::size_t byte_offset, const Shape& shape) const;
  // Every element is +0 by construction (zeros, full(0), full_like(x, 0)), until written: the
  // same on every device and a term of any sum, so a partial sum may be added to it.
  bool known_zero() const;
  Tensor as_known_zero() const;  // (internal) the creation ops' mark, on this storage
  // (internal) A number unique to this storage, increasing in the order storages are made: remat
  // tells the tensors made inside its function from those it read from outside.
  std::uint64_t storage_id() const;
  static std::uint64_t next_storage_id();  // the id the next storage made will get
  // (internal) Whether this storage is still held by some tensor, for records kept beside tensors
  // (deterministic mode's terms of partial sums) that must not outlive them.
  std::weak_ptr<const void> storage_handle() const;
  // (internal) Marks the storage read by an op (check_operands): raw_mutable refuses after that.
  // `pending` names a started collective that reads or writes it until its wait (empty: none).
  void mark_read() const;
  void set_pending(std::string pending) const;
  // Whether a Tensor other than this one holds its storage (the op recorder, nax/debug/op_recorder.h,
  // tells an op's returned result from the temporaries it made and dropped).
  bool referenced_elsewhere() const;

  // (internal) This value's description (shape, dtype, vary type, device, gradient node) without its
  // storage: what the autodiff graph keeps of an op's input, so that a value no backward reads is
  // freed when its last reader lets go. Reading its data is an error.
  Tensor without_data() const;
  bool has_data() const;  // defined and not such a description

  // Autodiff: whether gradients flow to or through this value (see nax/autodiff/autodiff.h).
  bool requires_grad() const;
  // The op that produced this value on the tape, or the leaf node of a parameter (internal).
  const std::shared_ptr<autodiff::Node>& grad_node() const;
  Tensor with_grad_node(std::shared_ptr<autodiff::Node> node) const;

 private:
  struct Impl;
  explicit Tensor(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  void check_element_type(DType requested) const;
  std::shared_ptr<Impl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace nax
