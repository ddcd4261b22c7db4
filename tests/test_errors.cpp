// Every misuse gets a nax::Error naming the op, the axes and the shapes: never a crash, a hang or a
// silent wrong answer (docs/invariants.md). Runtime cases also check that errors are fast and that the
// runtime is usable again afterwards.

#include "helpers.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

using namespace nax;
using Catch::Matchers::Contains;

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The message of the nax::Error that f throws; fails the test when f throws nothing.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("expected a nax::Error, none was thrown");
  return {};
}

struct Failure {
  std::string message;
  double seconds = 0;
};

Failure run_failing(Runtime& rt, const std::function<void(Shard&)>& fn) {
  const auto start = Clock::now();
  std::string message = error_of([&] { rt.run(fn); });
  return {message, seconds_since(start)};
}

// Turns a hang into a loud abort instead of a stuck test binary.
class Watchdog {
 public:
  explicit Watchdog(double seconds)
      : thread_([this, seconds] {
          std::unique_lock lock(mutex_);
          if (!cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; })) {
            std::fprintf(stderr, "test_errors: hung for more than %g s\n", seconds);
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

constexpr double kTimeout = 10;     // collective timeout of the runtime tests unless said otherwise
// An error that must not wait for the timeout comes before the timeout could have fired: a generous
// bound that a loaded 2-core machine or TSan still meets, not a speed claim.
constexpr double kFast = 0.8 * kTimeout;
constexpr double kHang = 20;        // the watchdog's limit for one test

Runtime local_runtime(const char* spec, double timeout_s = kTimeout) {
  return Runtime::local(Mesh::parse(spec), {.collective_timeout_s = timeout_s});
}

// x[i] = 10 * device + i, Varying over every mesh axis.
Tensor per_device(Shard& s, std::int64_t n = 4) {
  return pvary(arange({"i", n}) + 10.0 * s.device(), s.mesh().axis_names());
}

void require_psum_works(Runtime& rt) {
  auto sums = rt.run([](Shard& s) {
    auto axes = s.mesh().axis_names();
    return psum(pvary(full(Shape{{"i", 3}}, s.device() + 1.0), axes), axes).to_vector<double>();
  });
  const double n = rt.size();
  for (const auto& v : sums) REQUIRE(v == std::vector<double>(3, n * (n + 1) / 2));
}

Tensor batch_seq() { return zeros(Shape{{"batch", 2}, {"seq", 3}}); }

struct UserFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

// --- unknown and duplicate axes ---

TEST_CASE("sum over an unknown axis names sum, the axis and the shape", "[errors]") {
  REQUIRE_THAT(error_of([] { sum(batch_seq(), "sek"); }),
               Contains("sum") && Contains("'sek'") && Contains("[batch=2, seq=3]"));
}

TEST_CASE("slice of an unknown axis names slice, the axis and the shape", "[errors]") {
  REQUIRE_THAT(error_of([] { slice(batch_seq(), "embed", 0, 1); }),
               Contains("slice") && Contains("'embed'") && Contains("[batch=2, seq=3]"));
}

TEST_CASE("transpose to an unknown axis names transpose, the axis and the shape", "[errors]") {
  REQUIRE_THAT(error_of([] { transpose(batch_seq(), {"seq", "bacth"}); }),
               Contains("transpose") && Contains("'bacth'") && Contains("[batch=2, seq=3]"));
}

TEST_CASE("rename of an unknown axis names rename, the axis and the shape", "[errors]") {
  REQUIRE_THAT(error_of([] { rename(batch_seq(), "sequence", "tokens"); }),
               Contains("rename") && Contains("'sequence'") && Contains("[batch=2, seq=3]"));
}

TEST_CASE("a Shape with a duplicate axis names the axis and the shape", "[errors]") {
  REQUIRE_THAT(error_of([] { Shape s{{"a", 2}, {"b", 3}, {"a", 4}}; }),
               Contains("Shape") && Contains("duplicate") && Contains("'a'") && Contains("[a=2, b=3, a=4]"));
}

TEST_CASE("sum naming one axis twice names sum, the axis and the shape", "[errors]") {
  REQUIRE_THAT(error_of([] { sum(batch_seq(), {"seq", "seq"}); }),
               Contains("sum") && Contains("'seq'") && Contains("twice") && Contains("[batch=2, seq=3]"));
}

TEST_CASE("transpose to an order that misses an axis names transpose and the shape", "[errors]") {
  Tensor x = zeros(Shape{{"a", 2}, {"b", 3}, {"c", 4}});
  REQUIRE_THAT(error_of([&] { transpose(x, {"c", "a"}); }),
               Contains("transpose") && Contains("(c, a)") && Contains("[a=2, b=3, c=4]"));
}

TEST_CASE("transpose to an order that repeats an axis names transpose and the shape", "[errors]") {
  REQUIRE_THAT(error_of([] { transpose(batch_seq(), {"seq", "seq"}); }),
               Contains("transpose") && Contains("seq") && Contains("[batch=2, seq=3]"));
}

TEST_CASE("rename onto an existing axis name names rename, the clashing axis and the shape", "[errors]") {
  REQUIRE_THAT(error_of([] { rename(batch_seq(), "batch", "seq"); }),
               Contains("rename") && Contains("'seq'") && Contains("[batch=2, seq=3]"));
}

// --- dot ---

TEST_CASE("dot over an axis missing on one side names dot, the axis and both shapes", "[errors]") {
  Tensor x = zeros(Shape{{"batch", 2}, {"embed", 4}});
  Tensor w = zeros(Shape{{"mlp", 8}, {"hidden", 4}});
  REQUIRE_THAT(error_of([&] { dot(x, w, "embed"); }),
               Contains("dot") && Contains("'embed'") && Contains("right") && Contains("f32[batch=2, embed=4]") &&
                   Contains("f32[mlp=8, hidden=4]"));
}

TEST_CASE("dot over an axis of different sizes names dot, the axis, both sizes and both shapes", "[errors]") {
  Tensor x = zeros(Shape{{"batch", 2}, {"embed", 4}});
  Tensor w = zeros(Shape{{"embed", 5}, {"mlp", 3}});
  REQUIRE_THAT(error_of([&] { dot(x, w, "embed"); }),
               Contains("dot") && Contains("'embed'") && Contains("size 4") && Contains("5") &&
                   Contains("f32[batch=2, embed=4]") && Contains("f32[embed=5, mlp=3]"));
}

TEST_CASE("dot with a batch axis of different sizes names dot, the axis and both shapes", "[errors]") {
  Tensor x = zeros(Shape{{"batch", 2}, {"embed", 4}});
  Tensor w = zeros(Shape{{"batch", 3}, {"embed", 4}});
  REQUIRE_THAT(error_of([&] { dot(x, w, "embed"); }),
               Contains("dot") && Contains("'batch'") && Contains("f32[batch=2, embed=4]") &&
                   Contains("f32[batch=3, embed=4]"));
}

TEST_CASE("dot contracting one axis twice names dot, the axis and both shapes", "[errors]") {
  Tensor x = zeros(Shape{{"batch", 2}, {"embed", 4}});
  Tensor w = zeros(Shape{{"embed", 4}, {"mlp", 3}});
  REQUIRE_THAT(error_of([&] { dot(x, w, {"embed", "embed"}); }),
               Contains("dot") && Contains("'embed'") && Contains("f32[batch=2, embed=4]") &&
                   Contains("f32[embed=4, mlp=3]"));
}

// --- elementwise ---

TEST_CASE("add of axes with different sizes names add, the axis and both shapes", "[errors]") {
  Tensor a = zeros(Shape{{"batch", 2}, {"seq", 3}});
  Tensor b = zeros(Shape{{"seq", 4}});
  REQUIRE_THAT(error_of([&] { add(a, b); }),
               Contains("add") && Contains("'seq'") && Contains("f32[batch=2, seq=3]") && Contains("f32[seq=4]"));
}

TEST_CASE("add of different dtypes names add, both dtypes and both shapes", "[errors]") {
  Tensor a = zeros(Shape{{"a", 2}}, DType::f32);
  Tensor b = zeros(Shape{{"a", 2}}, DType::f64);
  REQUIRE_THAT(error_of([&] { a + b; }),
               Contains("add") && Contains("dtype") && Contains("f32[a=2]") && Contains("f64[a=2]"));
}

TEST_CASE("exp of an integer tensor names exp and the tensor", "[errors]") {
  Tensor x = zeros(Shape{{"a", 2}}, DType::i32);
  REQUIRE_THAT(error_of([&] { exp(x); }), Contains("exp") && Contains("i32[a=2]"));
}

TEST_CASE("from_vector with the wrong number of values names the shape and both counts", "[errors]") {
  REQUIRE_THAT(error_of([] { from_vector<float>(Shape{{"a", 2}}, {1, 2, 3}); }),
               Contains("from_vector") && Contains("3 values") && Contains("[a=2]"));
}

// --- layout ---

TEST_CASE("slice out of bounds names slice, the range, the axis and the shape", "[errors]") {
  REQUIRE_THAT(error_of([] { slice(batch_seq(), "seq", 2, 5); }),
               Contains("slice") && Contains("[2, 5)") && Contains("'seq'") && Contains("[batch=2, seq=3]"));
}

TEST_CASE("split_axis into parts that do not multiply to the size names the parts and the shape", "[errors]") {
  Tensor x = zeros(Shape{{"batch", 2}, {"embed", 6}});
  REQUIRE_THAT(error_of([&] { split_axis(x, "embed", {{"heads", 4}, {"head_dim", 2}}); }),
               Contains("split_axis") && Contains("heads=4") && Contains("head_dim=2") && Contains("'embed'") &&
                   Contains("[batch=2, embed=6]"));
}

TEST_CASE("concat of tensors differing outside the axis names concat, the axis and both shapes", "[errors]") {
  Tensor x = zeros(Shape{{"a", 2}, {"b", 3}});
  Tensor y = zeros(Shape{{"a", 2}, {"b", 4}});
  REQUIRE_THAT(error_of([&] { concat({x, y}, "a"); }),
               Contains("concat") && Contains("'a'") && Contains("f32[a=2, b=3]") && Contains("f32[a=2, b=4]"));
}

TEST_CASE("concat of different dtypes names concat and both tensors", "[errors]") {
  Tensor x = zeros(Shape{{"a", 2}}, DType::f32);
  Tensor y = zeros(Shape{{"a", 2}}, DType::f64);
  REQUIRE_THAT(error_of([&] { concat({x, y}, "a"); }),
               Contains("concat") && Contains("f32[a=2]") && Contains("f64[a=2]"));
}

// --- tensor access ---

TEST_CASE("item of a tensor with several elements names item and the shape", "[errors]") {
  Tensor x = zeros(Shape{{"a", 2}});
  REQUIRE_THAT(error_of([&] { x.item(); }), Contains("item") && Contains("f32[a=2]"));
}

TEST_CASE("data<T> with the wrong element type names both types and the shape", "[errors]") {
  Tensor x = zeros(Shape{{"a", 2}});
  REQUIRE_THAT(error_of([&] { x.data<double>(); }),
               Contains("Tensor::data") && Contains("f64") && Contains("f32[a=2]"));
}

// --- mesh specs ---

TEST_CASE("an empty mesh spec is refused", "[errors]") {
  REQUIRE_THAT(error_of([] { Mesh::parse(""); }), Contains("Mesh::parse") && Contains("empty"));
}

TEST_CASE("a mesh spec item without a size is refused naming the item", "[errors]") {
  REQUIRE_THAT(error_of([] { Mesh::parse("dp"); }),
               Contains("Mesh::parse") && Contains("'dp'") && Contains("name=size"));
}

TEST_CASE("a mesh spec with a non-integer size names the axis and the size", "[errors]") {
  REQUIRE_THAT(error_of([] { Mesh::parse("dp=x"); }),
               Contains("Mesh::parse") && Contains("'x'") && Contains("'dp'") && Contains("\"dp=x\""));
}

TEST_CASE("a mesh spec with a zero size names the axis", "[errors]") {
  REQUIRE_THAT(error_of([] { Mesh::parse("dp=0"); }),
               Contains("Mesh::parse") && Contains("'dp'") && Contains("size 0") && Contains("\"dp=0\""));
}

TEST_CASE("a mesh spec naming an axis twice names the axis", "[errors]") {
  REQUIRE_THAT(error_of([] { Mesh::parse("dp=2,dp=2"); }),
               Contains("Mesh::parse") && Contains("duplicate") && Contains("'dp'") && Contains("\"dp=2,dp=2\""));
}

TEST_CASE("a mesh spec with name and size swapped is refused", "[errors]") {
  REQUIRE_THAT(error_of([] { Mesh::parse("2=dp"); }), Contains("Mesh::parse") && Contains("'2'") && Contains("not an identifier") && Contains("\"2=dp\""));
}

TEST_CASE("Mesh::axis_size of an unknown axis names the axis and the mesh", "[errors]") {
  Mesh mesh = Mesh::parse("dp=2,mp=4");
  REQUIRE_THAT(error_of([&] { mesh.axis_size("tp"); }), Contains("'tp'") && Contains("dp=2,mp=4"));
}

TEST_CASE("AxisRules naming one mesh axis twice for a tensor axis names both", "[errors]") {
  REQUIRE_THAT(error_of([] { AxisRules rules{{"batch", std::vector<std::string>{"dp", "dp"}}}; }),
               Contains("AxisRules") && Contains("'dp'") && Contains("'batch'"));
}

// --- sharding with axis rules ---

TEST_CASE("shard of an axis not divisible by its mesh axis names the axis, the sizes and the shape", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("dp=2");
  Tensor global = zeros(Shape{{"batch", 3}, {"embed", 4}});
  auto f = run_failing(rt, [&](Shard& s) { s.shard(global, {{"batch", "dp"}}); });
  REQUIRE_THAT(f.message, Contains("shard") && Contains("'batch'") && Contains("size 3") && Contains("dp") &&
                              Contains("[batch=3, embed=4]"));
  require_psum_works(rt);
}

TEST_CASE("shard with rules naming an unknown mesh axis names the rule, the mesh and the shape", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("dp=2");
  Tensor global = zeros(Shape{{"batch", 4}, {"embed", 4}});
  auto f = run_failing(rt, [&](Shard& s) { s.shard(global, {{"batch", "tp"}}); });
  REQUIRE_THAT(f.message, Contains("shard") && Contains("'tp'") && Contains("batch") && Contains("dp=2") &&
                              Contains("[batch=4, embed=4]"));
  require_psum_works(rt);
}

TEST_CASE("shard with one mesh axis cutting two tensor axes names both axes and the shape", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("dp=2");
  Tensor global = zeros(Shape{{"batch", 4}, {"embed", 4}});
  auto f = run_failing(rt, [&](Shard& s) { s.shard(global, {{"batch", "dp"}, {"embed", "dp"}}); });
  REQUIRE_THAT(f.message, Contains("shard") && Contains("'dp'") && Contains("'batch'") && Contains("'embed'") &&
                              Contains("[batch=4, embed=4]"));
  require_psum_works(rt);
}

TEST_CASE("shard of a per-device value names shard and the value", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("dp=2");
  auto f = run_failing(rt, [&](Shard& s) { s.shard(per_device(s), AxisRules{}); });
  REQUIRE_THAT(f.message, Contains("shard") && Contains("f32[i=4] varying{dp}"));
  require_psum_works(rt);
}

// --- vary-type rules of ops ---

TEST_CASE("add of a Split axis and the same axis whole names add, the axis, the mesh axis and both shapes",
          "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("dp=2");
  Tensor global = zeros(Shape{{"batch", 4}, {"i", 3}});
  auto f = run_failing(rt, [&](Shard& s) {
    Tensor x = s.shard(global, {{"batch", "dp"}});
    Tensor whole = zeros(Shape{{"batch", 2}, {"i", 3}});
    add(x, whole);
  });
  REQUIRE_THAT(f.message, Contains("add") && Contains("'batch'") && Contains("'dp'") &&
                              Contains("f32[batch=2|dp, i=3]") && Contains("f32[batch=2, i=3]"));
  require_psum_works(rt);
}

TEST_CASE("an op whose result cuts two tensor axes over one mesh axis names both axes", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("dp=2");
  auto f = run_failing(rt, [&](Shard& s) {
    Tensor x = s.shard(zeros(Shape{{"a", 4}}), {{"a", "dp"}});
    Tensor y = s.shard(zeros(Shape{{"b", 4}}), {{"b", "dp"}});
    mul(x, y);
  });
  REQUIRE_THAT(f.message, Contains("mul") && Contains("'a'") && Contains("'b'") && Contains("'dp'") &&
                              Contains("f32[a=2|dp]") && Contains("f32[b=2|dp]"));
  require_psum_works(rt);
}

TEST_CASE("merge_axes with a cut axis that is not the outermost names the axis, the mesh axis and the shape",
          "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("dp=2");
  auto f = run_failing(rt, [&](Shard& s) {
    Tensor x = s.shard(zeros(Shape{{"a", 2}, {"b", 4}}), {{"b", "dp"}});
    merge_axes(x, {"a", "b"}, "ab");
  });
  REQUIRE_THAT(f.message, Contains("merge_axes") && Contains("'b'") && Contains("'dp'") && Contains("f32[a=2, b=2|dp]"));
  require_psum_works(rt);
}

// --- collectives: vary types and arguments ---

TEST_CASE("psum over a mesh axis where the value is Invariant hints to multiply by axis_size", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard&) { psum(ones(Shape{{"i", 4}}), "mp"); });
  REQUIRE_THAT(f.message, Contains("psum") && Contains("'mp'") && Contains("f32[i=4]") && Contains("Invariant") &&
                              Contains("multiply by axis_size"));
  require_psum_works(rt);
}

