// Vary-type rules of docs/ops.md and docs/collectives.md on ordinary ops and on the collectives.
#include "helpers.h"

using namespace nax;

namespace {
// Runs fn on device 0 of a dp=2,mp=2 mesh (all devices run it; device 0 reports).
template <typename F>
auto on_mesh(F fn) {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  return rt.run(fn)[0];
}
}  // namespace

TEST_CASE("shard gives Split over the rule's mesh axes and Invariant elsewhere", "[mesh][vary]") {
  auto str = on_mesh([](Shard& s) {
    return s.shard(zeros(Shape{{"batch", 4}, {"seq", 3}, {"heads", 2}}), {{"batch", "dp"}, {"heads", "mp"}}).str();
  });
  REQUIRE(str == "f32[batch=2|dp, seq=3, heads=1|mp] varying{}");
}

TEST_CASE("elementwise: Split meets Split on the same axis; Varying wins", "[mesh][vary]") {
  auto strs = on_mesh([](Shard& s) {
    Tensor x = s.shard(zeros(Shape{{"batch", 4}, {"embed", 6}}), {{"batch", "dp"}});
    Tensor bias = s.shard(zeros(Shape{{"embed", 6}}), {});
    Tensor y = s.shard(ones(Shape{{"batch", 4}, {"embed", 6}}), {{"batch", "dp"}});
    Tensor v = pvary(bias, "mp");
    return std::vector<std::string>{(x + bias).str(), (x * y).str(), (x + v).str(), (pvary(bias, "dp") + x).str()};
  });
  REQUIRE(strs[0] == "f32[batch=2|dp, embed=6] varying{}");
  REQUIRE(strs[1] == "f32[batch=2|dp, embed=6] varying{}");
  REQUIRE(strs[2] == "f32[batch=2|dp, embed=6] varying{mp}");
  REQUIRE(strs[3] == "f32[embed=6, batch=2] varying{dp}");  // Split meeting Varying over dp: Varying
}

TEST_CASE("contracting or reducing over a Split axis gives a partial value", "[mesh][vary]") {
  auto strs = on_mesh([](Shard& s) {
    Tensor h = s.shard(zeros(Shape{{"batch", 2}, {"mlp", 8}}), {{"mlp", "mp"}});
    Tensor w = s.shard(zeros(Shape{{"mlp", 8}, {"embed", 3}}), {{"mlp", "mp"}});
    Tensor w_in = s.shard(zeros(Shape{{"embed", 3}, {"mlp", 8}}), {{"mlp", "mp"}});
    Tensor x = s.shard(zeros(Shape{{"batch", 2}, {"embed", 3}}), {});
    return std::vector<std::string>{dot(h, w, "mlp").str(), sum(h, "mlp").str(), dot(x, w_in, "embed").str(),
                                    psum(dot(h, w, "mlp"), "mp").str(), max(h, "batch").str()};
  });
  REQUIRE(strs[0] == "f32[batch=2, embed=3] partial{mp}");
  REQUIRE(strs[1] == "f32[batch=2] partial{mp}");
  REQUIRE(strs[2] == "f32[batch=2, mlp=4|mp] varying{}");  // column-parallel: stays Split
  REQUIRE(strs[3] == "f32[batch=2, embed=3] varying{}");
  REQUIRE(strs[4] == "f32[mlp=4|mp] varying{}");
}

TEST_CASE("layout ops carry the Split to the axis that holds the blocks", "[mesh][vary]") {
  auto strs = on_mesh([](Shard& s) {
    Tensor x = s.shard(zeros(Shape{{"heads", 4}, {"d", 3}}), {{"heads", "mp"}});
    return std::vector<std::string>{rename(x, "heads", "h").str(), transpose(x, {"d", "heads"}).str(),
                                    split_axis(x, "heads", {{"g", 1}, {"h", 2}}).str(), merge_axes(x, {"heads", "d"}, "hd").str(),
                                    slice(x, "heads", 0, 1).str(), slice(x, "d", 0, 1).str(), cast(x, DType::f64).str()};
  });
  REQUIRE(strs[0] == "f32[h=2|mp, d=3] varying{}");
  REQUIRE(strs[1] == "f32[d=3, heads=2|mp] varying{}");
  REQUIRE(strs[2] == "f32[g=1|mp, h=2, d=3] varying{}");
  REQUIRE(strs[3] == "f32[hd=6|mp] varying{}");
  REQUIRE(strs[4] == "f32[heads=1, d=3] varying{mp}");  // a slice of a block is no global block
  REQUIRE(strs[5] == "f32[heads=2|mp, d=1] varying{}");
  REQUIRE(strs[6] == "f64[heads=2|mp, d=3] varying{}");
}

TEST_CASE("collectives change the vary type as the table says", "[mesh][vary]") {
  auto strs = on_mesh([](Shard& s) {
    Tensor inv = s.shard(zeros(Shape{{"i", 4}}), {});
    Tensor var = pvary(inv, {"dp", "mp"});
    Tensor split = s.shard(zeros(Shape{{"i", 4}, {"j", 4}}), {{"j", "mp"}});
    return std::vector<std::string>{
        var.str(),
        psum(var, "mp").str(),
        pmean(var, {"dp", "mp"}).str(),
        all_gather(var, "mp", "i").str(),
        all_gather_invariant(split, "mp", "j").str(),
        all_gather(split, "mp", "j").str(),
        psum_scatter(var, "mp", "i").str(),
        psum_scatter(psum_scatter(var, "dp", "i"), "mp", "i").str(),
        ppermute(inv, "mp", {{0, 1}, {1, 0}}).str(),
        all_to_all(split, "mp", "i", "j").str(),
    };
  });
  REQUIRE(strs[0] == "f32[i=4] varying{dp,mp}");
  REQUIRE(strs[1] == "f32[i=4] varying{dp}");
  REQUIRE(strs[2] == "f32[i=4] varying{}");
  REQUIRE(strs[3] == "f32[i=8] varying{dp,mp}");
  REQUIRE(strs[4] == "f32[i=4, j=4] varying{}");
  REQUIRE(strs[5] == "f32[i=4, j=4] varying{mp}");
  REQUIRE(strs[6] == "f32[i=2|mp] varying{dp}");
  REQUIRE(strs[7] == "f32[i=1|dp,mp] varying{}");
  REQUIRE(strs[8] == "f32[i=4] varying{mp}");
  REQUIRE(strs[9] == "f32[i=2|mp, j=4] varying{}");
}

TEST_CASE("gathering a multi-axis Split follows the major-to-minor order", "[mesh][vary]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  Tensor global = arange({"i", 8});
  auto results = rt.run([&](Shard& s) {
    Tensor x = s.shard(global, {{"i", {"dp", "mp"}}});
    Tensor by_dp = all_gather_invariant(x, "mp", "i");  // mp was the minor cut: a dp block remains
    NAX_EXPECT(by_dp.str() == "f32[i=4|dp] varying{}");
    Tensor odd = all_gather_invariant(x, "dp", "i");  // dp was the major cut: no block remains
    NAX_EXPECT(odd.vary().kind("mp") == Vary::Varying);
    return s.gather(by_dp).to_vector<double>();
  });
  for (const auto& r : results) REQUIRE(r == global.to_vector<double>());
}
