// The mesh-comparison locator (nax/debug/locator.h): each op's values, one block per device, are
// rebuilt as global tensors the way the mesh holds them: a Split axis from the devices' blocks, an
// Invariant value from the first device (checked against the others), a partial sum added over its
// mesh axes in the pairwise halving order deterministic psum uses, per-device values kept apart.
#include "nax/debug/locator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "nax/core/error.h"

namespace nax::debug {

namespace {

bool same_bits(double x, double y) {
  return (std::isnan(x) && std::isnan(y)) || (x == y && std::signbit(x) == std::signbit(y));
}

// x + y (or x / n) rounded as `dtype` computes it: psum of f32 adds in f32, of bf16 in f32 then rounds.
double round_to(DType dtype, double x) {
  switch (dtype) {
    case DType::f32: return static_cast<float>(x);
    case DType::bf16: return static_cast<float>(bf16(static_cast<float>(x)));
    default: return x;
  }
}
double add_as(DType dtype, double x, double y) {
  return dtype == DType::f64 || dtype == DType::i32 ? x + y : round_to(dtype, static_cast<double>(static_cast<float>(x) + static_cast<float>(y)));
}

// Pairwise halving: ((v0 + v1) + (v2 + v3)), the tree deterministic psum reduces in.
std::vector<double> tree_sum(DType dtype, const std::vector<const std::vector<double>*>& parts, std::size_t lo, std::size_t hi) {
  if (hi - lo == 1) return *parts[lo];
  const std::size_t mid = lo + (hi - lo) / 2;
  std::vector<double> left = tree_sum(dtype, parts, lo, mid);
  const std::vector<double> right = tree_sum(dtype, parts, mid, hi);
  for (std::size_t i = 0; i < left.size(); ++i) left[i] = add_as(dtype, left[i], right[i]);
  return left;
}

std::vector<std::int64_t> strides_of(const Shape& s) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(s.rank()), 1);
  for (int k = s.rank() - 2; k >= 0; --k) out[static_cast<std::size_t>(k)] = out[static_cast<std::size_t>(k) + 1] * s[k + 1].size;
  return out;
}

std::string coordinates(const Shape& s, std::int64_t flat) {
  std::vector<std::string> parts;
  const auto strides = strides_of(s);
  for (int k = 0; k < s.rank(); ++k) {
    parts.push_back(fmt::format("{}={}", s[k].name, flat / strides[static_cast<std::size_t>(k)]));
    flat %= strides[static_cast<std::size_t>(k)];
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

// One value of one op as the mesh holds it, rebuilt.
struct Global {
  Shape shape;
  VaryType vary;  // the devices' blocks' vary type
  DType dtype = DType::f32;
  std::vector<std::string> per_device_axes;  // Varying per device: one global tensor per coordinate
  std::map<std::vector<int>, std::vector<double>> by_coords;
};

struct Assembly {
  std::optional<Global> global;
  std::optional<Finding> disagreement;  // devices that should agree (Invariant) do not
  std::string skipped;                  // why it could not be rebuilt
};

// The first element where x and y differ, their count and the largest difference.
struct Diff {
  std::int64_t count = 0, first = -1;
  double max_abs = 0;
};
Diff diff(const std::vector<double>& x, const std::vector<double>& y) {
  Diff d;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (same_bits(x[i], y[i])) continue;
    if (d.first < 0) d.first = static_cast<std::int64_t>(i);
    ++d.count;
    const double a = std::abs(x[i] - y[i]);
    d.max_abs = std::isnan(a) ? a : std::max(d.max_abs, a);
  }
  return d;
}

// f when every element of y is exactly f times x's (f a power of two other than 1), else 0.
double power_of_two_scale(const std::vector<double>& x, const std::vector<double>& y) {
  double f = 0;
  for (std::size_t i = 0; i < x.size() && f == 0; ++i)
    if (x[i] != 0 && std::isfinite(x[i]) && std::isfinite(y[i])) f = y[i] / x[i];
  int exponent = 0;
  if (f == 0 || f == 1 || !std::isfinite(f) || std::abs(std::frexp(f, &exponent)) != 0.5) return 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!same_bits(x[i] * f, y[i])) return 0;
  return f;
}

