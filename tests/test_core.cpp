// Core types: dtypes, shapes, meshes, axis rules, the caching allocator, the counter-based RNG.
#include <filesystem>
#include <fstream>
#include <set>

#include "files.h"
#include "helpers.h"

using namespace nax;

TEST_CASE("dtype sizes, names and parsing", "[core]") {
  REQUIRE(dtype_size(DType::f32) == 4);
  REQUIRE(dtype_size(DType::f64) == 8);
  REQUIRE(dtype_size(DType::bf16) == 2);
  REQUIRE(dtype_size(DType::i32) == 4);
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::i32}) REQUIRE(parse_dtype(dtype_name(d)) == d);
}

TEST_CASE("bf16 rounds to nearest even and keeps NaN and infinities", "[core]") {
  REQUIRE(static_cast<float>(bf16(1.0f)) == 1.0f);
  REQUIRE(static_cast<float>(bf16(-2.5f)) == -2.5f);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  REQUIRE(static_cast<float>(bf16(1.0f + 0x1.0p-8f)) == 1.0f);
  REQUIRE(static_cast<float>(bf16(1.0f + 3 * 0x1.0p-8f)) == 1.0f + 0x1.0p-6f);
  REQUIRE(std::isnan(static_cast<float>(bf16(NAN))));
  REQUIRE(std::isinf(static_cast<float>(bf16(INFINITY))));
}

TEST_CASE("shape: named axes, row-major strides, lookup", "[core]") {
  Shape s{{"batch", 4}, {"seq", 8}, {"embed", 16}};
  REQUIRE(s.rank() == 3);
  REQUIRE(s.numel() == 512);
  REQUIRE(s.strides() == std::vector<std::int64_t>{128, 16, 1});
  REQUIRE(s.index_of("seq") == 1);
  REQUIRE(s.index_of("heads") == -1);
  REQUIRE(s.size("embed") == 16);
  REQUIRE(s.str() == "[batch=4, seq=8, embed=16]");
  REQUIRE(Shape{}.numel() == 1);
}

