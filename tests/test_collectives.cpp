// Every named collective against a serial reference computed on the host, on meshes of 1, 2, 3,
// 4 and 8 devices, 1-D and 2-D, over one mesh axis or several, along leading and inner axes.
#include <fmt/format.h>

#include "comparison.h"
#include "helpers.h"

using namespace nax;
using nax::testing::groups_of;
using nax::testing::require_equal;

namespace {

const Shape kLocal{{"a", 2}, {"b", 3}, {"c", 2}};

// Device d's input: a value of its own (f64 so that sums compare exactly up to rounding order).
Tensor input_of(int device, const Shape& shape = kLocal) {
  return random_normal(shape, 17, fmt::format("x{}", device), 1.0, DType::f64);
}

// The device's input as per-shard code sees it: Varying over every mesh axis.
Tensor varying_input(Shard& s, const Shape& shape = kLocal) {
  return pvary(s.shard(input_of(s.device(), shape), {}), s.mesh().axis_names());
}

// Host-side inputs of the members of `device`'s group, in group rank order.
std::vector<Tensor> member_inputs(const Mesh& mesh, int device, const std::vector<std::string>& axes, const Shape& shape = kLocal) {
  std::vector<Tensor> out;
  for (int m : mesh.group(device, axes)) out.push_back(input_of(m, shape));
  return out;
}

Tensor fold(const std::vector<Tensor>& xs, Tensor (*op)(const Tensor&, const Tensor&)) {
  Tensor acc = xs[0];
  for (std::size_t i = 1; i < xs.size(); ++i) acc = op(acc, xs[i]);
  return acc;
}

// Runs `collective` on every device and compares each result with `reference(device)`.
template <typename Collective, typename Reference>
void check_collective(Runtime& rt, Collective collective, Reference reference, double tol = 1e-12) {
  auto results = rt.run([&](Shard& s) { return collective(s).template to_vector<double>(); });
  for (int d = 0; d < rt.size(); ++d) {
    INFO("device " << d);
    Tensor want = reference(d);
    REQUIRE(nax::testing::max_rel_error(results[static_cast<std::size_t>(d)], want.to_vector<double>()) <= tol);
  }
}

}  // namespace

TEST_CASE("reductions: psum, pmean, pmax, pmin", "[mesh][collectives]") {
  for (const auto& spec : nax::testing::test_meshes()) {
    Mesh mesh = Mesh::parse(spec);
    Runtime rt = Runtime::local(mesh);
    for (const auto& axes : groups_of(mesh)) {
      INFO("mesh " << spec << " over " << Names(axes).str());
      check_collective(rt, [&](Shard& s) { return psum(varying_input(s), axes); },
                       [&](int d) { return fold(member_inputs(mesh, d, axes), add); });
      check_collective(rt, [&](Shard& s) { return pmax(varying_input(s), axes); },
                       [&](int d) { return fold(member_inputs(mesh, d, axes), maximum); });
      check_collective(rt, [&](Shard& s) { return pmin(varying_input(s), axes); },
                       [&](int d) { return fold(member_inputs(mesh, d, axes), minimum); });
      check_collective(rt, [&](Shard& s) { return pmean(varying_input(s), axes); },
                       [&](int d) { return fold(member_inputs(mesh, d, axes), add) / static_cast<double>(mesh.group_size(axes)); });
    }
  }
}

TEST_CASE("psum results are Invariant and identical on every device of the group", "[mesh][collectives]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=4"));
  auto results = rt.run([&](Shard& s) {
    Tensor y = psum(varying_input(s, Shape{{"i", 1000}}), "mp");
    NAX_EXPECT(y.vary().kind("mp") == Vary::Invariant);
    NAX_EXPECT(y.vary().kind("dp") == Vary::Varying);
    return y.to_vector<double>();
  });
  for (int d = 0; d < 8; ++d) REQUIRE(results[static_cast<std::size_t>(d)] == results[static_cast<std::size_t>(d / 4 * 4)]);
}

TEST_CASE("all_gather and all_gather_invariant along leading, inner and new axes", "[mesh][collectives]") {
  for (const auto& spec : nax::testing::test_meshes()) {
    Mesh mesh = Mesh::parse(spec);
    Runtime rt = Runtime::local(mesh);
    for (const auto& axes : groups_of(mesh)) {
      for (const std::string axis : {"a", "b", "c"}) {
        INFO("mesh " << spec << " over " << Names(axes).str() << " along " << axis);
        check_collective(rt, [&](Shard& s) { return all_gather(varying_input(s), axes, axis); },
                         [&](int d) { return concat(member_inputs(mesh, d, axes), axis); });
        check_collective(rt, [&](Shard& s) { return all_gather_invariant(varying_input(s), axes, axis); },
                         [&](int d) { return concat(member_inputs(mesh, d, axes), axis); });
      }
      INFO("mesh " << spec << " stacking along a new axis");
      check_collective(rt, [&](Shard& s) { return all_gather_stacked(varying_input(s), axes, "stack"); },
                       [&](int d) {
                         std::vector<Tensor> parts;
                         for (const auto& x : member_inputs(mesh, d, axes))
                           parts.push_back(transpose(x * ones(Shape{{"stack", 1}}, DType::f64), {"stack", "a", "b", "c"}));
                         return concat(parts, "stack");
                       });
    }
  }
}

