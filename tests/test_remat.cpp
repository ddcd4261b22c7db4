// Activation checkpointing (nax::remat): gradients with and without it agree to rounding (f64,
// element by element) through layers with collectives on meshes 1x1, 1x2 and 2x2, nested or not,
// arguments or captured parameters alike; it lowers the peak memory of a deep chain; a function
// that computes something else when recomputed is an error naming remat.
#include "helpers.h"

using namespace nax;
using Catch::Matchers::Contains;

namespace {

const Shape kInput{{"batch", 4}, {"seq", 3}, {"embed", 8}};
const AxisRules kRules{{"batch", "dp"}, {"mlp", "mp"}};

struct Layer {
  Tensor w_in, w_out;
};

// A tensor-parallel MLP with a residual: the mp sum as psum on odd layers, as psum_scatter then
// all_gather_invariant on even ones (so that their transposes run in the recompute too).
Tensor layer(const Layer& p, const Tensor& x, int i) {
  const Tensor partial = dot(tanh(dot(x, p.w_in, "embed")), p.w_out, "mlp");
  const Tensor summed = i % 2 == 1 ? psum(partial, "mp") : all_gather_invariant(psum_scatter(partial, "mp", "embed"), "mp", "embed");
  return x + summed;
}

enum class Mode { plain, per_layer, nested, arguments };

// The layers one after another, checkpointed as `mode` says: each layer (its parameters captured
// by value), pairs of checkpointed layers checkpointed again, or each layer with its parameters
// passed as arguments.
Tensor chain(const std::vector<Layer>& layers, Tensor x, Mode mode) {
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const Layer p = layers[i];
    const int n = static_cast<int>(i);
    switch (mode) {
      case Mode::plain: x = layer(p, x, n); break;
      case Mode::per_layer: x = remat([p, n](const Tensor& h) { return layer(p, h, n); }, x); break;
      case Mode::arguments:
        x = remat([n](const std::vector<Tensor>& in) { return layer({in[1], in[2]}, in[0], n); }, {x, p.w_in, p.w_out});
        break;
      case Mode::nested:
        if (i + 1 < layers.size()) {
          const Layer q = layers[i + 1];
          x = remat([p, q, n](const Tensor& h) {
            const Tensor a = remat([p, n](const Tensor& t) { return layer(p, t, n); }, h);
            return remat([q, n](const Tensor& t) { return layer(q, t, n + 1); }, a);
          }, x);
          ++i;
        } else {
          x = remat([p, n](const Tensor& h) { return layer(p, h, n); }, x);
        }
        break;
    }
  }
  return x;
}

struct Result {
  std::vector<std::vector<double>> grads;  // every device's gradients of the input and each weight, in order
  AllocatorStats memory;                    // device 0's
};

Result run_chain(const std::string& mesh, Mode mode, int n_layers, std::int64_t mlp, const Shape& input) {
  Runtime rt = Runtime::local(Mesh::parse(mesh));
  auto per_device = rt.run([&](Shard& s) {
    std::vector<Layer> layers;
    std::vector<Tensor> params{parameter(s.random_normal(input, kRules, 1, "x", 1.0, DType::f64))};
    for (int i = 0; i < n_layers; ++i) {
      const std::string name = std::to_string(i);
      Layer l{parameter(s.random_normal(Shape{{"embed", 8}, {"mlp", mlp}}, kRules, 2, "w_in" + name, 0.4, DType::f64)),
              parameter(s.random_normal(Shape{{"mlp", mlp}, {"embed", 8}}, kRules, 3, "w_out" + name, 0.4, DType::f64))};
      params.push_back(l.w_in), params.push_back(l.w_out);
      layers.push_back(l);
    }
    const Tensor y = chain(layers, params[0], mode);
    const Tensor w = s.random_normal(input, kRules, 4, "w", 1.0, DType::f64);
    Tensor loss = sum(y * w, input.names());
    if (rt.mesh().has("dp")) loss = psum(loss, "dp");
    std::vector<std::vector<double>> out;
    for (const auto& g : grad(loss, params)) out.push_back(g.to_vector<double>());
    return out;
  });
  Result r{{}, rt.memory(0)};
  for (auto& device : per_device) r.grads.insert(r.grads.end(), device.begin(), device.end());
  return r;
}

}  // namespace