Assembly assemble(const Mesh& mesh, const std::string& mesh_name, const std::vector<const OpValue*>& held) {
  Assembly out;
  const OpValue& v0 = *held[0];
  for (const OpValue* v : held)
    if (v->shape != v0.shape || v->dtype != v0.dtype || !(v->vary == v0.vary)) {
      out.skipped = fmt::format("its devices hold different blocks ({}{} and {}{})", v0.shape.str(), v0.vary.str(), v->shape.str(), v->vary.str());
      return out;
    }
  Global g;
  g.dtype = v0.dtype;
  g.vary = v0.vary;
  std::vector<Axis> axes = v0.shape.axes();
  for (auto& a : axes)
    for (const auto& m : v0.vary.split_mesh_axes(a.name)) a.size *= mesh.axis_size(m);
  g.shape = Shape(axes);
  std::vector<std::string> summed, invariant;
  double mean_divisor = 1;
  for (const auto& m : mesh.axis_names()) {
    const Vary kind = v0.vary.kind(m);
    if (kind == Vary::Invariant) invariant.push_back(m);
    if (kind == Vary::Varying) g.per_device_axes.push_back(m);
    if (kind != Vary::Partial) continue;
    summed.push_back(m);
    if (v0.vary.local_mean(m)) mean_divisor *= mesh.axis_size(m);
  }
  // A local mean recorded with its sum and count (deterministic mode) is rebuilt as pmean finishes
  // it: the sums added over the ranks, divided by the global count; else the means averaged.
  bool from_sums = mean_divisor != 1;
  for (const OpValue* v : held) from_sums = from_sums && v->mean_count > 0 && v->mean_sum.size() == v->values.size();
  // Blocks by (per-device coordinates, block offsets), each a list of (rank in the sum, value).
  std::map<std::vector<int>, std::map<std::vector<std::int64_t>, std::vector<std::pair<int, const OpValue*>>>> blocks;
  for (int d = 0; d < mesh.size(); ++d) {
    std::vector<int> coords = mesh.coords(d), first = coords;
    for (const auto& m : invariant) first[static_cast<std::size_t>(mesh.axis_position(m))] = 0;
    if (first != coords) {  // an Invariant copy: it must equal the first device's
      const int d0 = mesh.device_at(first);
      const Diff x = diff(held[static_cast<std::size_t>(d0)]->values, held[static_cast<std::size_t>(d)]->values);
      if (x.count == 0) continue;
      Finding f;
      f.found = true, f.kind = "invariant", f.mesh = mesh_name, f.shape = fmt::format("{}{}", dtype_name(v0.dtype), v0.shape.str()), f.differing = x.count, f.first = x.first,
      f.first_at = coordinates(v0.shape, x.first), f.a = held[static_cast<std::size_t>(d0)]->values[static_cast<std::size_t>(x.first)],
      f.b = held[static_cast<std::size_t>(d)]->values[static_cast<std::size_t>(x.first)], f.max_abs = x.max_abs;
      f.detail = fmt::format("devices {} and {} of mesh {} hold different values of a value typed Invariant over ({})", d0, d, mesh_name,
                             fmt::join(invariant, ", "));
      out.disagreement = f;
      return out;
    }
    std::vector<int> per_device;
    for (const auto& m : g.per_device_axes) per_device.push_back(mesh.coord(d, m));
    int rank = 0;
    for (const auto& m : summed) rank = rank * mesh.axis_size(m) + mesh.coord(d, m);
    std::vector<std::int64_t> offsets;
    for (const auto& a : v0.shape.axes()) {
      std::int64_t block = 0;
      for (const auto& m : v0.vary.split_mesh_axes(a.name)) block = block * mesh.axis_size(m) + mesh.coord(d, m);
      offsets.push_back(block * a.size);
    }
    blocks[per_device][offsets].emplace_back(rank, held[static_cast<std::size_t>(d)]);
  }
  const auto local_strides = strides_of(v0.shape), global_strides = strides_of(g.shape);
  for (auto& [coords, by_offset] : blocks) {
    std::vector<double>& whole = g.by_coords[coords];
    whole.assign(static_cast<std::size_t>(g.shape.numel()), 0.0);
    for (auto& [offsets, parts] : by_offset) {
      std::sort(parts.begin(), parts.end());
      std::vector<const std::vector<double>*> ordered;
      double count = 0;
      for (const auto& p : parts) ordered.push_back(from_sums ? &p.second->mean_sum : &p.second->values), count += static_cast<double>(p.second->mean_count);
      std::vector<double> block = tree_sum(g.dtype, ordered, 0, ordered.size());
      const double divisor = from_sums ? count : mean_divisor;
      for (std::size_t i = 0; i < block.size(); ++i) {
        std::int64_t rest = static_cast<std::int64_t>(i), at = 0;
        for (std::size_t k = 0; k < local_strides.size(); ++k) {
          at += (offsets[k] + rest / local_strides[k]) * global_strides[k];
          rest %= local_strides[k];
        }
        whole[static_cast<std::size_t>(at)] = divisor == 1 ? block[i] : round_to(g.dtype, block[i] / divisor);
      }
    }
  }
  out.global = std::move(g);
  return out;
}

