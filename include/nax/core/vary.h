#pragma once
// The vary type of a per-shard value: for every mesh axis, whether the value is the same on every
// device along it (Invariant), is one block of a tensor axis cut along it (Split), is one term of a
// sum over the devices along it (Partial: a partial sum, or a local mean), or differs for another
// reason (Varying: per-device data, axis_index, pvary). docs/architecture.md "Vary types".
#include <string>
#include <vector>

namespace nax {

enum class Vary { Invariant, Split, Partial, Varying };

// What a Partial value is a term of: a sum (psum or psum_scatter finishes it) or a mean of equal
// blocks (a mean over a tensor axis cut along the mesh axis: pmean finishes it, and psum would give
// n times the mean).
enum class PartialKind { sum, mean };

// What an op does with a partial value in one of its operands, declared by each op where it
// enters: the vary rules and deterministic mode both read it (docs/ops.md "Partial sums").
enum class OnPartial {
  refuse,      // nonlinear in it (exp, a divisor, a condition, indices): psum (or pmean) first
  scale,       // linear in it, the other operands fixed (mul, dot, sum, rotary): at most one partial factor
  add,         // its elements are added to the other operands' (add, sub): all alike partial, or none
  accumulate,  // as add, several of its elements into one (scatter_add)
  move,        // its elements are moved, negated or selected (layout ops, neg, concat, where's branches)
};

class VaryType {
 public:
  struct Entry {
    std::string mesh_axis;
    Vary kind = Vary::Varying;
    std::string tensor_axis;                // for Split
    PartialKind partial = PartialKind::sum;  // for Partial
    bool operator==(const Entry& o) const {
      return mesh_axis == o.mesh_axis && kind == o.kind && tensor_axis == o.tensor_axis &&
             (kind != Vary::Partial || partial == o.partial);
    }
  };

  Vary kind(const std::string& mesh_axis) const;
  // The tensor axis cut along `mesh_axis` (empty unless Split).
  const std::string& split_axis(const std::string& mesh_axis) const;
  // What the value is a term of over `mesh_axis` (sum unless Partial).
  PartialKind partial(const std::string& mesh_axis) const;
  bool partial_sum(const std::string& mesh_axis) const { return kind(mesh_axis) == Vary::Partial && partial(mesh_axis) == PartialKind::sum; }
  bool local_mean(const std::string& mesh_axis) const { return kind(mesh_axis) == Vary::Partial && partial(mesh_axis) == PartialKind::mean; }
  // Mesh axes cutting `tensor_axis`, major first.
  std::vector<std::string> split_mesh_axes(const std::string& tensor_axis) const;
  std::vector<std::string> varying_mesh_axes() const;  // Varying only
  std::vector<std::string> partial_mesh_axes() const;  // Partial (sums and means)
  // Varying or Partial: the mesh axes over which a psum or pmean could reduce the value.
  std::vector<std::string> unreduced_mesh_axes() const;
  bool invariant() const { return entries_.empty(); }
  bool any_partial() const;
  bool any_unreduced() const;  // some mesh axis Varying or Partial
  const std::vector<Entry>& entries() const { return entries_; }

  void set_invariant(const std::string& mesh_axis);
  void set_varying(const std::string& mesh_axis);
  void set_partial(const std::string& mesh_axis, PartialKind kind = PartialKind::sum);
  // Appends `mesh_axis` as the most minor mesh axis cutting `tensor_axis`.
  void set_split(const std::string& mesh_axis, const std::string& tensor_axis);
  void rename_tensor_axis(const std::string& from, const std::string& to);

  // "varying{dp}", "partial{mp}", "varying{dp} partial-mean{mp}" (the split axes are printed after
  // the sizes in Tensor::str); "varying{}" when every mesh axis is Invariant or Split.
  std::string str() const;
  bool operator==(const VaryType&) const = default;

 private:
  void set(Entry entry);
  std::vector<Entry> entries_;  // Invariant axes are absent
};

}  // namespace nax
