// Autodiff: every op of ops.h and every collective against central finite differences in f64
// (random inputs from fixed seeds, printed on failure), on the host and on meshes of 1, 2 and
// 4 devices, 1-D and 2-D; and the tape's behaviour (no_grad, stop_gradient, freeing, errors).
#include "grad_check.h"

using namespace nax;
using nax::testing::check_gradients;
using nax::testing::check_mesh_gradients;
using nax::testing::invariant_total;
using nax::testing::random_input;
using nax::testing::weighted_sum;
using Catch::Matchers::Contains;

namespace {
const Shape kAB{{"a", 3}, {"b", 4}};
const Shape kB{{"b", 4}};
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
}  // namespace

TEST_CASE("gradients of elementwise ops with broadcasting", "[grad][ops]") {
  Tensor x = random_input(kAB, "x"), y = random_input(kB, "y");
  Tensor pos = abs(random_input(kAB, "p")) + 0.5, pos_b = abs(random_input(kB, "q")) + 0.5;
  const std::vector<std::pair<const char*, Fn>> binary = {
      {"add", [](auto& p) { return weighted_sum(p[0] + p[1]); }},
      {"sub", [](auto& p) { return weighted_sum(p[1] - p[0]); }},
      {"mul", [](auto& p) { return weighted_sum(p[0] * p[1]); }},
      {"maximum", [](auto& p) { return weighted_sum(maximum(p[0], p[1])); }},
      {"minimum", [](auto& p) { return weighted_sum(minimum(p[0], p[1])); }},
      {"scalars", [](auto& p) { return weighted_sum((2.0 - p[0]) * 3.0 + p[1] / 4.0); }},
  };
  for (const auto& [name, f] : binary) {
    INFO(name);
    check_gradients(f, {x, y});
  }
  check_gradients([](auto& p) { return weighted_sum(p[0] / p[1]); }, {x, pos_b});
  check_gradients([](auto& p) { return weighted_sum(pow(p[0], p[1])); }, {pos, y});
}

TEST_CASE("gradients of unary ops", "[grad][ops]") {
  Tensor x = random_input(kAB, "x"), pos = abs(random_input(kAB, "p")) + 0.5;
  check_gradients([](auto& p) { return weighted_sum(-p[0] + abs(p[0]) + exp(p[0]) + tanh(p[0]) + square(p[0])); }, {x});
  check_gradients([](auto& p) { return weighted_sum(log(p[0]) + sqrt(p[0]) + rsqrt(p[0])); }, {pos});
}

TEST_CASE("gradients of dot for every layout class", "[grad][ops]") {
  Tensor q = random_input(Shape{{"b", 2}, {"s", 3}, {"h", 2}, {"d", 4}}, "q");
  Tensor k = random_input(Shape{{"h", 2}, {"d", 4}, {"t", 3}, {"b", 2}}, "k");
  Tensor w = random_input(Shape{{"d", 4}, {"e", 3}}, "w");
  Tensor w2 = random_input(Shape{{"h", 2}, {"d", 4}, {"e", 3}}, "w2");
  check_gradients([](auto& p) { return weighted_sum(dot(p[0], p[1], "d")); }, {q, k});
  check_gradients([](auto& p) { return weighted_sum(dot(p[0], p[1], "d")); }, {q, w});
  check_gradients([](auto& p) { return weighted_sum(dot(p[0], p[1], {"h", "d"})); }, {q, w2});
  check_gradients([](auto& p) { return weighted_sum(dot(p[0], p[0], {"s", "h", "d"})); }, {q});  // a Gram matrix
}

TEST_CASE("gradients of reductions", "[grad][ops]") {
  Tensor x = random_input(Shape{{"a", 3}, {"b", 4}, {"c", 2}}, "x");
  check_gradients([](auto& p) { return weighted_sum(sum(p[0], "b")) + weighted_sum(mean(p[0], {"a", "c"})); }, {x});
  check_gradients([](auto& p) { return weighted_sum(max(p[0], "b")) + weighted_sum(min(p[0], {"a", "c"})); }, {x});
}