TEST_CASE("remat gives the gradients of the function it wraps, through collectives, on meshes 1x1, 1x2, 2x2", "[grad][remat][mesh]") {
  for (const std::string mesh : {"dp=1,mp=1", "dp=1,mp=2", "dp=2,mp=2"}) {
    const Result plain = run_chain(mesh, Mode::plain, 5, 16, kInput);
    for (Mode mode : {Mode::per_layer, Mode::nested, Mode::arguments}) {
      INFO("mesh " << mesh << " mode " << static_cast<int>(mode));
      const Result checkpointed = run_chain(mesh, mode, 5, 16, kInput);
      REQUIRE(checkpointed.grads.size() == plain.grads.size());
      for (std::size_t i = 0; i < plain.grads.size(); ++i) {
        INFO("gradient " << i);
        nax::testing::require_close(checkpointed.grads[i], plain.grads[i], 1e-12);
      }
    }
  }
}

TEST_CASE("remat keeps a deep chain's activations out of the peak memory", "[grad][remat][memory]") {
  const Shape wide{{"batch", 64}, {"seq", 16}, {"embed", 8}};
  const Result plain = run_chain("dp=1,mp=1", Mode::plain, 8, 64, wide);
  const Result checkpointed = run_chain("dp=1,mp=1", Mode::per_layer, 8, 64, wide);
  // Plain keeps each layer's hidden activations ([1024, 64] f64, 512 KiB, several per layer) for
  // backward; checkpointed keeps the layer inputs ([1024, 8]) and one layer's activations at a time.
  INFO("peak bytes plain " << plain.memory.peak_bytes_in_use << ", checkpointed " << checkpointed.memory.peak_bytes_in_use);
  REQUIRE(checkpointed.memory.peak_bytes_in_use * 2 < plain.memory.peak_bytes_in_use);
}

TEST_CASE("remat under NoGrad is the function; a function that changes on recompute is an error", "[grad][remat][errors]") {
  Tensor w = parameter(full(Shape{{"embed", 3}}, 2.0, DType::f64));
  {
    NoGrad no_grad;
    const Tensor y = remat([w](const Tensor& x) { return x * w; }, full(Shape{{"embed", 3}}, 1.5, DType::f64));
    REQUIRE_FALSE(y.requires_grad());
    nax::testing::require_close(y, {3.0, 3.0, 3.0});
  }
  int calls = 0;
  const Tensor y = remat([w, &calls](const Tensor& x) { return ++calls == 1 ? x * w : sum(x * w, "embed"); }, full(Shape{{"embed", 3}}, 1.0, DType::f64));
  REQUIRE_THROWS_WITH(grad(sum(y, "embed"), {w}), Contains("remat") && Contains("same thing again"));
}

TEST_CASE("a function under remat that reads a reassigned variable or other values on recompute is an error", "[grad][remat][errors]") {
  const Shape s{{"embed", 2}};
  // A captured variable reassigned between the forward and the backward: the recompute would read
  // the new tensor (the gradient would be 5, 5 where it is 1, 1).
  {
    Tensor w = parameter(ones(s, DType::f64));
    Tensor c = ones(s, DType::f64);
    const Tensor y = remat([&c](const Tensor& x) { return x * c; }, w);
    c = full(s, 5.0, DType::f64);
    REQUIRE_THROWS_WITH(grad(sum(y, "embed"), {w}), Contains("remat") && Contains("mul") && Contains("reassigned") &&
                                                        Contains("as inputs"));
  }
  // Captured by value, the same function is pure: its gradient is c.
  {
    Tensor w = parameter(ones(s, DType::f64));
    Tensor c = full(s, 3.0, DType::f64);
    const Tensor y = remat([c](const Tensor& x) { return x * c; }, w);
    c = full(s, 5.0, DType::f64);
    nax::testing::require_close(grad(sum(y, "embed"), {w})[0], {3.0, 3.0}, 0);
  }
  // A dropout mask drawn from a seed that advances with every call: the recompute draws another.
  {
    Tensor w = parameter(ones(Shape{{"embed", 64}}, DType::f64));
    std::uint64_t seed = 1;
    const Tensor y = remat([&seed](const Tensor& x) { return x * gt(random_uniform(x.shape(), seed++, "drop", 0, 1, DType::f64), scalar(0.5, DType::f64)); }, w);
    REQUIRE_THROWS_WITH(grad(sum(y, "embed"), {w}), Contains("remat") && Contains("other values") && Contains("seed"));
  }
  // A C++ scale captured by reference and changed.
  {
    Tensor w = parameter(ones(s, DType::f64));
    double scale = 2;
    const Tensor y = remat([&scale](const Tensor& x) { return x * scale; }, w);
    scale = 3;
    REQUIRE_THROWS_WITH(grad(sum(y, "embed"), {w}), Contains("other values"));
  }
}