TEST_CASE("psum_scatter: sum, then keep this device's block, on any axis", "[mesh][collectives]") {
  for (const auto& spec : nax::testing::test_meshes()) {
    Mesh mesh = Mesh::parse(spec);
    Runtime rt = Runtime::local(mesh);
    for (const auto& axes : groups_of(mesh)) {
      const int n = mesh.group_size(axes);
      const Shape shape{{"a", 2 * n}, {"b", 3 * n}, {"c", 2}};
      for (const std::string axis : {"a", "b"}) {
        INFO("mesh " << spec << " over " << Names(axes).str() << " along " << axis);
        check_collective(rt,
                         [&](Shard& s) {
                           Tensor y = psum_scatter(varying_input(s, shape), axes, axis);
                           NAX_EXPECT(y.vary().split_mesh_axes(axis) == axes);
                           return y;
                         },
                         [&](int d) {
                           Tensor total = fold(member_inputs(mesh, d, axes, shape), add);
                           const std::int64_t block = shape.size(axis) / n, r = mesh.rank_in_group(d, axes);
                           return slice(total, axis, r * block, (r + 1) * block);
                         });
      }
    }
  }
}

TEST_CASE("ppermute: rings, shifts and partial permutations", "[mesh][collectives]") {
  for (const auto& spec : nax::testing::test_meshes()) {
    Mesh mesh = Mesh::parse(spec);
    Runtime rt = Runtime::local(mesh);
    for (const auto& axes : groups_of(mesh)) {
      const int n = mesh.group_size(axes);
      std::vector<std::vector<std::pair<int, int>>> perms(3);
      for (int r = 0; r < n; ++r) perms[0].push_back({r, (r + 1) % n});      // ring forward
      for (int r = 0; r < n; ++r) perms[1].push_back({r, (r + n - 1) % n});  // ring backward
      for (int r = 0; r + 1 < n; r += 2) perms[2].push_back({r + 1, r});     // partial: odd ranks to even
      for (const auto& pairs : perms) {
        INFO("mesh " << spec << " over " << Names(axes).str() << " with " << pairs.size() << " pairs");
        check_collective(rt, [&](Shard& s) { return ppermute(varying_input(s), axes, pairs); },
                         [&](int d) {
                           auto members = mesh.group(d, axes);
                           const int r = mesh.rank_in_group(d, axes);
                           for (auto [src, dst] : pairs)
                             if (dst == r) return input_of(members[static_cast<std::size_t>(src)]);
                           return zeros(kLocal, DType::f64);
                         });
      }
    }
  }
}

TEST_CASE("all_to_all: block j of the split axis goes to rank j, concatenated along the other", "[mesh][collectives]") {
  for (const auto& spec : nax::testing::test_meshes()) {
    Mesh mesh = Mesh::parse(spec);
    Runtime rt = Runtime::local(mesh);
    for (const auto& axes : groups_of(mesh)) {
      const int n = mesh.group_size(axes);
      const Shape shape{{"a", 2}, {"b", 2 * n}, {"c", 3}};
      for (auto [split, concat_axis] : {std::pair<std::string, std::string>{"b", "a"}, {"b", "c"}, {"b", "b"}}) {
        INFO("mesh " << spec << " over " << Names(axes).str() << " split " << split << " concat " << concat_axis);
        check_collective(rt, [&](Shard& s) { return all_to_all(varying_input(s, shape), axes, split, concat_axis); },
                         [&](int d) {
                           const std::int64_t block = shape.size(split) / n, r = mesh.rank_in_group(d, axes);
                           std::vector<Tensor> pieces;
                           for (const auto& x : member_inputs(mesh, d, axes, shape)) pieces.push_back(slice(x, split, r * block, (r + 1) * block));
                           return concat(pieces, concat_axis);
                         });
      }
    }
  }
}