TEST_CASE("mesh: parsing, row-major coordinates, groups", "[core]") {
  Mesh m = Mesh::parse("dp=2,mp=4");
  REQUIRE(m.size() == 8);
  REQUIRE(m.str() == "dp=2,mp=4");
  REQUIRE(m.coords(5) == std::vector<int>{1, 1});
  REQUIRE(m.device_at({1, 1}) == 5);
  REQUIRE(Mesh::parse(" dp = 2 , mp=4 ") == m);
  for (int d = 0; d < m.size(); ++d) REQUIRE(m.device_at(m.coords(d)) == d);
  REQUIRE(m.group(5, {"mp"}) == std::vector<int>{4, 5, 6, 7});
  REQUIRE(m.group(5, {"dp"}) == std::vector<int>{1, 5});
  REQUIRE(m.rank_in_group(5, {"mp"}) == 1);
  // Several axes: ranked row-major over the axes in the order given.
  REQUIRE(m.group(5, {"dp", "mp"}) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  REQUIRE(m.group(5, {"mp", "dp"}) == std::vector<int>{0, 4, 1, 5, 2, 6, 3, 7});
  REQUIRE(m.rank_in_group(5, {"mp", "dp"}) == 3);
  REQUIRE(m.group_size({"dp", "mp"}) == 8);
}

TEST_CASE("axis rules: parse, lookup, check against a mesh", "[core]") {
  AxisRules r = AxisRules::parse("batch=dp,heads=mp,tokens=dp+mp");
  REQUIRE(r.mesh_axes("batch") == std::vector<std::string>{"dp"});
  REQUIRE(r.mesh_axes("tokens") == std::vector<std::string>{"dp", "mp"});
  REQUIRE(r.mesh_axes("embed").empty());
  Mesh m = Mesh::parse("dp=2,mp=2");
  REQUIRE_NOTHROW(r.check(m, Shape{{"batch", 4}, {"heads", 2}}, "test"));
  AxisRules r2{{"batch", "dp"}, {"tokens", {"dp", "mp"}}};
  REQUIRE(r2.mesh_axes("tokens") == std::vector<std::string>{"dp", "mp"});
}

TEST_CASE("caching allocator reuses freed blocks and tracks bytes in use and peak", "[core]") {
  auto alloc = make_caching_host_allocator();
  void* a = alloc->allocate(1000);
  void* b = alloc->allocate(3000);
  REQUIRE(reinterpret_cast<std::uintptr_t>(a) % 64 == 0);
  REQUIRE(alloc->stats().bytes_in_use == 4000);
  REQUIRE(alloc->stats().peak_bytes_in_use == 4000);
  alloc->deallocate(b, 3000);
  REQUIRE(alloc->stats().bytes_in_use == 1000);
  REQUIRE(alloc->stats().peak_bytes_in_use == 4000);
  void* c = alloc->allocate(2500);  // same size class as the freed 3000
  REQUIRE(c == b);
  REQUIRE(alloc->stats().cache_hits == 1);
  const auto reserved = alloc->stats().bytes_reserved;
  alloc->deallocate(a, 1000);
  alloc->deallocate(c, 2500);
  REQUIRE(alloc->stats().bytes_in_use == 0);
  REQUIRE(alloc->stats().bytes_reserved == reserved);
  alloc->empty_cache();
  REQUIRE(alloc->stats().bytes_reserved == 0);
  alloc->reset_peak();
  REQUIRE(alloc->stats().peak_bytes_in_use == 0);
}

TEST_CASE("NAX_MEMORY_PEAK_TRACE writes what was live at the allocator's high-water mark, by call stack", "[core][memory]") {
  const std::string path = nax::testing::scratch_dir("peak_trace") + ".txt";
  std::filesystem::remove(path);
  setenv("NAX_MEMORY_PEAK_TRACE", path.c_str(), 1);
  {
    auto alloc = make_caching_host_allocator();
    unsetenv("NAX_MEMORY_PEAK_TRACE");
    std::vector<void*> same_place;
    for (int i = 0; i < 2; ++i) same_place.push_back(alloc->allocate(2000));  // one call stack
    void* c = alloc->allocate(1500);  // the peak: 5500 bytes in three allocations
    alloc->deallocate(same_place[1], 2000);
    void* d = alloc->allocate(700);  // after the peak: not in the note
    alloc->deallocate(same_place[0], 2000);
    alloc->deallocate(c, 1500);
    alloc->deallocate(d, 700);
  }  // the trace is written as the allocator goes
  const std::string text = nax::testing::file_bytes(path);
  CHECK_THAT(text, Catch::Matchers::Contains("peak 5500 bytes in use; noted at 5500 bytes: 3 live allocations from 2 call stacks"));
  CHECK_THAT(text, Catch::Matchers::Contains("4000 bytes in 2 allocations"));
  CHECK_THAT(text, Catch::Matchers::Contains("1500 bytes in 1 allocations"));
  CHECK_THAT(text, !Catch::Matchers::Contains("700 bytes"));
  std::filesystem::remove(path);
}

TEST_CASE("tensors return their memory to the device's cache", "[core]") {
  auto& alloc = Device::host()->allocator();
  const auto before = alloc.stats();
  for (int i = 0; i < 10; ++i) {
    Tensor x = zeros(Shape{{"a", 1000}});
    Tensor y = x + 1.0;
    REQUIRE(y.to_vector<float>()[999] == 1.0f);
  }
  const auto after = alloc.stats();
  REQUIRE(after.bytes_in_use == before.bytes_in_use);
  REQUIRE(after.bytes_reserved - before.bytes_reserved <= 3 * 4096);  // two live at a time, plus a scalar
  REQUIRE(after.cache_hits - before.cache_hits >= 2 * 9);
}

TEST_CASE("counter-based rng: a pure function of (seed, name, index)", "[core][rng]") {
  rng::Key k = rng::make_key(42, "w");
  REQUIRE(rng::uniform(k, 7) == rng::uniform(rng::make_key(42, "w"), 7));
  REQUIRE(rng::uniform(k, 7) != rng::uniform(rng::make_key(43, "w"), 7));
  REQUIRE(rng::uniform(k, 7) != rng::uniform(rng::make_key(42, "v"), 7));
  REQUIRE(rng::uniform(k, 7) != rng::uniform(k, 8));
  double sum = 0, sum_sq = 0, lo = 1, hi = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    double u = rng::uniform(k, static_cast<std::uint64_t>(i));
    lo = std::min(lo, u), hi = std::max(hi, u);
    double z = rng::normal(k, static_cast<std::uint64_t>(i));
    sum += z, sum_sq += z * z;
  }
  REQUIRE(lo >= 0.0);
  REQUIRE(hi < 1.0);
  REQUIRE(std::abs(sum / n) < 0.02);
  REQUIRE(std::abs(sum_sq / n - 1.0) < 0.02);
}

TEST_CASE("random tensors: element i depends on the global index only", "[core][rng]") {
  Tensor whole = random_normal(Shape{{"a", 6}, {"b", 4}}, 3, "w");
  Tensor again = random_normal(Shape{{"a", 6}, {"b", 4}}, 3, "w");
  nax::testing::require_equal(whole, again);
  Tensor u = random_uniform(Shape{{"a", 1000}}, 3, "u", -2, 5);
  auto v = u.to_vector<double>();
  REQUIRE(*std::min_element(v.begin(), v.end()) >= -2.0);
  REQUIRE(*std::max_element(v.begin(), v.end()) < 5.0);
  std::set<double> distinct(v.begin(), v.end());
  REQUIRE(distinct.size() > 990);
}

TEST_CASE("printing shows dtype, axes and the vary type", "[core]") {
  Tensor x = zeros(Shape{{"batch", 4}, {"seq", 128}});
  REQUIRE(x.str() == "f32[batch=4, seq=128] varying{}");
  Tensor y = x.with_vary([] {
    VaryType v;
    v.set_split("dp", "batch");
    v.set_varying("mp");
    return v;
  }());
  REQUIRE(y.str() == "f32[batch=4|dp, seq=128] varying{mp}");
  REQUIRE(arange({"i", 3}, DType::i32).format() == "i32[i=3] varying{} {0, 1, 2}");
}