TEST_CASE("max shares its gradient among tied elements", "[grad][ops]") {
  Tensor x = from_vector(Shape{{"i", 4}}, std::vector<double>{1, 3, 3, 2});
  auto [value, grads] = value_and_grad([](auto& p) { return max(p[0], "i"); }, {x});
  REQUIRE(value.item() == 3);
  REQUIRE(grads[0].to_vector<double>() == std::vector<double>{0, 0.5, 0.5, 0});
}

TEST_CASE("gradients of layout ops", "[grad][ops]") {
  Tensor x = random_input(Shape{{"a", 2}, {"b", 6}}, "x"), y = random_input(Shape{{"b", 6}, {"a", 3}}, "y");
  check_gradients([](auto& p) { return weighted_sum(transpose(rename(p[0], "a", "z"), {"b", "z"})); }, {x});
  check_gradients([](auto& p) { return weighted_sum(merge_axes(split_axis(p[0], "b", {{"c", 2}, {"d", 3}}), {"d", "a"}, "m")); }, {x});
  check_gradients([](auto& p) { return weighted_sum(slice(p[0], "b", 1, 4)) + weighted_sum(slice(p[0], "a", 0, 1)); }, {x});
  check_gradients([](auto& p) { return weighted_sum(concat({p[0], p[1]}, "a")); }, {x, y});
  check_gradients([](auto& p) { return weighted_sum(cast(cast(p[0], DType::f32), DType::f64)); }, {x}, {.eps = 1e-3, .tolerance = 1e-4});
}

TEST_CASE("the gradient through a cast to bf16 reaches the f32 parameter as f32, summed over dp", "[grad][mesh]") {
  // Mixed precision's pattern: an f32 parameter (Invariant over dp) cast to bf16 and used with
  // data cut over dp. The values are multiples of 1/4 below 8, so every bf16 product and sum is exact.
  std::vector<double> xs;
  for (int i = 0; i < 12; ++i) xs.push_back(0.25 * (i - 5));
  const Tensor x_host = from_vector(Shape{{"batch", 4}, {"embed", 3}}, xs, DType::f32);
  const Tensor w_host = from_vector(Shape{{"embed", 3}}, std::vector<double>{0.5, -1.0, 2.0}, DType::f32);
  std::vector<double> want(3, 0.0);  // d/dw of sum(x * w): the column sums of x
  for (std::size_t i = 0; i < xs.size(); ++i) want[i % 3] += xs[i];
  Runtime rt = Runtime::local(Mesh::parse("dp=2"));
  const AxisRules rules{{"batch", "dp"}};
  Tensor got;
  rt.run([&](Shard& s) {
    const Tensor w = parameter(s.shard(w_host, rules)), x = s.shard(x_host, rules);
    const Tensor y = cast(cast(w, DType::bf16) * cast(x, DType::bf16), DType::f32);
    const Tensor g = grad(psum(sum(y, {"batch", "embed"}), "dp"), {w})[0];
    NAX_EXPECT(g.vary() == w.vary());
    const Tensor host = s.gather(g);
    if (s.device() == 0) got = host;
  });
  REQUIRE(got.dtype() == DType::f32);
  REQUIRE(got.to_vector<double>() == want);
}

TEST_CASE("a value used many times accumulates its gradient", "[grad][ops]") {
  Tensor x = random_input(kB, "x");
  check_gradients([](auto& p) { return weighted_sum(p[0] * p[0] * p[0] + tanh(p[0]) * p[0]); }, {x});
}