TEST_CASE("all_to_all moves a Split from one axis to another", "[mesh][collectives]") {
  Mesh mesh = Mesh::parse("dp=2,mp=4");
  Runtime rt = Runtime::local(mesh);
  Tensor global = random_normal(Shape{{"seq", 8}, {"heads", 4}, {"d", 3}}, 1, "g");
  auto results = rt.run([&](Shard& s) {
    Tensor by_heads = s.shard(global, {{"heads", "mp"}});
    Tensor by_seq = all_to_all(by_heads, "mp", "seq", "heads");
    NAX_EXPECT(by_seq.vary().split_axis("mp") == "seq");
    NAX_EXPECT(nax::testing::same_values(by_seq, s.shard(global, {{"seq", "mp"}})));
    return s.gather(by_seq).to_vector<double>();
  });
  for (const auto& r : results) REQUIRE(r == global.to_vector<double>());
}

TEST_CASE("axis_index and axis_size follow the group's row-major order", "[mesh][collectives]") {
  Mesh mesh = Mesh::parse("dp=2,mp=3");
  Runtime rt = Runtime::local(mesh);
  auto results = rt.run([&](Shard&) {
    std::vector<int> out;
    for (const auto& axes : std::vector<std::vector<std::string>>{{"dp"}, {"mp"}, {"dp", "mp"}, {"mp", "dp"}}) {
      Tensor i = axis_index(axes);
      NAX_EXPECT(i.dtype() == DType::i32);
      for (const auto& m : axes) NAX_EXPECT(i.vary().kind(m) == Vary::Varying);
      out.push_back(static_cast<int>(i.item()));
      NAX_EXPECT(axis_size(axes) == mesh.group_size(axes));
    }
    return out;
  });
  for (int d = 0; d < mesh.size(); ++d) {
    auto c = mesh.coords(d);
    REQUIRE(results[static_cast<std::size_t>(d)] == std::vector<int>{c[0], c[1], c[0] * 3 + c[1], c[1] * 2 + c[0]});
  }
}

TEST_CASE("collectives on f32, bf16 and i32 values", "[mesh][collectives]") {
  Runtime rt = Runtime::local(Mesh::parse("mp=4"));
  auto results = rt.run([&](Shard&) {
    Tensor i = axis_index("mp");
    Tensor f = cast(i, DType::f32) + 0.5;
    Tensor h = cast(f, DType::bf16);
    return std::vector<double>{psum(i, "mp").item(), psum(f, "mp").item(), psum(h, "mp").item(), pmax(h, "mp").item(),
                               all_gather_stacked(i, "mp", "r").to_vector<double>()[3]};
  });
  for (const auto& r : results) REQUIRE(r == std::vector<double>{6, 8, 8, 3.5, 3});
}

TEST_CASE("gathers over several mesh axes join blocks in the tensor's split order, whatever order names them",
          "[mesh][collectives]") {
  // Regression: arange(8) split over (dp, mp) gathered over {mp, dp} came back
  // [0,1,4,5,2,3,6,7], typed Invariant.
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  const std::vector<double> want{0, 1, 2, 3, 4, 5, 6, 7};
  for (const Names& group : {Names{"mp", "dp"}, Names{"dp", "mp"}}) {
    INFO("gathered over " << group.str());
    auto results = rt.run([&](Shard& s) {
      Tensor x = s.shard(arange({"i", 8}, DType::f64), {{"i", {"dp", "mp"}}});
      Tensor inv = all_gather_invariant(x, group, "i");
      NAX_EXPECT(inv.vary().invariant());
      Tensor var = all_gather(x, group, "i");
      NAX_EXPECT(var.to_vector<double>() == inv.to_vector<double>());
      // psum_scatter cuts in the order named: over (dp, mp) each device gets its own block back.
      Tensor back = psum_scatter(var, {"dp", "mp"}, "i");
      NAX_EXPECT(back.to_vector<double>() == (x * 4.0).to_vector<double>());
      return inv.to_vector<double>();
    });
    for (const auto& r : results) REQUIRE(r == want);
  }
}

// [i=8, j=4] holding 0..31 row-major.
static Tensor reshape_like_ij() { return split_axis(arange({"n", 32}, DType::f64), "n", {{"i", 8}, {"j", 4}}); }

TEST_CASE("all_to_all over several mesh axes concatenates in the tensor's split order", "[mesh][collectives]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  for (const Names& group : {Names{"mp", "dp"}, Names{"dp", "mp"}}) {
    INFO("over " << group.str());
    auto results = rt.run([&](Shard& s) {
      // i (8) split over (dp, mp); j (4) whole. After all_to_all(split j, concat i): i whole, in order.
      Tensor x = s.shard(reshape_like_ij(), {{"i", {"dp", "mp"}}});
      Tensor y = all_to_all(x, group, "j", "i");
      return all_gather_invariant(y, group, "j").to_vector<double>();
    });
    for (const auto& r : results) REQUIRE(r == reshape_like_ij().to_vector<double>());
  }
}