// A value kept as terms (deterministic mode's sum of partial sums) as psum finishes it: each leaf
// rebuilt (its ranks added in the tree), then the adds that made it redone in their order.
Assembly assemble_value(const Mesh& mesh, const std::string& mesh_name, const std::vector<const OpValue*>& held) {
  const std::size_t n = held[0]->terms.size();
  for (const OpValue* v : held)
    if (v->terms.size() != n) {
      Assembly out;
      out.skipped = "its devices kept different numbers of partial-sum terms";
      return out;
    }
  if (n == 0) return assemble(mesh, mesh_name, held);
  Assembly total;
  for (std::size_t t = 0; t < n; ++t) {
    std::vector<const OpValue*> term;
    for (const OpValue* v : held) term.push_back(&v->terms[t]);
    Assembly part = assemble_value(mesh, mesh_name, term);
    if (!part.global) return part;
    if (!total.global) {
      total = std::move(part);
      continue;
    }
    Global& sum = *total.global;
    const Global& add = *part.global;
    if (!(add.shape == sum.shape) || add.per_device_axes != sum.per_device_axes || add.by_coords.size() != sum.by_coords.size()) {
      Assembly out;
      out.skipped = "its partial-sum terms are held differently";
      return out;
    }
    for (auto& [coords, values] : sum.by_coords) {
      const std::vector<double>& more = add.by_coords.at(coords);
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = add_as(sum.dtype, values[i], more[i]);
    }
  }
  return total;
}

std::string per_device_name(const std::vector<std::string>& axes, const std::vector<int>& coords) {
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < axes.size(); ++i) parts.push_back(fmt::format("{}={}", axes[i], coords[i]));
  return fmt::format("{}", fmt::join(parts, ","));
}

// The sequence of op names every device of the mesh ran, or a "program" finding where they differ.
std::optional<Finding> check_same_program(const MeshRecords& r, const std::string& name) {
  const auto& first = r.devices.at(0);
  for (std::size_t d = 1; d < r.devices.size(); ++d) {
    const auto& other = r.devices[d];
    for (std::size_t i = 0; i <= std::min(first.size(), other.size()); ++i) {
      const bool ended = i == first.size() || i == other.size();
      if (ended && first.size() == other.size()) break;
      if (!ended && first[i].op == other[i].op) continue;
      Finding f;
      f.found = true, f.kind = "program", f.mesh = name, f.index = i;
      f.op = i < first.size() ? first[i].op : other[i].op;
      f.detail = fmt::format("on mesh {}, device 0 ran {} and device {} ran {} as op {}", name, i < first.size() ? first[i].op : "nothing",
                             d, i < other.size() ? other[i].op : "nothing", i);
      return f;
    }
  }
  return std::nullopt;
}

}  // namespace

MeshRecords record_ops(Runtime& runtime, const std::function<void(Shard&)>& program) {
  if (static_cast<int>(runtime.local_devices().size()) != runtime.size())
    fail("record_ops", "needs every device of mesh {} in this process (Runtime::local); this process runs {} of {}", runtime.mesh().str(),
         runtime.local_devices().size(), runtime.size());
  MeshRecords out{runtime.mesh(), std::vector<std::vector<OpRecord>>(static_cast<std::size_t>(runtime.size()))};
  runtime.run([&](Shard& s) {
    OpRecorder recorder;
    program(s);
    out.devices[static_cast<std::size_t>(s.device())] = recorder.take();
  });
  return out;
}

