// A tour of nax's named collectives on a dp=2,mp=2 mesh of simulated devices: for each
// collective, every device's input block and output block, with their vary types.
//
//   build/bin/collectives_tour [--mesh dp=2,mp=2]
#include <nax/nax.h>

#include <fmt/format.h>

#include <cstring>
#include <iostream>

using namespace nax;

namespace {

std::string coords(Shard& s) {
  std::vector<std::string> parts;
  for (const auto& a : s.mesh().axes()) parts.push_back(fmt::format("{}={}", a.name, s.coord(a.name)));
  return fmt::format("{}", fmt::join(parts, ","));
}

// Runs `step` on every device and prints what each one holds before and after.
template <typename Step>
void show(Runtime& rt, const std::string& title, const std::string& code, Step step) {
  fmt::print("\n== {}\n   {}\n", title, code);
  auto lines = rt.run([&](Shard& s) {
    auto [in, out] = step(s);
    return fmt::format("  device {} ({}):\n    in : {}\n    out: {}", s.device(), coords(s), in.format(16), out.format(16));
  });
  for (const auto& l : lines) fmt::print("{}\n", l);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string mesh_spec = "dp=2,mp=2";
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        fmt::print("usage: collectives_tour [--mesh dp=2,mp=2]\n"
                   "Prints each named collective's input and output blocks on every device.\n"
                   "The mesh needs axes named dp and mp.\n");
        return 0;
      }
      if (arg == "--mesh" && i + 1 < argc) mesh_spec = argv[++i];
      else throw Error(fmt::format("collectives_tour: unknown argument '{}' (try --help)", arg));
    }
    Mesh mesh = Mesh::parse(mesh_spec);
    mesh.check_axes({"dp", "mp"}, "collectives_tour");
    Runtime rt = Runtime::local(mesh);
    fmt::print("nax collectives tour on mesh {} ({} devices, one thread each)\n", mesh.str(), mesh.size());

    const int n_mp = mesh.axis_size("mp");
    // A per-device value: x[i] = 10 * device + i.
    auto per_device = [](Shard& s, std::int64_t n) {
      return pvary(arange({"i", n}) + 10.0 * s.device(), {"dp", "mp"});
    };

    show(rt, "psum: all-reduce sum over mp (Varying -> Invariant)", "psum(x, \"mp\")", [&](Shard& s) {
      Tensor x = per_device(s, 4);
      return std::pair{x, psum(x, "mp")};
    });
    show(rt, "pmax over dp and mp at once", "pmax(x, {\"dp\", \"mp\"})", [&](Shard& s) {
      Tensor x = per_device(s, 4);
      return std::pair{x, pmax(x, {"dp", "mp"})};
    });
    show(rt, "all_gather: concatenate the mp blocks of axis i", "all_gather(x, \"mp\", \"i\")", [&](Shard& s) {
      Tensor x = per_device(s, 2);
      return std::pair{x, all_gather(x, "mp", "i")};
    });
    show(rt, "all_gather_invariant of a Split block: the whole tensor, Invariant", "all_gather_invariant(w, \"mp\", \"i\")",
         [&](Shard& s) {
           Tensor w = s.shard(arange({"i", 2 * n_mp}), {{"i", "mp"}});
           return std::pair{w, all_gather_invariant(w, "mp", "i")};
         });
    show(rt, "psum_scatter: sum over mp, keep this device's block of i", "psum_scatter(x, \"mp\", \"i\")", [&](Shard& s) {
      Tensor x = per_device(s, 2 * n_mp);
      return std::pair{x, psum_scatter(x, "mp", "i")};
    });
    show(rt, "ppermute: a ring over mp (rank r sends to r+1)", "ppermute(x, \"mp\", ring)", [&](Shard& s) {
      std::vector<std::pair<int, int>> ring;
      for (int r = 0; r < n_mp; ++r) ring.push_back({r, (r + 1) % n_mp});
      Tensor x = per_device(s, 2);
      return std::pair{x, ppermute(x, "mp", ring)};
    });
    show(rt, "all_to_all: Split(j) -> Split(i) over mp", "all_to_all(x, \"mp\", \"i\", \"j\")", [&](Shard& s) {
      Tensor x = s.shard(rename(arange({"k", 2 * n_mp * 2 * n_mp}), "k", "i"), {});
      x = split_axis(x, "i", {{"i", 2 * n_mp}, {"j", 2 * n_mp}});
      x = s.shard(s.gather(x), {{"j", "mp"}});
      return std::pair{x, all_to_all(x, "mp", "i", "j")};
    });
    show(rt, "axis_index: this device's coordinate (Varying)", "axis_index(\"mp\")", [&](Shard&) {
      Tensor i = axis_index("mp");
      return std::pair{i, cast(i, DType::f32) * 100.0};
    });
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