TEST_CASE("pmax over a mesh axis where the value is Invariant names pmax and the value", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard&) { pmax(ones(Shape{{"i", 4}}), "mp"); });
  REQUIRE_THAT(f.message, Contains("pmax") && Contains("'mp'") && Contains("f32[i=4]") && Contains("Invariant"));
  require_psum_works(rt);
}

TEST_CASE("psum over a mesh axis that splits the value names the axis and hints all_gather or psum_scatter",
          "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard& s) { psum(s.shard(arange({"i", 4}), {{"i", "mp"}}), "mp"); });
  REQUIRE_THAT(f.message, Contains("psum") && Contains("'i'") && Contains("'mp'") && Contains("f32[i=2|mp]") &&
                              Contains("all_gather or psum_scatter"));
  require_psum_works(rt);
}

TEST_CASE("psum over an unknown mesh axis names the axis and the mesh", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("dp=2");
  auto f = run_failing(rt, [](Shard& s) { psum(per_device(s), "mp"); });
  REQUIRE_THAT(f.message, Contains("psum") && Contains("'mp'") && Contains("dp=2"));
  require_psum_works(rt);
}

TEST_CASE("pvary of a value that already varies names pvary, the mesh axis and the value", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard& s) { pvary(per_device(s), "mp"); });
  REQUIRE_THAT(f.message, Contains("pvary") && Contains("'mp'") && Contains("f32[i=4] varying{mp}"));
  require_psum_works(rt);
}