TEST_CASE("dropout under remat recomputes the forward's mask: its gradient is the mask's", "[grad][remat]") {
  const Shape s{{"embed", 64}};
  Tensor w = random_normal(s, 3, "w", 1.0, DType::f64);
  auto dropout = [](const Tensor& x, std::uint64_t seed) {
    const Tensor keep = gt(random_uniform(x.shape(), seed, "dropout", 0, 1, DType::f64), scalar(0.25, DType::f64));
    return x * keep / 0.75;
  };
  const std::uint64_t step_seed = 42;  // fixed before the forward (the step, the layer)
  const Tensor p = parameter(w);
  const Tensor y = remat([&](const Tensor& x) { return tanh(dropout(x, step_seed)); }, p);
  const auto with_remat = grad(sum(y * y, "embed"), {p})[0].to_vector<double>();
  const Tensor q = parameter(w);
  const Tensor z = tanh(dropout(q, step_seed));
  const auto without = grad(sum(z * z, "embed"), {q})[0].to_vector<double>();
  REQUIRE(with_remat == without);
  const auto mask = gt(random_uniform(s, step_seed, "dropout", 0, 1, DType::f64), scalar(0.25, DType::f64)).to_vector<double>();
  int dropped = 0;
  for (std::size_t i = 0; i < mask.size(); ++i)
    if (mask[i] == 0) {
      REQUIRE(with_remat[i] == 0);
      ++dropped;
    }
  REQUIRE(dropped > 0);
  REQUIRE(dropped < 64);
}

TEST_CASE("tensors are immutable once an op has read them", "[grad][errors]") {
  Tensor x = Tensor::empty(Shape{{"i", 2}}, DType::f64);
  x.mutable_data<double>()[0] = 1, x.mutable_data<double>()[1] = 2;  // filling a fresh tensor is fine
  Tensor w = parameter(full(Shape{{"i", 2}}, 3.0, DType::f64));
  const Tensor y = sum(x * w, "i");  // mul saves x for w's gradient
  REQUIRE_THROWS_WITH(x.mutable_data<double>()[0] = 100, Contains("mutable_data") && Contains("immutable") && Contains("fresh tensor"));
  nax::testing::require_close(grad(y, {w})[0], {1.0, 2.0}, 0);
}

TEST_CASE("a function under remat whose gradient path or hidden values change before the backward is an error", "[grad][remat][errors]") {
  const Shape s{{"embed", 2}};
  // A stop_gradient decided by a flag that changes: the values are the same, the gradient is not.
  {
    Tensor w = parameter(ones(s, DType::f64));
    bool frozen = false;
    const Tensor y = remat([&frozen](const Tensor& x) { return (frozen ? stop_gradient(x) : x) * 3.0; }, w);
    frozen = true;
    REQUIRE_THROWS_WITH(grad(sum(y, "embed"), {w}), Contains("remat") && Contains("gradient goes another way"));
  }
  // A NoGrad scope opened by a flag that changes.
  {
    Tensor w = parameter(ones(s, DType::f64));
    bool frozen = false;
    const Tensor y = remat([&frozen](const Tensor& x) {
      if (!frozen) return x * 3.0;
      NoGrad no_grad;
      return x * 3.0;
    }, w);
    frozen = true;
    REQUIRE_THROWS_WITH(grad(sum(y, "embed"), {w}), Contains("remat") && Contains("gradient goes another way"));
  }
  // An exponent changed from 2 to 5 at x = 1: the result's bits agree (1), the gradient would not.
  {
    Tensor w = parameter(ones(s, DType::f64));
    double k = 2;
    const Tensor y = remat([&k](const Tensor& x) { return pow(x, full_like(x, k)); }, w);
    k = 5;
    REQUIRE_THROWS_WITH(grad(sum(y, "embed"), {w}), Contains("remat") && Contains("'pow'") && Contains("other values"));
  }
}
