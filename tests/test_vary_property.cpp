// Property test of every collective: on meshes 1x4, 2x2, 4x1 and 2x2x2, over every
// ordered set of mesh axes, forward and gradient against a host reference built from the mesh's
// group ranks alone. Inputs are per-device values, or blocks of one tensor cut over all mesh
// axes (the gathers must join those in the tensor's order whatever order names the mesh axes).
#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "helpers.h"

using namespace nax;

namespace {

using PerDevice = std::vector<std::vector<double>>;  // [device][flat element]

struct Case {
  std::string name;
  Shape in;
  bool split_input;  // rows of one tensor cut along i over all mesh axes (else per-device values)
  std::function<Tensor(const Tensor&)> device_fn;
  std::function<PerDevice(const PerDevice&)> host_fn;
  bool differentiable = true;
};

constexpr std::int64_t kCols = 3;

std::vector<std::vector<std::string>> ordered_groups(const std::vector<std::string>& axes) {
  std::vector<std::vector<std::string>> out;
  const int n = static_cast<int>(axes.size());
  for (int mask = 1; mask < (1 << n); ++mask) {
    std::vector<int> picked;
    for (int i = 0; i < n; ++i)
      if (mask & (1 << i)) picked.push_back(i);
    do {
      std::vector<std::string> group;
      for (int i : picked) group.push_back(axes[static_cast<std::size_t>(i)]);
      out.push_back(group);
    } while (std::next_permutation(picked.begin(), picked.end()));
  }
  return out;
}

// The group's mesh axes in mesh order (the order in which a tensor cut over all of them is cut).
std::vector<std::string> mesh_order(const Mesh& mesh, const std::vector<std::string>& group) {
  std::vector<std::string> out;
  for (const auto& a : mesh.axis_names())
    if (std::find(group.begin(), group.end(), a) != group.end()) out.push_back(a);
  return out;
}

std::vector<Case> cases(const Mesh& mesh, const std::vector<std::string>& group) {
  const int n = mesh.group_size(group);
  const Names names(group);
  auto members = [&mesh](int d, const std::vector<std::string>& order) { return mesh.group(d, order); };
  // The returned cases outlive this call: capture its locals by value.
  auto reduce = [&mesh, members, group](const PerDevice& v, const std::function<double(double, double)>& op, double scale) {
    PerDevice out(v.size());
    for (int d = 0; d < mesh.size(); ++d) {
      auto m = members(d, group);
      std::vector<double> acc = v[static_cast<std::size_t>(m[0])];
      for (std::size_t k = 1; k < m.size(); ++k)
        for (std::size_t j = 0; j < acc.size(); ++j) acc[j] = op(acc[j], v[static_cast<std::size_t>(m[k])][j]);
      for (auto& a : acc) a *= scale;
      out[static_cast<std::size_t>(d)] = acc;
    }
    return out;
  };
  auto concat_rows = [&mesh, members](const PerDevice& v, const std::vector<std::string>& order) {
    PerDevice out(v.size());
    for (int d = 0; d < mesh.size(); ++d)
      for (int m : members(d, order)) {
        auto& o = out[static_cast<std::size_t>(d)];
        o.insert(o.end(), v[static_cast<std::size_t>(m)].begin(), v[static_cast<std::size_t>(m)].end());
      }
    return out;
  };
  const Shape rows{{"i", 2}, {"j", kCols}}, n_rows{{"i", 2 * n}, {"j", kCols}};
  const auto plus = [](double a, double b) { return a + b; };
  const auto larger = [](double a, double b) { return std::max(a, b); };
  return {
      {"psum", rows, false, [names](const Tensor& x) { return psum(x, names); }, [=](const PerDevice& v) { return reduce(v, plus, 1.0); }},
      {"pmean", rows, false, [names](const Tensor& x) { return pmean(x, names); },
       [=](const PerDevice& v) { return reduce(v, plus, 1.0 / n); }},
      {"pmax", rows, false, [names](const Tensor& x) { return pmax(x, names); }, [=](const PerDevice& v) { return reduce(v, larger, 1.0); },
       false},
      {"all_gather of blocks", rows, true, [names](const Tensor& x) { return all_gather(x, names, "i"); },
       [=, &mesh](const PerDevice& v) { return concat_rows(v, mesh_order(mesh, group)); }},
      {"all_gather_invariant of blocks", rows, true, [names](const Tensor& x) { return all_gather_invariant(x, names, "i"); },
       [=, &mesh](const PerDevice& v) { return concat_rows(v, mesh_order(mesh, group)); }},
      {"all_gather of per-device values", rows, false, [names](const Tensor& x) { return all_gather(x, names, "i"); },
       [=](const PerDevice& v) { return concat_rows(v, group); }},
      {"all_gather_invariant of per-device values", rows, false, [names](const Tensor& x) { return all_gather_invariant(x, names, "i"); },
       [=](const PerDevice& v) { return concat_rows(v, group); }},
      {"all_gather_stacked", rows, false, [names](const Tensor& x) { return all_gather_stacked(x, names, "r"); },
       [=](const PerDevice& v) { return concat_rows(v, group); }},
      {"psum_scatter", n_rows, false, [names](const Tensor& x) { return psum_scatter(x, names, "i"); },
       [=, &mesh](const PerDevice& v) {
         PerDevice sums = reduce(v, plus, 1.0), out(v.size());
         for (int d = 0; d < mesh.size(); ++d) {
           const auto r = static_cast<std::size_t>(mesh.rank_in_group(d, group));
           const auto& s = sums[static_cast<std::size_t>(d)];
           out[static_cast<std::size_t>(d)].assign(s.begin() + static_cast<std::ptrdiff_t>(r * 2 * kCols),
                                                   s.begin() + static_cast<std::ptrdiff_t>((r + 1) * 2 * kCols));
         }
         return out;
       }},
      {"all_to_all", n_rows, false, [names](const Tensor& x) { return all_to_all(x, names, "i", "j"); },
       [=, &mesh](const PerDevice& v) {
         PerDevice out(v.size());
         for (int d = 0; d < mesh.size(); ++d) {
           const auto m = members(d, group);
           const int r = mesh.rank_in_group(d, group);
           auto& o = out[static_cast<std::size_t>(d)];
           o.assign(static_cast<std::size_t>(2 * kCols * n), 0.0);
           for (int a = 0; a < 2; ++a)
             for (int k = 0; k < n; ++k)
               for (int b = 0; b < kCols; ++b)
                 o[static_cast<std::size_t>(a * kCols * n + k * kCols + b)] =
                     v[static_cast<std::size_t>(m[static_cast<std::size_t>(k)])][static_cast<std::size_t>((r * 2 + a) * kCols + b)];
         }
         return out;
       }},
      {"ppermute ring", rows, false,
       [names, n](const Tensor& x) {
         std::vector<std::pair<int, int>> ring;
         for (int k = 0; k < n; ++k) ring.push_back({k, (k + 1) % n});
         return ppermute(x, names, ring);
       },
       [=, &mesh](const PerDevice& v) {
         PerDevice out(v.size());
         for (int d = 0; d < mesh.size(); ++d) {
           const auto m = members(d, group);
           const int r = mesh.rank_in_group(d, group);
           out[static_cast<std::size_t>(d)] = v[static_cast<std::size_t>(m[static_cast<std::size_t>((r + n - 1) % n)])];
         }
         return out;
       }},
  };
}

// Device d's input: its rows of one tensor cut over all mesh axes, or a value of its own.
std::vector<double> input_of(const Mesh& mesh, int d, const Shape& in, bool split) {
  std::vector<double> v(static_cast<std::size_t>(in.numel()));
  const std::int64_t offset = split ? mesh.rank_in_group(d, mesh.axis_names()) * in.numel() : 0;
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = split ? 1.0 + static_cast<double>(offset) + static_cast<double>(k) : 1.0 + 100.0 * d + static_cast<double>(k);
  return v;
}

std::vector<double> coefficients(int d, std::size_t size) {
  std::vector<double> c(size);
  for (std::size_t j = 0; j < size; ++j) c[j] = 0.5 + 0.25 * static_cast<double>((d * 7 + static_cast<int>(j)) % 5);
  return c;
}

void check_case(Runtime& rt, const Case& c) {
  const Mesh& mesh = rt.mesh();
  PerDevice inputs;
  for (int d = 0; d < mesh.size(); ++d) inputs.push_back(input_of(mesh, d, c.in, c.split_input));
  const PerDevice want = c.host_fn(inputs);
  std::vector<double> global;
  for (int r = 0; r < mesh.size(); ++r)
    for (int d = 0; d < mesh.size(); ++d)
      if (mesh.rank_in_group(d, mesh.axis_names()) == r) global.insert(global.end(), inputs[static_cast<std::size_t>(d)].begin(), inputs[static_cast<std::size_t>(d)].end());
  const Shape global_shape{{"i", c.in.size("i") * mesh.size()}, {"j", kCols}};

  auto results = rt.run([&](Shard& s) {
    const auto d = static_cast<std::size_t>(s.device());
    Tensor x = c.split_input ? s.shard(from_vector(global_shape, global), {{"i", mesh.axis_names()}})
                             : pvary(from_vector(c.in, inputs[d], DType::f64), mesh.axis_names());
    if (c.differentiable) x = parameter(x);
    Tensor y = c.device_fn(x);
    std::vector<std::vector<double>> out{y.to_vector<double>()};
    if (c.differentiable) {
      const auto coef = coefficients(s.device(), static_cast<std::size_t>(y.numel()));
      Tensor loss = sum(y * pvary(from_vector(y.shape(), coef, DType::f64), mesh.axis_names()), y.shape().names());
      out.push_back(grad(loss, {x}, {.allow_varying_loss = true})[0].to_vector<double>());
    }
    return out;
  });
  for (int d = 0; d < mesh.size(); ++d) {
    INFO("device " << d);
    REQUIRE(nax::testing::max_rel_error(results[static_cast<std::size_t>(d)][0], want[static_cast<std::size_t>(d)]) <= 1e-12);
  }
  if (!c.differentiable) return;
  // The gradient of the sum over devices of <coef_e, y_e>: linear, so each input element's unit vector.
  for (int d = 0; d < mesh.size(); ++d) {
    std::vector<double> g(inputs[static_cast<std::size_t>(d)].size());
    for (std::size_t k = 0; k < g.size(); ++k) {
      PerDevice unit(inputs.size());
      for (std::size_t e = 0; e < inputs.size(); ++e) unit[e].assign(inputs[e].size(), 0.0);
      unit[static_cast<std::size_t>(d)][k] = 1.0;
      const PerDevice y = c.host_fn(unit);
      for (int e = 0; e < mesh.size(); ++e) {
        const auto coef = coefficients(e, y[static_cast<std::size_t>(e)].size());
        for (std::size_t j = 0; j < coef.size(); ++j) g[k] += coef[j] * y[static_cast<std::size_t>(e)][j];
      }
    }
    INFO("gradient on device " << d);
    REQUIRE(nax::testing::max_rel_error(results[static_cast<std::size_t>(d)][1], g) <= 1e-12);
  }
}

}  // namespace

TEST_CASE("every collective over every order of mesh axes, forward and gradient, against a host reference", "[mistakes][property]") {
  for (const char* spec : {"a=1,b=4", "a=2,b=2", "a=4,b=1", "a=2,b=2,c=2"}) {
    Runtime rt = Runtime::local(Mesh::parse(spec));
    for (const auto& group : ordered_groups(rt.mesh().axis_names())) {
      for (const auto& c : cases(rt.mesh(), group)) {
        INFO("mesh " << spec << ", " << c.name << " over " << Names(group).str());
        check_case(rt, c);
      }
      auto ranks = rt.run([&](Shard&) { return static_cast<int>(axis_index(group).item()); });
      for (int d = 0; d < rt.size(); ++d) REQUIRE(ranks[static_cast<std::size_t>(d)] == rt.mesh().rank_in_group(d, group));
    }
  }
}