namespace {

// A device-dependent value built from a parameter, so that collectives see a Varying input.
Tensor spread(const Tensor& x, const std::vector<std::string>& axes) {
  return x * (cast(axis_index(axes), DType::f64) + 1.0);
}

std::vector<std::string> meshes_for_grad() { return {"mp=1", "mp=2", "mp=4", "dp=2,mp=2"}; }

std::vector<std::vector<std::string>> grad_groups(const Mesh& mesh) {
  std::vector<std::vector<std::string>> out{{"mp"}};
  if (mesh.has("dp")) out.push_back({"dp", "mp"});
  return out;
}

Tensor weighted_block(Shard& s, const Tensor& y, const AxisRules& rules) {
  // sum(y * w) with w the matching block of a fixed global weight tensor.
  Shape global = y.shape();
  std::vector<Axis> axes;
  for (const auto& a : y.shape().axes()) {
    std::int64_t parts = 1;
    for (const auto& m : y.vary().split_mesh_axes(a.name)) parts *= s.mesh().axis_size(m);
    axes.push_back({a.name, a.size * parts});
  }
  Tensor w = s.random_normal(Shape(axes), rules, 7, "weights", 1.0, y.dtype());
  return sum(y * w, y.shape().names());
}

}  // namespace

TEST_CASE("gradients through psum, pmean, pvary and the implicit pvary", "[grad][mesh][collectives]") {
  for (const auto& spec : meshes_for_grad()) {
    Runtime rt = Runtime::local(Mesh::parse(spec));
    for (const auto& axes : grad_groups(rt.mesh())) {
      INFO("mesh " << spec << " over " << Names(axes).str());
      Tensor x = random_input(kAB, "x"), w = random_input(kB, "w");
      check_mesh_gradients(rt, [&](Shard&, const std::vector<Tensor>& p) {
        Tensor v = spread(p[0], axes) * p[1];           // Invariant p[1] meets a Varying value
        return invariant_total(weighted_sum(psum(v, axes) + pmean(tanh(v), axes)));
      }, {x, w}, {});
      check_mesh_gradients(rt, [&](Shard&, const std::vector<Tensor>& p) {
        return invariant_total(weighted_sum(pvary(p[0], axes) * spread(p[1], axes)));
      }, {x, w}, {});
    }
  }
}

TEST_CASE("gradients through all_gather, all_gather_invariant and psum_scatter", "[grad][mesh][collectives]") {
  for (const auto& spec : meshes_for_grad()) {
    Runtime rt = Runtime::local(Mesh::parse(spec));
    for (const auto& axes : grad_groups(rt.mesh())) {
      INFO("mesh " << spec << " over " << Names(axes).str());
      const int n = rt.mesh().group_size(axes);
      AxisRules rules{{"b", axes}};
      Tensor x = random_input(Shape{{"a", 2}, {"b", 2 * n}}, "x");
      check_mesh_gradients(rt, [&](Shard&, const std::vector<Tensor>& p) {
        return invariant_total(weighted_sum(all_gather(spread(p[0], axes), axes, "b")));
      }, {x}, rules);
      check_mesh_gradients(rt, [&](Shard&, const std::vector<Tensor>& p) {
        return invariant_total(weighted_sum(tanh(all_gather_invariant(p[0], axes, "b"))));
      }, {x}, rules);
      check_mesh_gradients(rt, [&](Shard&, const std::vector<Tensor>& p) {
        return invariant_total(weighted_sum(all_gather_stacked(spread(p[0], axes), axes, "stacked")));
      }, {x}, rules);
      check_mesh_gradients(rt, [&](Shard& s, const std::vector<Tensor>& p) {
        Tensor whole = all_gather_invariant(p[0], axes, "b");  // Invariant, then a partial value
        Tensor y = psum_scatter(spread(whole, axes), axes, "b");
        return invariant_total(weighted_block(s, y, rules));
      }, {x}, rules);
    }
  }
}