TEST_CASE("pvary of a Split value names pvary, the split axis and the value", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard& s) { pvary(s.shard(arange({"i", 4}), {{"i", "mp"}}), "mp"); });
  REQUIRE_THAT(f.message, Contains("pvary") && Contains("'mp'") && Contains("'i'") && Contains("f32[i=2|mp]"));
  require_psum_works(rt);
}

TEST_CASE("gather of a Varying value names gather, the mesh axis and the value", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("dp=2,mp=2");
  auto f = run_failing(rt, [](Shard& s) { s.gather(pvary(arange({"i", 4}), "mp")); });
  REQUIRE_THAT(f.message, Contains("gather") && Contains("'mp'") && Contains("f32[i=4] varying{mp}"));
  require_psum_works(rt);
}

TEST_CASE("psum_scatter of an axis not divisible by the group names the axis, the sizes and the value", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard& s) { psum_scatter(per_device(s, 3), "mp", "i"); });
  REQUIRE_THAT(f.message, Contains("psum_scatter") && Contains("'i'") && Contains("size 3") && Contains("mp") &&
                              Contains("f32[i=3] varying{mp}"));
  require_psum_works(rt);
}

TEST_CASE("psum_scatter of an Invariant value hints to multiply by axis_size", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard&) { psum_scatter(ones(Shape{{"i", 4}}), "mp", "i"); });
  REQUIRE_THAT(f.message, Contains("psum_scatter") && Contains("'mp'") && Contains("f32[i=4]") &&
                              Contains("multiply by axis_size"));
  require_psum_works(rt);
}