Comparison compare_records(const MeshRecords& a, const MeshRecords& b) {
  Comparison c;
  const std::string a_name = a.mesh.str(), b_name = b.mesh.str();
  for (const auto* r : {&a, &b})
    if (auto f = check_same_program(*r, r->mesh.str())) {
      c.first = *f;
      return c;
    }
  const auto& ops_a = a.devices.at(0);
  const auto& ops_b = b.devices.at(0);
  auto note = [&c](std::string text) {
    if (c.notes.size() < 20) c.notes.push_back(std::move(text));
    else ++c.notes_left_out;
  };
  // The meshes ran different programs from op i (op j on mesh b), x being where they part.
  auto program_difference = [&c](std::size_t i, std::size_t j, const OpRecord& x, std::string detail) {
    c.first.found = true, c.first.kind = "program", c.first.index = i, c.first.other_index = j, c.first.op = x.op;
    c.first.context = x.context, c.first.detail = std::move(detail);
    return c;
  };
  auto label = [](std::size_t index, const OpRecord& r) {
    return fmt::format("op {} ({}{})", index, r.op, r.context.empty() ? "" : " in " + r.context);
  };
  std::size_t i = 0, j = 0;
  for (; i < ops_a.size() && j < ops_b.size(); ++i, ++j) {
    const OpRecord& x = ops_a[i];
    const OpRecord& y = ops_b[j];
    if (x.op != y.op) {  // a collective one mesh needs and the other does not: pass over it
      if (x.collective) { --j; continue; }
      if (y.collective) { --i; continue; }
      return program_difference(i, j, x,
                                fmt::format("mesh {} ran {} as op {} where mesh {} ran {} as op {}", a_name, x.op, i, b_name, y.op, j));
    }
    if (!x.unread.empty() || !y.unread.empty()) {
      note(fmt::format("{}: not read: {}", label(i, x), !x.unread.empty() ? x.unread : y.unread));
      continue;
    }
    if (x.values.empty() || y.values.empty()) continue;  // an alias of its input on one mesh: nothing new to compare
    std::vector<const OpValue*> held_a, held_b;
    for (const auto& dev : a.devices) held_a.push_back(dev[i].values.empty() ? nullptr : &dev[i].values[0]);
    for (const auto& dev : b.devices) held_b.push_back(dev[j].values.empty() ? nullptr : &dev[j].values[0]);
    if (std::count(held_a.begin(), held_a.end(), nullptr) + std::count(held_b.begin(), held_b.end(), nullptr) > 0) {
      note(fmt::format("{}: some devices made no new value: not compared", label(i, x)));
      continue;
    }
    Assembly ga = assemble_value(a.mesh, a_name, held_a), gb = assemble_value(b.mesh, b_name, held_b);
    for (auto* g : {&ga, &gb})
      if (g->disagreement) {
        c.first = *g->disagreement;
        c.first.index = i, c.first.other_index = j, c.first.op = x.op, c.first.context = x.context;
        return c;
      }
    if (!ga.global || !gb.global) {
      note(fmt::format("{}: {}", label(i, x), !ga.global ? ga.skipped : gb.skipped));
      continue;
    }
    const Global& u = *ga.global;
    const Global& v = *gb.global;
    if (u.per_device_axes != v.per_device_axes || u.by_coords.size() != v.by_coords.size()) {
      note(fmt::format("{}: per-device values over ({}) on mesh {} and ({}) on mesh {}: not compared", label(i, x),
                       fmt::join(u.per_device_axes, ","), a_name, fmt::join(v.per_device_axes, ","), b_name));
      continue;
    }
    Finding f;
    f.index = i, f.other_index = j, f.op = x.op, f.context = x.context, f.shape = fmt::format("{}{}", dtype_name(u.dtype), u.shape.str());
    if (u.shape != v.shape && (u.vary.any_unreduced() || v.vary.any_unreduced())) {
      // A Varying value whose blocks differ in shape holds blocks its vary type does not describe
      // (a gradient typed as a partial sum while it holds each device's heads): no way to rebuild it.
      note(fmt::format("{}: {}{} {} on mesh {}, {}{} {} on mesh {}: Varying blocks of different shapes, not compared", label(i, x),
                       dtype_name(u.dtype), held_a[0]->shape.str(), u.vary.str(), a_name, dtype_name(v.dtype), held_b[0]->shape.str(),
                       v.vary.str(), b_name));
      continue;
    }
    if (u.shape != v.shape || u.dtype != v.dtype) {
      f.found = true, f.kind = "shape";
      f.detail = fmt::format("{}{} (blocks {} {}) on mesh {}, {}{} (blocks {} {}) on mesh {}", dtype_name(u.dtype), u.shape.str(),
                             held_a[0]->shape.str(), u.vary.str(), a_name, dtype_name(v.dtype), v.shape.str(), held_b[0]->shape.str(),
                             v.vary.str(), b_name);
      c.first = f;
      return c;
    }
    ++c.ops_compared;
    for (const auto& [coords, values] : u.by_coords) {
      const std::vector<double>& other = v.by_coords.at(coords);
      const Diff d = diff(values, other);
      ++c.values_compared;
      if (d.count == 0) continue;
      if (const double scale = power_of_two_scale(values, other); scale != 0) {
        note(fmt::format("{}: mesh {}'s value is exactly {} times mesh {}'s, a scale that depends on the mesh (the gradient "
                         "of a local mean is 1/n of it): passed over", label(i, x), b_name, scale, a_name));
        continue;
      }
      f.found = true, f.kind = "value", f.devices = per_device_name(u.per_device_axes, coords), f.differing = d.count, f.first = d.first,
      f.first_at = coordinates(u.shape, d.first), f.a = values[static_cast<std::size_t>(d.first)], f.b = other[static_cast<std::size_t>(d.first)],
      f.max_abs = d.max_abs;
      c.first = f;
      return c;
    }
  }
  for (; i < ops_a.size() || j < ops_b.size();) {  // what is left must be collectives only one mesh needed
    const bool in_a = i < ops_a.size();
    const OpRecord& x = in_a ? ops_a[i] : ops_b[j];
    if (!x.collective)
      return program_difference(i, j, x, fmt::format("mesh {} ran {} more ops from op {} ({}) on", in_a ? a_name : b_name,
                                                     in_a ? ops_a.size() - i : ops_b.size() - j, in_a ? i : j, x.op));
    in_a ? ++i : ++j;
  }
  return c;
}