TEST_CASE("FSDP: a gathered parameter used on a cut batch gets its gradient reduce-scattered, not all-reduced", "[grad][mesh][collectives]") {
  for (const char* spec : {"x=2", "x=4", "d=2,x=2"}) {
    INFO("mesh " << spec);
    Runtime rt = Runtime::local(Mesh::parse(spec));
    AxisRules rules{{"e", "x"}, {"b", "x"}};
    if (rt.mesh().has("d")) rules.set("b", {"d", "x"});
    const std::vector<Tensor> globals = {random_input(Shape{{"e", 8}, {"f", 3}}, "w"), random_input(Shape{{"b", 8}, {"k", 8}}, "batch")};
    auto loss = [](Shard& s, const std::vector<Tensor>& p) {
      const Tensor w = all_gather_invariant(p[0], "x", "e");  // whole on every device
      const Tensor y = tanh(dot(rename(p[1], "k", "e"), w, "e"));  // this device's rows of the batch
      return psum(sum(y * y, {"b", "f"}), s.mesh().axis_names());
    };
    check_mesh_gradients(rt, loss, globals, rules);
    const CommStats used = rt.run([&](Shard& s) {  // over x, in one forward and backward
      const Tensor w = parameter(s.shard(globals[0], rules)), batch = s.shard(globals[1], rules);
      const auto before = s.comm_stats();
      const Tensor g = grad(loss(s, {w, batch}), {w})[0];
      NAX_EXPECT(g.vary() == w.vary());  // cut as the parameter is
      return s.comm_stats_since(before)["x"];
    })[0];
    CHECK(used.calls[static_cast<std::size_t>(CollectiveKind::all_gather)] == 1);
    CHECK(used.calls[static_cast<std::size_t>(CollectiveKind::reduce_scatter)] == 1);
    CHECK(used.calls[static_cast<std::size_t>(CollectiveKind::all_reduce)] == (rt.mesh().has("d") ? 0u : 1u));  // the loss's psum
  }
}

TEST_CASE("gradients through ppermute and all_to_all", "[grad][mesh][collectives]") {
  for (const auto& spec : meshes_for_grad()) {
    Runtime rt = Runtime::local(Mesh::parse(spec));
    for (const auto& axes : grad_groups(rt.mesh())) {
      INFO("mesh " << spec << " over " << Names(axes).str());
      const int n = rt.mesh().group_size(axes);
      std::vector<std::pair<int, int>> shift;
      for (int r = 0; r + 1 < n; ++r) shift.push_back({r, r + 1});  // rank 0 receives zeros
      Tensor x = random_input(Shape{{"a", 2}, {"b", 2 * n}}, "x");
      check_mesh_gradients(rt, [&](Shard&, const std::vector<Tensor>& p) {
        return invariant_total(weighted_sum(ppermute(spread(p[0], axes), axes, shift)));
      }, {x}, {});
      AxisRules by_b{{"b", axes}};
      Tensor y = random_input(Shape{{"a", 2 * n}, {"b", 2 * n}}, "y");
      check_mesh_gradients(rt, [&](Shard& s, const std::vector<Tensor>& p) {
        Tensor moved = all_to_all(p[0], axes, "a", "b");  // Split(b) -> Split(a)
        return invariant_total(weighted_block(s, tanh(moved), AxisRules{{"a", axes}}));
      }, {y}, by_b);
    }
  }
}

TEST_CASE("a replicated activation feeding split weights gets its gradient reduced once", "[grad][mesh]") {
  // Megatron's MLP: x Invariant over mp, w_in cut on mlp (column-parallel), w_out cut on mlp (row).
  for (const auto& spec : meshes_for_grad()) {
    Runtime rt = Runtime::local(Mesh::parse(spec));
    AxisRules rules{{"mlp", "mp"}};
    Tensor x = random_input(Shape{{"batch", 2}, {"embed", 3}}, "x");
    Tensor w_in = random_input(Shape{{"embed", 3}, {"mlp", 4}}, "w_in");
    Tensor w_out = random_input(Shape{{"mlp", 4}, {"embed", 3}}, "w_out");
    check_mesh_gradients(rt, [&](Shard&, const std::vector<Tensor>& p) {
      Tensor h = tanh(dot(p[0], p[1], "embed"));
      Tensor y = psum(dot(h, p[2], "mlp"), "mp");
      return invariant_total(weighted_sum(tanh(y) + p[0]));
    }, {x, w_in, w_out}, rules);
  }
}