TEST_CASE("all_to_all with a split axis not divisible by the group names the axis, the sizes and the value",
          "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard& s) {
    all_to_all(pvary(zeros(Shape{{"a", 3}, {"b", 2}}), "mp") + 1.0 * s.device(), "mp", "a", "b");
  });
  REQUIRE_THAT(f.message, Contains("all_to_all") && Contains("'a'") && Contains("size 3") && Contains("mp") &&
                              Contains("f32[a=3, b=2]"));
  require_psum_works(rt);
}

TEST_CASE("all_to_all with an unknown concat axis names the axis and the shape", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard&) { all_to_all(pvary(zeros(Shape{{"a", 2}, {"b", 2}}), "mp"), "mp", "a", "c"); });
  REQUIRE_THAT(f.message, Contains("all_to_all") && Contains("'c'") && Contains("[a=2, b=2]"));
  require_psum_works(rt);
}

TEST_CASE("ppermute with a pair out of range names the pair, the mesh axis and the group size", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard& s) { ppermute(per_device(s), "mp", {{0, 1}, {1, 2}}); });
  REQUIRE_THAT(f.message, Contains("ppermute") && Contains("(1, 2)") && Contains("mp") && Contains("2 ranks") && Contains("f32[i=4]"));
  require_psum_works(rt);
}