TEST_CASE("the thread runtime's psum and psum_scatter add the ranks in the halving tree on any group size",
          "[mesh][collectives]") {
  // f32 values from 1e-3 to 1e7 of both signs: the order of the additions shows in the bits.
  const std::int64_t count = 40000;  // each rank's slice spans several of the reduction's 4096-element chunks
  auto values = [&](int device) {
    const auto u = random_uniform(Shape{{"i", count}}, 5, fmt::format("u{}", device), -1.0, 1.0, DType::f64).to_vector<double>();
    const auto e = random_uniform(Shape{{"i", count}}, 6, fmt::format("e{}", device), -3.0, 7.0, DType::f64).to_vector<double>();
    std::vector<float> v(u.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(u[i] * std::pow(10.0, e[i]));
    return v;
  };
  for (const int n : {2, 3, 4, 6, 8}) {
    INFO("group of " << n);
    std::vector<std::vector<float>> inputs;
    for (int d = 0; d < n; ++d) inputs.push_back(values(d));
    const std::vector<float> want = nax::testing::add_pairwise(inputs);  // pairs, then pairs of pairs
    Runtime rt = Runtime::local(Mesh::parse(fmt::format("mp={}", n)));
    const auto got = rt.run([&](Shard& s) {
      const Tensor x = pvary(s.shard(from_vector(Shape{{"i", count}}, inputs[static_cast<std::size_t>(s.device())]), {}), "mp");
      return std::pair{psum(x, "mp").to_vector<float>(),
                       count % n == 0 ? psum_scatter(x, "mp", "i").to_vector<float>() : std::vector<float>{}};
    });
    for (std::size_t d = 0; d < got.size(); ++d) {
      nax::testing::require_same_bits(got[d].first, want, fmt::format("psum on device {} of {}", d, n));
      if (count % n == 0) {
        const std::size_t block = static_cast<std::size_t>(count / n);
        nax::testing::require_same_bits(got[d].second.data(), want.data() + d * block, block,
                                        fmt::format("psum_scatter's block on device {} of {}", d, n));
      }
    }
  }
}

TEST_CASE("all_reduce_parts reads the parts where they are and sums each over the ranks in the halving tree",
          "[mesh][collectives]") {
  // Parts of 5000 elements: a rank's slice of the parts end to end starts and ends inside a part,
  // and the reduction's chunks are cut at the parts' edges. f32 values from 1e0 to 1e8 of both
  // signs: the order of the additions shows in the bits; the reference adds them here.
  const std::size_t part = 5000, parts = 3;
  auto values = [&](int device, std::size_t p) {
    const auto u = random_uniform(Shape{{"i", static_cast<std::int64_t>(part)}}, 7, fmt::format("p{}_{}", device, p), -1.0, 1.0,
                                  DType::f64).to_vector<double>();
    std::vector<float> v(u.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(u[i] * std::pow(10.0, static_cast<double>(i % 9)));
    return v;
  };
  for (const int n : {2, 3, 4}) {
    INFO("group of " << n);
    std::vector<float> want;  // each part's sum over the ranks, end to end
    for (std::size_t p = 0; p < parts; ++p) {
      std::vector<std::vector<float>> ranks;
      for (int d = 0; d < n; ++d) ranks.push_back(values(d, p));
      const std::vector<float> sum = nax::testing::add_pairwise(ranks);
      want.insert(want.end(), sum.begin(), sum.end());
    }
    Runtime rt = Runtime::local(Mesh::parse(fmt::format("mp={}", n)));
    const auto got = rt.run([&](Shard& s) {
      Communicator& comm = s.comm("mp");
      std::vector<std::vector<float>> mine;
      std::vector<const void*> pointers;
      for (std::size_t p = 0; p < parts; ++p) mine.push_back(values(s.device(), p));
      for (const auto& m : mine) pointers.push_back(m.data());
      std::vector<float> blocking(parts * part), started(parts * part);
      comm.all_reduce_parts(pointers, blocking.data(), part, DType::f32, ReduceOp::sum, Call{"parts"});
      comm.start_all_reduce_parts(pointers, started.data(), part, DType::f32, ReduceOp::sum, Call{"started parts"})->wait();
      return std::tuple{blocking, started, comm.reduces_parts()};
    });
    for (std::size_t d = 0; d < got.size(); ++d) {
      const auto& [blocking, started, reads_in_place] = got[d];
      REQUIRE(reads_in_place);
      nax::testing::require_same_bits(blocking, want, fmt::format("blocking parts on device {} of {}", d, n));
      nax::testing::require_same_bits(started, want, fmt::format("started parts on device {} of {}", d, n));
    }
  }
}