TEST_CASE("the tensor-parallel MLP all-reduces once forward, once backward, plus the dp gradient sums", "[grad][mesh]") {
  // mp only: the forward psum, and the psum of x's gradient (x is replicated over mp: the implicit
  // pvary where it meets the split w_in). With dp too, the weights' gradients are summed over dp,
  // both in one all-reduce (grad buckets the parameters' pending sums by mesh axes).
  for (auto [spec, expected] : {std::pair<std::string, std::size_t>{"mp=2", 2}, {"dp=2,mp=2", 3}}) {
    Runtime rt = Runtime::local(Mesh::parse(spec));
    AxisRules rules{{"mlp", "mp"}};
    if (rt.mesh().has("dp")) rules.set("batch", {"dp"});
    rt.run([&](Shard& s) {
      Tensor x = parameter(s.random_normal(Shape{{"batch", 4}, {"embed", 3}}, rules, 1, "x"));
      Tensor w_in = parameter(s.random_normal(Shape{{"embed", 3}, {"mlp", 4}}, rules, 1, "w_in"));
      Tensor w_out = parameter(s.random_normal(Shape{{"mlp", 4}, {"embed", 3}}, rules, 1, "w_out"));
      Tensor y = psum(dot(tanh(dot(x, w_in, "embed")), w_out, "mlp"), "mp");
      // A per-device loss on purpose: the count is of the weights' dp sums alone.
      auto grads = grad(sum(y * x, {"batch", "embed"}), {x, w_in, w_out}, {.allow_varying_loss = true});
      NAX_EXPECT(grads[0].vary() == x.vary());
      NAX_EXPECT(grads[1].vary().split_mesh_axes("mlp") == std::vector<std::string>{"mp"});
      NAX_EXPECT(grads[2].vary() == w_out.vary());
    });
    INFO("mesh " << spec);
    REQUIRE(rt.comm_stats(0).calls[static_cast<int>(CollectiveKind::all_reduce)] == expected);
  }
}

TEST_CASE("stop_gradient and NoGrad cut the graph", "[grad]") {
  Tensor x = parameter(random_input(kB, "x"));
  Tensor y = sum(x * stop_gradient(x), "b");
  REQUIRE(nax::testing::max_rel_error(grad(y, {x})[0].to_vector<double>(), stop_gradient(x).to_vector<double>()) < 1e-15);
  {
    NoGrad no_grad;
    REQUIRE_FALSE(sum(x * x, "b").requires_grad());
  }
  REQUIRE(sum(x * x, "b").requires_grad());
  Tensor unused = parameter(random_input(kB, "u"));
  auto grads = grad(sum(x, "b"), {x, unused});
  REQUIRE(grads[1].to_vector<double>() == std::vector<double>(4, 0.0));
}

TEST_CASE("autodiff errors name the op", "[grad][errors]") {
  Tensor x = parameter(random_input(kB, "x"));
  REQUIRE_THROWS_WITH(grad(x * 2.0, {x}), Contains("grad") && Contains("scalar") && Contains("b=4"));
  REQUIRE_THROWS_WITH(grad(sum(random_input(kB, "c"), "b"), {x}), Contains("does not depend on any parameter"));
  REQUIRE_THROWS_WITH(grad(sum(x, "b"), {random_input(kB, "d")}), Contains("params[0]") && Contains("takes no gradient"));
  Tensor loss = sum(x * x, "b");
  grad(loss, {x});
  REQUIRE_THROWS_WITH(grad(loss, {x}), Contains("already used"));

  Runtime rt = Runtime::local(Mesh::parse("mp=2"));
  REQUIRE_THROWS_WITH(rt.run([](Shard& s) {
    Tensor p = parameter(s.shard(random_normal(kB, 1, "p", 1.0, DType::f64), {}));
    grad(sum(pmax(spread(p, {"mp"}), "mp"), "b"), {p});
  }), Contains("pmax") && Contains("not differentiable") && Contains("stop_gradient"));
}