TEST_CASE("ppermute with two pairs to one destination names the destination and the mesh axis", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard& s) { ppermute(per_device(s), "mp", {{0, 1}, {1, 1}}); });
  REQUIRE_THAT(f.message, Contains("ppermute") && Contains("rank 1 of the group over mp is the destination") && Contains("f32[i=4]") && Contains("mp"));
  require_psum_works(rt);
}

TEST_CASE("ppermute with two pairs from one source names the source and the mesh axis", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard& s) { ppermute(per_device(s), "mp", {{0, 0}, {0, 1}}); });
  REQUIRE_THAT(f.message, Contains("ppermute") && Contains("rank 0 of the group over mp is the source") && Contains("mp"));
  require_psum_works(rt);
}

// --- devices and the runtime ---

TEST_CASE("an op on tensors of two devices names the op, both devices and both shapes", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  Tensor captured;
  rt.run([&](Shard& s) {
    if (s.device() == 0) captured = arange({"i", 4});
  });
  auto f = run_failing(rt, [&](Shard& s) {
    if (s.device() == 1) add(captured, ones(Shape{{"i", 4}}));
  });
  REQUIRE_THAT(f.message, Contains("add") && Contains("cpu:0") && Contains("cpu:1") && Contains("f32[i=4]"));
  require_psum_works(rt);
}