std::string describe(const Comparison& c, const std::string& a_name, const std::string& b_name) {
  std::string out;
  for (const auto& n : c.notes) out += fmt::format("note: {}\n", n);
  if (c.notes_left_out > 0) out += fmt::format("note: and {} more\n", c.notes_left_out);
  const Finding& f = c.first;
  if (!f.found)
    return out + fmt::format("no difference in {} ops ({} values compared) between mesh {} and mesh {}\n", c.ops_compared, c.values_compared,
                             a_name, b_name);
  const std::string where = fmt::format("op {} ({} on mesh {}){}{}", f.index, f.other_index, b_name, f.context.empty() ? "" : " in ",
                                        f.context);
  if (f.kind == "program" || f.kind == "shape")
    return out + fmt::format("first difference: {} {}: the meshes {}: {}\n", where, f.op, f.kind == "program" ? "ran different programs" : "made different shapes", f.detail);
  out += fmt::format("first difference: {} {}{}: {}{}\n", where, f.op, f.kind == "invariant" ? " (devices of one mesh disagree)" : "", f.shape,
                     f.devices.empty() ? "" : fmt::format(" (per device, devices {})", f.devices));
  if (!f.detail.empty()) out += fmt::format("  {}\n", f.detail);
  out += fmt::format("  {} elements differ; the first at [{}] (element {}): {:.9g} on {} vs {:.9g} on {}; max |difference| {:.3g}\n",
                     f.differing, f.first_at, f.first, f.a, f.kind == "invariant" ? "the first device" : "mesh " + a_name, f.b,
                     f.kind == "invariant" ? "the other" : "mesh " + b_name, f.max_abs);
  return out;
}

}  // namespace nax::debug
