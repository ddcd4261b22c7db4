#pragma once
// The vary type of a per-shard value: for every mesh axis, whether the value is the same on every
// device along it (Invariant), is one block of a tensor axis cut along it (Split), or differs for
// another reason (Varying: a partial sum, a local mean, per-device data, axis_index). DESIGN.md §2-§3.
#include <string>
#include <vector>

namespace nax {

enum class Vary { Invariant, Split, Varying };

// Why a value is Varying over a mesh axis, where the op that made it knows: a pending sum (a dot or
// sum over a tensor axis cut along it: psum finishes it), a local mean (mean over such an axis:
// pmean finishes it), or anything else (per-device data; also any mix of reasons). It lets the
// collectives refuse gathering partial sums and psum-ing local means. Not part of equality.
enum class VaryReason { per_device, partial_sum, local_mean };

class VaryType {
 public:
  struct Entry {
    std::string mesh_axis;
    Vary kind = Vary::Varying;
    std::string tensor_axis;  // for Split
    VaryReason reason = VaryReason::per_device;  // for Varying
    bool operator==(const Entry& o) const { return mesh_axis == o.mesh_axis && kind == o.kind && tensor_axis == o.tensor_axis; }
  };

  Vary kind(const std::string& mesh_axis) const;
  // The tensor axis cut along `mesh_axis` (empty unless Split).
  const std::string& split_axis(const std::string& mesh_axis) const;
  // Mesh axes cutting `tensor_axis`, major first.
  std::vector<std::string> split_mesh_axes(const std::string& tensor_axis) const;
  std::vector<std::string> varying_mesh_axes() const;
  bool invariant() const { return entries_.empty(); }
  bool any_varying() const;
  const std::vector<Entry>& entries() const { return entries_; }

  void set_invariant(const std::string& mesh_axis);
  void set_varying(const std::string& mesh_axis, VaryReason reason = VaryReason::per_device);
  // per_device unless Varying over `mesh_axis`.
  VaryReason reason(const std::string& mesh_axis) const;
  // Appends `mesh_axis` as the most minor mesh axis cutting `tensor_axis`.
  void set_split(const std::string& mesh_axis, const std::string& tensor_axis);
  void rename_tensor_axis(const std::string& from, const std::string& to);

  std::string str() const;  // "varying{dp}", with the split axes after the sizes in Tensor::str
  bool operator==(const VaryType&) const = default;

 private:
  std::vector<Entry> entries_;  // Invariant axes are absent
};

}  // namespace nax