TEST_CASE("an op on another device's tensor names the op, both devices and the shape", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  Tensor captured;
  rt.run([&](Shard& s) {
    if (s.device() == 0) captured = arange({"i", 4});
  });
  auto f = run_failing(rt, [&](Shard& s) {
    if (s.device() == 1) sum(captured, "i");
  });
  REQUIRE_THAT(f.message, Contains("sum") && Contains("cpu:0") && Contains("cpu:1") && Contains("f32[i=4]"));
  require_psum_works(rt);
}

TEST_CASE("psum outside Runtime::run names psum, Runtime::run and the mesh axis", "[errors]") {
  REQUIRE_THAT(error_of([] { psum(ones(Shape{{"i", 4}}), "mp"); }),
               Contains("psum") && Contains("Runtime::run") && Contains("mp"));
}

TEST_CASE("axis_index outside Runtime::run names axis_index and Runtime::run", "[errors]") {
  REQUIRE_THAT(error_of([] { axis_index("mp"); }), Contains("axis_index") && Contains("Runtime::run") && Contains("mp"));
}

TEST_CASE("a nested Runtime::run is refused and the runtime stays usable", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [&](Shard&) { rt.run([](Shard&) {}); });
  REQUIRE_THAT(f.message, Contains("Runtime::run") && Contains("nest"));
  REQUIRE(f.seconds < kFast);
  require_psum_works(rt);
}

// --- collectives across devices ---