TEST_CASE("the graph keeps only what a backward reads: a value only added, summed or sliced is freed", "[grad][memory]") {
  // x * w keeps x and w (mul's rule reads both); a = x * w is then read by add, sum and slice, whose
  // rules need its shape only, and by nothing else: once the program lets go of `a`, its bytes go,
  // though the graph from the loss still runs through it. tanh keeps its output, so b's stay.
  Runtime rt = Runtime::local(Mesh::parse("x=1"));
  const Shape shape{{"batch", 64}, {"embed", 1024}};
  const std::size_t one = 64 * 1024 * sizeof(float);
  const auto kept = rt.run([&](Shard& s) {
    Tensor x = parameter(random_normal(shape, 1, "x")), w = parameter(random_normal(shape, 2, "w"));
    const std::size_t before = s.memory().bytes_in_use;
    Tensor loss;
    {
      Tensor a = x * w;
      Tensor b = tanh(a + 1.0);
      loss = sum(slice(a, "batch", 0, 32), {"batch", "embed"}) + sum(b, {"batch", "embed"});
    }
    const std::size_t held = s.memory().bytes_in_use - before;
    const auto grads = grad(loss, {x, w});
    // d/dx = w (1 + (1 - tanh^2)): read against the host's values
    const auto gx = grads[0].to_vector<double>(), xs = x.to_vector<double>(), ws = w.to_vector<double>();
    for (std::size_t i = 0; i < gx.size(); ++i) {
      const double t = std::tanh(xs[i] * ws[i] + 1.0), slice_part = i < gx.size() / 2 ? 1.0 : 0.0;
      NAX_EXPECT(std::abs(gx[i] - ws[i] * (slice_part + 1.0 - t * t)) <= 1e-5 * (1.0 + std::abs(gx[i])));
    }
    return held;
  })[0];
  INFO("held after the forward: " << kept << " B; one value is " << one << " B");
  REQUIRE(kept >= one);       // tanh's output
  REQUIRE(kept < 2 * one);    // and not a, a + 1.0 or the slice
}

TEST_CASE("memory after many training steps equals memory after one", "[grad][mesh][memory]") {
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  AxisRules rules{{"batch", "dp"}, {"mlp", "mp"}};
  Tensor data = random_normal(Shape{{"batch", 8}, {"embed", 16}}, 1, "data");
  auto step = [&](Shard& s) {
    Tensor w_in = parameter(s.random_normal(Shape{{"embed", 16}, {"mlp", 32}}, rules, 2, "w_in", 0.1));
    Tensor w_out = parameter(s.random_normal(Shape{{"mlp", 32}, {"embed", 16}}, rules, 3, "w_out", 0.1));
    Tensor x = s.shard(data, rules);
    Tensor y = psum(dot(tanh(dot(x, w_in, "embed")), w_out, "mlp"), "mp");
    Tensor loss = pmean(mean(square(y - x), {"batch", "embed"}), "dp");
    auto grads = grad(loss, {w_in, w_out});
    return loss.item() + grads[0].to_vector<double>()[0];
  };
  rt.run(step);
  std::vector<AllocatorStats> after_one;
  for (int d = 0; d < 4; ++d) after_one.push_back(rt.memory(d));
  for (int i = 0; i < 10; ++i) rt.run(step);
  for (int d = 0; d < 4; ++d) {
    REQUIRE(rt.memory(d).bytes_in_use == 0);
    REQUIRE(rt.memory(d).bytes_reserved == after_one[static_cast<std::size_t>(d)].bytes_reserved);
    REQUIRE(rt.memory(d).peak_bytes_in_use == after_one[static_cast<std::size_t>(d)].peak_bytes_in_use);
  }
}

