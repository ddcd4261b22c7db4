// nax::vjp: the forward now, the pullback later. Gradients of a two-output function against f64
// host loops; micro-batches run one forward ahead of their backwards (1F1B) give the gradients of
// the whole batch; a tensor-parallel layer's pullback runs its psum's transpose and matches grad()
// on meshes 1x1, 1x2 and 2x2; misuse is an error naming vjp.
#include <cmath>
#include <functional>
#include <optional>

#include "helpers.h"

using namespace nax;
using namespace nax::testing;
using Catch::Matchers::Contains;

namespace {

std::vector<double> values_of(const Shape& shape, double scale, int salt) {
  std::vector<double> v(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(0.7 * static_cast<double>(i) + salt);
  return v;
}

// x[b, i], w[i, o] -> y = x w [b, o], z = sum(y * y, {"b", "o"}). The gradients of <cy, y> + cz z:
// dx = g w^T, dw = x^T g with g = cy + 2 cz y.
struct Reference {
  std::vector<double> dx, dw;
};
Reference reference(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& cy, double cz, int b,
                    int i, int o) {
  std::vector<double> g(static_cast<std::size_t>(b * o));
  for (int r = 0; r < b; ++r)
    for (int c = 0; c < o; ++c) {
      double y = 0;
      for (int k = 0; k < i; ++k) y += x[r * i + k] * w[k * o + c];
      g[r * o + c] = cy[r * o + c] + 2 * cz * y;
    }
  Reference ref{std::vector<double>(x.size()), std::vector<double>(w.size())};
  for (int r = 0; r < b; ++r)
    for (int k = 0; k < i; ++k)
      for (int c = 0; c < o; ++c) {
        ref.dx[r * i + k] += g[r * o + c] * w[k * o + c];
        ref.dw[k * o + c] += x[r * i + k] * g[r * o + c];
      }
  return ref;
}

// Two stages over micro-batches x[b, i] (i = 4): a = tanh(x w0) (its axis o renamed i), h =
// tanh(a w1), loss = the sum over micro-batches of mean(h * h). The gradients of w0 and w1 by hand.
std::pair<std::vector<double>, std::vector<double>> two_stage_reference(const std::vector<std::vector<double>>& xs,
                                                                        const std::vector<double>& w0, const std::vector<double>& w1,
                                                                        int b) {
  constexpr int n = 4;
  std::vector<double> d0(n * n), d1(n * n);
  auto forward = [&](const std::vector<double>& in, const std::vector<double>& w) {
    std::vector<double> out(static_cast<std::size_t>(b * n));
    for (int r = 0; r < b; ++r)
      for (int c = 0; c < n; ++c) {
        double z = 0;
        for (int k = 0; k < n; ++k) z += in[r * n + k] * w[k * n + c];
        out[r * n + c] = std::tanh(z);
      }
    return out;
  };
  for (const auto& x : xs) {
    const auto a = forward(x, w0), h = forward(a, w1);
    std::vector<double> pre1(h.size()), pre0(a.size(), 0.0);
    for (std::size_t e = 0; e < h.size(); ++e) pre1[e] = 2 * h[e] / (b * n) * (1 - h[e] * h[e]);
    for (int r = 0; r < b; ++r)
      for (int k = 0; k < n; ++k)
        for (int c = 0; c < n; ++c) {
          d1[k * n + c] += a[r * n + k] * pre1[r * n + c];
          pre0[r * n + k] += pre1[r * n + c] * w1[k * n + c];
        }
    for (std::size_t e = 0; e < a.size(); ++e) pre0[e] *= 1 - a[e] * a[e];
    for (int r = 0; r < b; ++r)
      for (int k = 0; k < n; ++k)
        for (int c = 0; c < n; ++c) d0[k * n + c] += x[r * n + k] * pre0[r * n + c];
  }
  return {d0, d1};
}

// The stages of two_stage_reference: stage 0 maps a micro-batch to an activation, stage 1 an
// activation to its loss.
std::function<std::vector<Tensor>(const std::vector<Tensor>&)> stage_fn(int stage) {
  return [stage](const std::vector<Tensor>& p) {
    const Tensor h = rename(tanh(dot(p[0], p[1], "i")), "o", "i");
    return std::vector<Tensor>{stage == 0 ? h : mean(h * h, {"b", "i"})};
  };
}

}  // namespace

TEST_CASE("vjp of two outputs matches f64 host loops, cotangents in any axis order", "[grad][vjp]") {
  const Shape sx{{"b", 3}, {"i", 4}}, sw{{"i", 4}, {"o", 2}}, sy{{"b", 3}, {"o", 2}};
  const auto x = values_of(sx, 1.0, 1), w = values_of(sw, 0.5, 2), cy = values_of(sy, 0.3, 3);
  const double cz = 0.25;
  const Reference want = reference(x, w, cy, cz, 3, 4, 2);
  Runtime::local(Mesh::parse("x=1")).run([&](Shard&) {
    Vjp f = vjp([](const std::vector<Tensor>& p) {
      Tensor y = dot(p[0], p[1], "i");
      return std::vector<Tensor>{y, sum(y * y, {"b", "o"})};
    }, {from_vector(sx, x, DType::f64), from_vector(sw, w, DType::f64)});
    REQUIRE(f.outputs.size() == 2);
    REQUIRE_FALSE(f.outputs[0].requires_grad());
    const Tensor cy_transposed = transpose(from_vector(sy, cy, DType::f64), {"o", "b"});
    const auto grads = f.pullback({cy_transposed, full(Shape{}, cz, DType::f64)});
    REQUIRE(grads.size() == 2);
    require_close(grads[0], want.dx, 1e-12);
    require_close(grads[1], want.dw, 1e-12);
  });
}

TEST_CASE("vjp: forwards run ahead of their pullbacks (1F1B) give the whole batch's gradients", "[grad][vjp]") {
  const Shape sw{{"i", 4}, {"o", 4}}, sb{{"b", 2}, {"i", 4}};
  const auto w0v = values_of(sw, 0.4, 5), w1v = values_of(sw, 0.3, 6);
  std::vector<std::vector<double>> xs;
  for (int m = 0; m < 3; ++m) xs.push_back(values_of(sb, 1.0, 10 + m));
  const auto [want0, want1] = two_stage_reference(xs, w0v, w1v, 2);
  Runtime::local(Mesh::parse("x=1")).run([&](Shard&) {
    const Tensor w0 = from_vector(sw, w0v, DType::f64), w1 = from_vector(sw, w1v, DType::f64);
    // 1F1B on one device: stage 0 runs micro-batch m + 1's forward before micro-batch m's backward.
    Tensor g0 = zeros(sw, DType::f64), g1 = zeros(sw, DType::f64);
    std::vector<Vjp> first;
    first.push_back(vjp(stage_fn(0), {from_vector(sb, xs[0], DType::f64), w0}));
    for (std::size_t m = 0; m < xs.size(); ++m) {
      if (m + 1 < xs.size()) first.push_back(vjp(stage_fn(0), {from_vector(sb, xs[m + 1], DType::f64), w0}));
      Vjp second = vjp(stage_fn(1), {first[m].outputs[0], w1});
      const auto d1 = second.pullback({ones(Shape{}, DType::f64)});
      g1 = g1 + d1[1];
      g0 = g0 + first[m].pullback({d1[0]})[1];
    }
    require_close(g0, want0, 1e-12);
    require_close(g1, want1, 1e-12);
  });
}

TEST_CASE("vjp through a tensor-parallel layer runs its collectives' transposes and matches grad", "[grad][vjp][mesh]") {
  const Shape sx{{"batch", 4}, {"embed", 6}}, s_in{{"embed", 6}, {"mlp", 8}}, s_out{{"mlp", 8}, {"embed", 6}};
  const AxisRules rules{{"batch", "dp"}, {"mlp", "mp"}};
  for (const std::string spec : {"dp=1,mp=1", "dp=1,mp=2", "dp=2,mp=2"}) {
    INFO(spec);
    Runtime rt = Runtime::local(Mesh::parse(spec));
    std::vector<std::string> mismatches(static_cast<std::size_t>(rt.size()));  // no Catch on the devices' threads
    rt.run([&](Shard& s) {
      const Tensor x = s.shard(from_vector(sx, values_of(sx, 1.0, 1)), rules);
      const Tensor w_in = s.shard(from_vector(s_in, values_of(s_in, 0.5, 2)), rules);
      const Tensor w_out = s.shard(from_vector(s_out, values_of(s_out, 0.5, 3)), rules);
      auto layer = [](const std::vector<Tensor>& p) {
        return std::vector<Tensor>{p[0] + psum(dot(gelu(dot(p[0], p[1], "embed")), p[2], "mlp"), "mp")};
      };
      auto loss_of = [](const Tensor& y) { return pmean(mean(y * y, {"batch", "embed"}), "dp"); };
      auto [loss, want] = value_and_grad([&](const std::vector<Tensor>& p) { return loss_of(layer(p)[0]); }, {x, w_in, w_out});
      Vjp f = vjp(layer, {x, w_in, w_out});
      // The loss's gradient with respect to the layer's output, as the next stage would send it.
      const Vjp head = vjp([&](const std::vector<Tensor>& p) { return std::vector<Tensor>{loss_of(p[0])}; }, {f.outputs[0]});
      const auto d_out = head.pullback({ones(Shape{}, DType::f32)});
      const auto got = f.pullback(d_out);
      std::string& wrong = mismatches[static_cast<std::size_t>(s.device())];
      for (std::size_t k = 0; k < got.size(); ++k) {
        if (!(got[k].vary() == want[k].vary())) wrong += fmt::format("gradient {}: {} vs {}; ", k, got[k].str(), want[k].str());
        const auto a = got[k].to_vector<double>(), b = want[k].to_vector<double>();
        if (a.size() != b.size()) wrong += fmt::format("gradient {}: {} elements vs {}; ", k, a.size(), b.size());
        for (std::size_t e = 0; e < std::min(a.size(), b.size()); ++e)
          if (!(std::abs(a[e] - b[e]) <= 1e-6 * (1 + std::abs(b[e])))) wrong += fmt::format("gradient {}[{}]: {} vs {}; ", k, e, a[e], b[e]);
      }
    });
    for (const auto& wrong : mismatches) REQUIRE(wrong.empty());
  }
}

TEST_CASE("vjp misuse is an error naming vjp", "[grad][vjp]") {
  Runtime::local(Mesh::parse("x=1")).run([&](Shard&) {
    const Tensor x = ones(Shape{{"i", 3}}), w = parameter(ones(Shape{{"i", 3}}));
    Vjp f = vjp([](const std::vector<Tensor>& p) { return std::vector<Tensor>{p[0] * 2.0}; }, {x});
    REQUIRE_THROWS_WITH(f.pullback({}), Contains("vjp") && Contains("one cotangent per output"));
    REQUIRE_THROWS_WITH(f.pullback({ones(Shape{{"j", 3}})}), Contains("vjp") && Contains("does not match output"));
    REQUIRE(f.pullback({ones(Shape{{"i", 3}})})[0].to_vector<float>() == std::vector<float>{2, 2, 2});
    REQUIRE_THROWS_WITH(f.pullback({ones(Shape{{"i", 3}})}), Contains("already called"));

    Vjp captured = vjp([w](const std::vector<Tensor>& p) { return std::vector<Tensor>{p[0] * w}; }, {x});
    REQUIRE_THROWS_WITH(captured.pullback({ones(Shape{{"i", 3}})}), Contains("vjp") && Contains("pass it as a primal"));

    NoGrad no_grad;
    REQUIRE_THROWS_WITH(vjp([](const std::vector<Tensor>& p) { return p; }, {x}), Contains("NoGrad"));
  });
}

TEST_CASE("vjp: a primal no output depends on gets zeros; an output that needs no gradient is fine", "[grad][vjp]") {
  Runtime::local(Mesh::parse("x=1")).run([&](Shard&) {
    const Tensor a = full(Shape{{"i", 2}}, 3.0), b = full(Shape{{"i", 2}}, 5.0);
    Vjp f = vjp([](const std::vector<Tensor>& p) { return std::vector<Tensor>{p[0] * p[0], ones(Shape{{"i", 2}})}; }, {a, b});
    const auto grads = f.pullback({ones(Shape{{"i", 2}}), ones(Shape{{"i", 2}})});
    REQUIRE(grads[0].to_vector<float>() == std::vector<float>{6, 6});
    REQUIRE(grads[1].to_vector<float>() == std::vector<float>{0, 0});
    Vjp g = vjp([](const std::vector<Tensor>& p) { return std::vector<Tensor>{p[0] * p[0]}; }, {a});
    REQUIRE(g.pullback({Tensor()})[0].to_vector<float>() == std::vector<float>{0, 0});  // an undefined cotangent is zero
  });
}

TEST_CASE("vjp: a two-stage pipeline over pp runs 1F1B in per-shard code and matches one device", "[grad][vjp][mesh]") {
  const Shape sw{{"i", 4}, {"o", 4}}, sb{{"b", 2}, {"i", 4}};
  const std::vector<std::vector<double>> ws = {values_of(sw, 0.4, 7), values_of(sw, 0.3, 8)};
  const std::vector<std::vector<double>> xs = {values_of(sb, 1.0, 20), values_of(sb, 1.0, 21)};
  const auto [want0, want1] = two_stage_reference(xs, ws[0], ws[1], 2);
  const std::vector<std::vector<double>> want{want0, want1};

  std::vector<std::vector<double>> got(2);
  Runtime::local(Mesh::parse("pp=2")).run([&](Shard& s) {
    const int stage = s.coord("pp");
    // Each stage's weight: its block of the stacked weights, per device.
    std::vector<double> stacked = ws[0];
    stacked.insert(stacked.end(), ws[1].begin(), ws[1].end());
    const Tensor w = sum(as_varying(s.shard(from_vector(Shape{{"stage", 2}, {"i", 4}, {"o", 4}}, stacked), {{"stage", "pp"}}), "pp"),
                         {"stage"});
    const auto fn = stage_fn(stage);
    const Tensor nothing = pvary(zeros(sb, DType::f64), "pp");  // what a stage sends when it has nothing to send
    const Tensor x0 = pvary(from_vector(sb, xs[0]), "pp"), x1 = pvary(from_vector(sb, xs[1]), "pp");
    const std::vector<std::pair<int, int>> forward{{0, 1}}, backward{{1, 0}};
    std::optional<Vjp> f0, f1;
    Tensor grad_w, to_previous = nothing;
    // Step 0: stage 0 runs micro-batch 0's forward.
    if (stage == 0) f0 = vjp(fn, {x0, w});
    Tensor received = ppermute(stage == 0 ? f0->outputs[0] : nothing, "pp", forward);
    // Step 1: stage 0 runs micro-batch 1's forward while stage 1 runs micro-batch 0's forward and backward.
    if (stage == 0) {
      f1 = vjp(fn, {x1, w});
    } else {
      f0 = vjp(fn, {received, w});
      const auto d = f0->pullback({ones(Shape{})});
      to_previous = d[0], grad_w = d[1];
    }
    received = ppermute(stage == 0 ? f1->outputs[0] : nothing, "pp", forward);
    Tensor cotangent = ppermute(to_previous, "pp", backward);
    // Step 2: stage 0 runs micro-batch 0's backward (1F1B: after micro-batch 1's forward).
    if (stage == 0) {
      grad_w = f0->pullback({cotangent})[1];
      to_previous = nothing;
    } else {
      f1 = vjp(fn, {received, w});
      const auto d = f1->pullback({ones(Shape{})});
      to_previous = d[0], grad_w = grad_w + d[1];
    }
    cotangent = ppermute(to_previous, "pp", backward);
    // Step 3: stage 0 runs micro-batch 1's backward.
    if (stage == 0) grad_w = grad_w + f1->pullback({cotangent})[1];
    NAX_EXPECT(grad_w.vary().kind("pp") == Vary::Varying);  // no Catch on the devices' threads
    got[static_cast<std::size_t>(stage)] = grad_w.to_vector<double>();
  });
  for (int stage = 0; stage < 2; ++stage) {
    INFO("stage " << stage);
    REQUIRE(got[stage].size() == want[stage].size());
    require_close(got[stage], want[stage], 1e-6);
  }
}