TEST_CASE("psum on one device and pmax on another is a mismatch naming both calls", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard& s) {
    Tensor x = per_device(s);
    if (s.device() == 0) psum(x, "mp");
    else pmax(x, "mp");
  });
  REQUIRE_THAT(f.message, Contains("mismatch") && Contains("device 0") && Contains("psum(f32[i=4]") &&
                              Contains("device 1") && Contains("pmax(f32[i=4]") && Contains("mp"));
  REQUIRE(f.seconds < kFast);
  require_psum_works(rt);
}

TEST_CASE("psum of different sizes on two devices is a mismatch naming both shapes", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard& s) { psum(per_device(s, 4 + s.device()), "mp"); });
  REQUIRE_THAT(f.message, Contains("mismatch") && Contains("psum(f32[i=4]") && Contains("psum(f32[i=5]"));
  REQUIRE(f.seconds < kFast);
  require_psum_works(rt);
}

TEST_CASE("a psum whose peer returns late without calling it times out naming psum and NAX_COLLECTIVE_TIMEOUT_S",
          "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2", 0.5);
  std::atomic<double> raised_after{-1};
  const auto start = Clock::now();
  auto f = run_failing(rt, [&](Shard& s) {
    if (s.device() == 1) {
      std::this_thread::sleep_for(2s);
      return;
    }
    try {
      psum(per_device(s), "mp");
    } catch (...) {
      raised_after = seconds_since(start);
      throw;
    }
  });
  REQUIRE_THAT(f.message, Contains("psum(f32[i=4]") && Contains("timed out") && Contains("NAX_COLLECTIVE_TIMEOUT_S") &&
                              Contains("device 1"));
  REQUIRE(raised_after.load() >= 0.45);
  REQUIRE(raised_after.load() < 1.5);
  REQUIRE(f.seconds < 5);
  require_psum_works(rt);
}

TEST_CASE("a psum whose peer calls it after the timeout reports the timeout, not the release", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2", 0.5);
  auto f = run_failing(rt, [](Shard& s) {
    Tensor x = per_device(s);
    if (s.device() == 1) std::this_thread::sleep_for(2s);
    psum(x, "mp");
  });
  REQUIRE_THAT(f.message, Contains("psum(f32[i=4]") && Contains("timed out") && Contains("NAX_COLLECTIVE_TIMEOUT_S") &&
                              !Contains("released"));
  REQUIRE(f.seconds < 5);
  require_psum_works(rt);
}

TEST_CASE("psum over different mesh axes on different devices is a deadlock, reported at once", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("dp=2,mp=2");  // the default timeout: the deadlock is found without it
  auto f = run_failing(rt, [](Shard& s) {
    if (s.device() == 0) psum(per_device(s), "mp");
    else psum(per_device(s), {"dp", "mp"});
  });
  REQUIRE_THAT(f.message, Contains("psum(f32[i=4]") && Contains("deadlock") && Contains("device 0 waits for device 1") &&
                              !Contains("timed out"));
  REQUIRE(f.seconds < kFast);
  require_psum_works(rt);
}

TEST_CASE("two collectives in opposite orders on two devices are a deadlock, reported at once", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("a=2,b=1");  // groups (a) and (a,b) hold the same two devices
  auto f = run_failing(rt, [](Shard& s) {
    Tensor x = pvary(s.shard(ones(Shape{{"i", 4}}), {}), {"a", "b"});
    if (s.device() == 0) {
      psum(x, "a");
      psum(x, {"a", "b"});
    } else {
      psum(x, {"a", "b"});
      psum(x, "a");
    }
  });
  REQUIRE_THAT(f.message, Contains("deadlock") && Contains("different orders") && !Contains("timed out"));
  REQUIRE(f.seconds < kFast);
}

TEST_CASE("a device that finishes without joining its peers' psum fails them fast, naming it", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard& s) {
    if (s.device() == 0) psum(per_device(s), "mp");
  });
  REQUIRE_THAT(f.message, Contains("psum(f32[i=4]") && Contains("device 1") && Contains("finished") &&
                              !Contains("timed out"));
  REQUIRE(f.seconds < kFast);
  require_psum_works(rt);
}