namespace {

// The spans device 0 opens, in order: which ops ran after a bucket's psum had started.
struct SpanOrder final : trace::Observer {
  std::vector<std::string> spans;  // "category name"
  void opened(std::string_view category, std::string_view name) override { spans.push_back(fmt::format("{} {}", category, name)); }
  void closed() override {}
  void made(const Tensor&) override {}
  void filled_later() override {}
  void terms_kept(const Tensor&, const std::vector<Tensor>&) override {}
};

struct Bucketed {
  std::vector<std::vector<double>> grads;
  std::size_t storages = 0;  // distinct storages the four gradients live in (device 0)
  std::size_t all_reduces = 0;  // over dp, device 0
  std::vector<std::string> spans;
};

// Four tanh layers on a batch cut over dp=2, the weights replicated: their gradients are summed
// over dp, with the given bucket size.
Bucketed four_layers(std::size_t bucket_bytes) {
  Runtime rt = Runtime::local(Mesh::parse("dp=2"));
  const CommStats before = rt.comm_stats_by_axes(0)["dp"];
  Bucketed out;
  SpanOrder order;
  auto results = rt.run([&](Shard& s) {
    std::vector<Tensor> w;
    for (int i = 0; i < 4; ++i)
      w.push_back(parameter(s.random_normal(Shape{{"in", 16}, {"out", 16}}, {}, 1, fmt::format("w{}", i), 0.3, DType::f64)));
    Tensor h = s.random_normal(Shape{{"batch", 8}, {"in", 16}}, {{"batch", "dp"}}, 2, "x", 1.0, DType::f64);
    for (const auto& wi : w) h = rename(tanh(dot(h, wi, "in")), "out", "in");
    const Tensor loss = pmean(mean(sum(h * h, {"in"}), {"batch"}), "dp");
    if (s.device() == 0) trace::set_thread_observer(&order);
    const auto grads = grad(loss, w, {.allow_varying_loss = false, .bucket_bytes = bucket_bytes});
    if (s.device() == 0) trace::set_thread_observer(nullptr);
    std::vector<std::vector<double>> values;
    for (const auto& g : grads) values.push_back(g.to_vector<double>());
    std::size_t storages = 0;
    for (std::size_t i = 0; i < grads.size(); ++i)
      storages += std::none_of(grads.begin(), grads.begin() + static_cast<std::ptrdiff_t>(i), [&](const Tensor& o) { return o.same_storage(grads[i]); });
    values.push_back({static_cast<double>(storages)});
    return values;
  });
  out.storages = static_cast<std::size_t>(results[0].back()[0]);
  results[0].pop_back();
  out.grads = results[0];
  out.all_reduces = (rt.comm_stats_by_axes(0)["dp"] - before).calls[static_cast<std::size_t>(CollectiveKind::all_reduce)];
  out.spans = order.spans;
  return out;
}

}  // namespace

TEST_CASE("gradient buckets: each bucket's psum starts once the backward has used its parameters, overlapping the rest (DDP), "
          "with the same gradients", "[grad][mesh][overlap]") {
  const Bucketed at_end = four_layers(0), apart = four_layers(1), pairs = four_layers(2 * 16 * 16 * 8);
  // all-reduces over dp: the loss's pmean, then the gradients' buckets
  REQUIRE(at_end.all_reduces == 1 + 1);  // one bucket of the four, summed after the walk
  REQUIRE(apart.all_reduces == 1 + 4);   // each weight in a bucket of its own
  REQUIRE(pairs.all_reduces == 1 + 2);
  REQUIRE(apart.grads == at_end.grads);  // each element summed over the same ranks in the same order
  // A summed bucket hands its gradients out as pieces of itself, summed in place: no copy out.
  REQUIRE(at_end.storages == 1);
  REQUIRE(pairs.storages == 2);
  REQUIRE(apart.storages == 4);
  REQUIRE(pairs.grads == at_end.grads);
  // The last layer's weight is complete first: its psum starts while the backward of the layers
  // below still runs (their products come after the first psum), and each is waited for at the end.
  auto dots_after_first_psum = [](const std::vector<std::string>& spans) {
    const auto first = std::find(spans.begin(), spans.end(), "collective psum");
    return std::count(first, spans.end(), "op dot");
  };
  REQUIRE(dots_after_first_psum(apart.spans) == 5);  // two per layer below the last, one (dh unused) for the first
  REQUIRE(std::count(apart.spans.begin(), apart.spans.end(), "collective complete a started collective") == 4);
  REQUIRE(dots_after_first_psum(at_end.spans) == 0);
  REQUIRE(std::count(at_end.spans.begin(), at_end.spans.end(), "collective complete a started collective") == 0);
}