TEST_CASE("a nax::Error on one device while the others wait in psum is rethrown as is, promptly", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("dp=2,mp=2");
  auto f = run_failing(rt, [](Shard& s) {
    Tensor x = per_device(s);
    if (s.device() == 3) {
      std::this_thread::sleep_for(100ms);
      sum(x, "nope");
    }
    psum(x, {"dp", "mp"});
  });
  REQUIRE_THAT(f.message, Contains("sum") && Contains("'nope'") && Contains("[i=4]") && !Contains("released") &&
                              !Contains("aborting"));
  REQUIRE(f.seconds < kFast);
  require_psum_works(rt);
}

TEST_CASE("a user exception on one device while the others wait in psum keeps its type and returns promptly",
          "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  const auto start = Clock::now();
  std::string message;
  try {
    rt.run([](Shard& s) {
      if (s.device() == 1) {
        std::this_thread::sleep_for(100ms);
        throw UserFailure("user code failed on device 1");
      }
      psum(per_device(s), "mp");
    });
    FAIL("rt.run returned normally");
  } catch (const UserFailure& e) {
    message = e.what();
  }
  REQUIRE(message == "user code failed on device 1");
  REQUIRE(seconds_since(start) < kFast);
  require_psum_works(rt);
}

TEST_CASE("the runtime survives many failing runs in a row", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("dp=2,mp=2");
  for (int round = 0; round < 3; ++round) {
    run_failing(rt, [](Shard& s) { psum(per_device(s, 4 + s.device()), "mp"); });
    run_failing(rt, [](Shard& s) {
      if (s.device() != 2) psum(per_device(s), {"dp", "mp"});
    });
    run_failing(rt, [](Shard& s) {
      if (s.device() == 0) throw Error("device 0 gives up");
      all_gather(per_device(s), "dp", "i");
      psum(per_device(s), "mp");
    });
    require_psum_works(rt);
  }
}

// --- call sites ---

TEST_CASE("two same-shaped psums issued in opposite orders are a mismatch naming both call sites", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard& s) {
    Tensor a = per_device(s), b = per_device(s);
    if (s.device() == 0) {
      psum(a, "mp");
      psum(b, "mp");
    } else {
      psum(b, "mp");  // the other one first: same shape, same dtype, another line
      psum(a, "mp");
    }
  });
  REQUIRE_THAT(f.message, Contains("mismatch") && Contains("tests/test_errors.cpp:") && Contains("device 0") && Contains("device 1"));
  REQUIRE(f.seconds < kFast);
  require_psum_works(rt);
}

TEST_CASE("a ppermute mismatch shows each device's own pairs", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard& s) {
    const std::vector<std::pair<int, int>> pairs =
        s.device() == 0 ? std::vector<std::pair<int, int>>{{0, 1}, {1, 0}} : std::vector<std::pair<int, int>>{{0, 1}};
    ppermute(per_device(s), "mp", pairs);
  });
  REQUIRE_THAT(f.message, Contains("mismatch") && Contains("pairs [(0, 1) (1, 0)]") && Contains("pairs [(0, 1)]"));
  require_psum_works(rt);
}

TEST_CASE("a mismatch in a collective's backward is labelled as the backward of the user's call", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard& s) {
    Tensor x = per_device(s, 4);
    x = parameter(x);
    Tensor gathered = all_gather(x, "mp", "i");  // backward: a psum_scatter of the gradient
    // Device 1's loss skips the gathered value: its backward never joins device 0's psum_scatter.
    Tensor loss = s.device() == 0 ? sum(gathered, "i") : sum(x, "i");
    grad(loss, {x}, {.allow_varying_loss = true});
  });
  REQUIRE_THAT(f.message, Contains("psum_scatter") && Contains("backward of all_gather") && Contains("tests/test_errors.cpp:"));
  require_psum_works(rt);
}

TEST_CASE("pmean of an Invariant value reports pmean, not psum", "[errors]") {
  Watchdog guard(kHang);
  Runtime rt = local_runtime("mp=2");
  auto f = run_failing(rt, [](Shard&) { pmean(ones(Shape{{"i", 4}}), "mp"); });
  REQUIRE_THAT(f.message, Contains("pmean") && Contains("Invariant") && Contains("mp"));
  REQUIRE_THAT(f.message, !Contains("psum:"));
}
