// The nn library: mesh-independent parameter init, AdamW, global-norm clipping over a mesh, the
// learning-rate schedule, gradient accumulation and the data-parallel gradient mean.
#include <nax/nn/optim.h>

#include <cstring>

#include "helpers.h"

using namespace nax;
using namespace nax::nn;

namespace {
const std::vector<ParamSpec> kSpecs = {
    {"w_in", Shape{{"embed", 4}, {"mlp", 8}}, Init::normal, 0.5},
    {"b_in", Shape{{"mlp", 8}}, Init::zeros},
    {"scale", Shape{{"embed", 4}}, Init::ones},
    {"w_out", Shape{{"mlp", 8}, {"embed", 4}}, Init::normal, 0.5},
};

AxisRules rules_for(const Mesh& mesh) {
  AxisRules rules{{"mlp", "mp"}};
  if (mesh.has("dp")) rules.set("batch", {"dp"});
  return rules;
}

std::vector<std::vector<double>> gathered(Shard& s, const std::vector<Tensor>& ts) {
  std::vector<std::vector<double>> out;
  for (const auto& t : ts) out.push_back(s.gather(t).to_vector<double>());
  return out;
}

// A small tensor-parallel MLP's mean squared error on this device's batch block, averaged over dp.
Tensor mlp_loss(const Parameters& p, const Tensor& x) {
  Tensor h = tanh(dot(x, p["w_in"], "embed") + p["b_in"]);
  Tensor y = psum(dot(h, p["w_out"], "mlp"), "mp") * p["scale"];
  Tensor loss = mean(square(y - x), {"batch", "embed"});
  return loss.vary().kind("dp") == Vary::Invariant ? loss : pmean(loss, "dp");
}
}  // namespace

TEST_CASE("parameters are the same global model on every mesh", "[nn][mesh]") {
  std::vector<std::vector<double>> reference;
  for (const std::string spec : {"dp=1,mp=1", "dp=1,mp=2", "dp=2,mp=2", "dp=1,mp=4"}) {
    Runtime rt = Runtime::local(Mesh::parse(spec));
    auto values = rt.run([&](Shard& s) {
      Parameters p = Parameters::init(s, kSpecs, rules_for(s.mesh()), 3);
      NAX_EXPECT(p["w_in"].requires_grad());
      NAX_EXPECT(p.global_count() == 32 + 8 + 4 + 32);
      return gathered(s, p.values());
    })[0];
    if (reference.empty()) reference = values;
    INFO("mesh " << spec);
    REQUIRE(values == reference);
  }
  REQUIRE(reference[1] == std::vector<double>(8, 0.0));
  REQUIRE(reference[2] == std::vector<double>(4, 1.0));
}

TEST_CASE("AdamW matches the update written out by hand, decaying only matrices", "[nn]") {
  // f32 goes through the device's fused kernel, f64 through tensor ops: both must give the formula.
  const DType dtype = GENERATE(DType::f64, DType::f32);
  const double tolerance = dtype == DType::f64 ? 1e-12 : 2e-6;
  Tensor w = from_vector(Shape{{"a", 2}, {"b", 1}}, std::vector<double>{1.0, -2.0}, dtype);
  Tensor bias = from_vector(Shape{{"a", 2}}, std::vector<double>{0.5, 0.25}, dtype);
  AdamW opt({.beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1, .shard_state_over = ""});
  std::vector<double> m(4, 0), v(4, 0), p{1.0, -2.0, 0.5, 0.25};
  std::vector<Tensor> params{w, bias};
  for (int step = 1; step <= 3; ++step) {
    std::vector<double> g{0.1 * step, -0.2, 0.3, 0.05 * step};
    std::vector<Tensor> grads{from_vector(w.shape(), std::vector<double>{g[0], g[1]}, dtype),
                              from_vector(bias.shape(), std::vector<double>{g[2], g[3]}, dtype)};
    params = opt.step(params, grads, 0.01);
    for (std::size_t i = 0; i < 4; ++i) {
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.99 * v[i] + 0.01 * g[i] * g[i];
      double update = (m[i] / (1 - std::pow(0.9, step))) / (std::sqrt(v[i] / (1 - std::pow(0.99, step))) + 1e-8);
      if (i < 2) update += 0.1 * p[i];  // weight decay on the matrix only
      p[i] -= 0.01 * update;
    }
  }
  auto got_w = params[0].to_vector<double>(), got_b = params[1].to_vector<double>();
  REQUIRE(nax::testing::max_rel_error({got_w[0], got_w[1], got_b[0], got_b[1]}, p) < tolerance);
  REQUIRE(opt.steps() == 3);
  for (const auto& t : params) REQUIRE(t.dtype() == dtype);
  for (const auto& t : opt.state()) REQUIRE(t.dtype() == dtype);
}

TEST_CASE("global norm sums each gradient's squares over the mesh axes it is cut over", "[nn][mesh]") {
  std::vector<Tensor> globals;
  double want = 0;
  for (const auto& spec : kSpecs) {
    globals.push_back(random_normal(spec.global, 5, spec.name, 1.0, DType::f64));
    for (double x : globals.back().to_vector<double>()) want += x * x;
  }
  want = std::sqrt(want);
  for (const std::string spec : {"dp=1,mp=1", "dp=2,mp=2", "dp=1,mp=4"}) {
    Runtime rt = Runtime::local(Mesh::parse(spec));
    auto norms = rt.run([&](Shard& s) {
      std::vector<Tensor> grads;
      for (const auto& g : globals) grads.push_back(s.shard(g, rules_for(s.mesh())));
      Tensor norm = global_norm(grads);
      NAX_EXPECT(norm.vary().invariant());
      double before = clip_by_global_norm(grads, 1.0);
      return std::pair{before, global_norm(grads).item()};
    });
    INFO("mesh " << spec);
    for (auto [before, after] : norms) {
      REQUIRE(before == Approx(want).epsilon(1e-12));
      REQUIRE(after == Approx(1.0).epsilon(1e-5));
    }
  }
}

TEST_CASE("global norm over pipeline stages: every stage's squares, in one device's order (its bits when deterministic)", "[nn][mesh]") {
  std::vector<Tensor> globals;
  double squares = 0;  // the host's sum, in f64
  for (const auto& spec : kSpecs) {
    globals.push_back(random_normal(spec.global, 7, spec.name, 1.0, DType::f64));
    for (double x : globals.back().to_vector<double>()) squares += x * x;
  }
  for (const bool deterministic : {false, true}) {
    RuntimeOptions options;
    options.deterministic = deterministic;
    const double one = Runtime::local(Mesh::parse("dp=1,mp=1"), options).run([&](Shard& s) {
      std::vector<Tensor> grads;
      for (const auto& g : globals) grads.push_back(s.shard(g, rules_for(s.mesh())));
      return global_norm(grads).item();
    })[0];
    for (const std::string spec : {"dp=1,mp=1,pp=2", "dp=1,mp=2,pp=2", "dp=2,mp=1,pp=2", "pp=2,dp=2,mp=2"}) {
      INFO("mesh " << spec << (deterministic ? ", deterministic" : ""));
      Runtime rt = Runtime::local(Mesh::parse(spec), options);
      const auto norms = rt.run([&](Shard& s) {
        // Stage k holds a run of consecutive gradients (as many or one fewer than the others), Varying over pp.
        const std::size_t stage = static_cast<std::size_t>(s.coord("pp")), stages = static_cast<std::size_t>(s.mesh().axis_size("pp"));
        std::vector<Tensor> mine;
        for (std::size_t i = 0; i < globals.size(); ++i)
          if (i * stages / globals.size() == stage) mine.push_back(pvary(s.shard(globals[i], rules_for(s.mesh())), "pp"));
        const Tensor norm = global_norm(mine, "pp");
        NAX_EXPECT(norm.vary().invariant());
        return norm.item();
      });
      for (double n : norms) {
        if (deterministic) REQUIRE(n == one);  // one device's bits
        nax::testing::require_close({n}, {std::sqrt(squares)}, 1e-12);
      }
    }
  }
  REQUIRE_THROWS_WITH(Runtime::local(Mesh::parse("dp=2")).run([&](Shard&) { global_norm({}, "pp"); }),
                      Catch::Matchers::Contains("the stage axis 'pp' is not an axis of the mesh dp=2"));
}

TEST_CASE("warmup then cosine decay", "[nn]") {
  REQUIRE(warmup_cosine(0, 10, 110, 1.0) == Approx(0.1));
  REQUIRE(warmup_cosine(9, 10, 110, 1.0) == Approx(1.0));
  REQUIRE(warmup_cosine(10, 10, 110, 1.0) == Approx(1.0));
  REQUIRE(warmup_cosine(60, 10, 110, 1.0) == Approx(0.55));
  REQUIRE(warmup_cosine(110, 10, 110, 1.0) == Approx(0.1));
  REQUIRE(warmup_cosine(500, 10, 110, 2.0, 0.0) == Approx(0.0));
}

TEST_CASE("data-parallel mean and micro-batch accumulation give the full-batch gradient", "[nn][mesh]") {
  const Tensor data = random_normal(Shape{{"batch", 8}, {"embed", 4}}, 9, "data");
  auto grads_on = [&](const std::string& spec, int micro_batches) {
    Runtime rt = Runtime::local(Mesh::parse(spec));
    return rt.run([&](Shard& s) {
      Parameters p = Parameters::init(s, kSpecs, rules_for(s.mesh()), 3, DType::f64);
      Tensor x = cast(s.shard(data, rules_for(s.mesh())), DType::f64);
      GradAccumulator acc;
      const std::int64_t n = x.shape().size("batch") / micro_batches;
      for (int i = 0; i < micro_batches; ++i) acc.add(grad(mlp_loss(p, slice(x, "batch", i * n, (i + 1) * n)), p.values()));
      return gathered(s, acc.mean());
    })[0];
  };
  auto reference = grads_on("dp=1,mp=1", 1);
  for (auto [spec, micro] : {std::pair<std::string, int>{"dp=1,mp=1", 2}, {"dp=2,mp=1", 1}, {"dp=2,mp=2", 2}, {"dp=4,mp=2", 1}}) {
    auto got = grads_on(spec, micro);
    INFO("mesh " << spec << " micro-batches " << micro);
    for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(nax::testing::max_rel_error(got[i], reference[i]) < 1e-12);
  }
}

TEST_CASE("AdamW::update replaces the parameters one at a time with step()'s values, bit for bit", "[nn][mesh]") {
  Runtime::local(Mesh::parse("dp=1,mp=2")).run([&](Shard& s) {
    Parameters by_step = Parameters::init(s, kSpecs, rules_for(s.mesh()), 3), in_place = Parameters::init(s, kSpecs, rules_for(s.mesh()), 3);
    AdamW a, b;
    for (int step = 0; step < 3; ++step) {
      std::vector<Tensor> grads;
      for (const auto& p : by_step.values()) grads.push_back(random_normal(p.shape(), 10 + step, "g", 1.0, p.dtype()).with_vary(p.vary()));
      by_step.assign(a.step(by_step, grads, 0.01));
      b.update(in_place, grads, 0.01);
      for (std::size_t i = 0; i < kSpecs.size(); ++i) {
        const auto got = in_place[i].to_vector<float>(), want = by_step[i].to_vector<float>();
        NAX_EXPECT(got.size() == want.size() && std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);  // every bit, -0 too
        NAX_EXPECT(in_place[i].requires_grad());
      }
    }
    NAX_EXPECT(b.steps() == 3);
  });
  std::vector<Tensor> values;
  for (const auto& spec : kSpecs) values.push_back(zeros(spec.global));
  Parameters host = Parameters::from_values(kSpecs, values);
  REQUIRE_THROWS_WITH(host.assign(0, zeros(Shape{{"embed", 3}})), Catch::Matchers::Contains("'w_in' is f32[embed=4, mlp=8]"));
  REQUIRE_THROWS_WITH(host.assign(9, host[0]), Catch::Matchers::Contains("parameter 9 of 4"));
}

TEST_CASE("AdamW::update with a gradient scale is clipping then updating, bit for bit, with and without ZeRO", "[nn][mesh]") {
  for (const std::string zero : {"", "dp"}) {
    INFO("shard_state_over '" << zero << "'");
    Runtime::local(Mesh::parse("dp=2,mp=2")).run([&](Shard& s) {
      Parameters clipped = Parameters::init(s, kSpecs, rules_for(s.mesh()), 3), scaled = Parameters::init(s, kSpecs, rules_for(s.mesh()), 3);
      AdamW a({.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .shard_state_over = zero}), b(a);
      for (int step = 0; step < 3; ++step) {
        std::vector<Tensor> grads;
        for (const auto& p : clipped.values()) grads.push_back(random_normal(p.shape(), 10 + step, "g", 3.0, p.dtype()).with_vary(p.vary()));
        const Tensor norm = global_norm(grads);
        std::vector<Tensor> copy = grads;
        clip_to_norm_on_device(copy, norm, 0.5);  // the norm is well above 0.5: every gradient is scaled
        a.update(clipped, copy, 0.01);
        b.update(scaled, grads, 0.01, clip_scale(norm, 0.5));
        for (std::size_t i = 0; i < kSpecs.size(); ++i) {
          const auto got = scaled[i].to_vector<float>(), want = clipped[i].to_vector<float>();
          NAX_EXPECT(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
        }
      }
      NAX_EXPECT(clip_scale(scalar(0.25), 0.5).item() == 1.0);  // under the bound: exactly 1
    });
  }
}

TEST_CASE("AdamW opt({}) is the default optimizer", "[nn]") {
  AdamW opt({});
  const std::vector<Tensor> p{ones(Shape{{"i", 2}, {"j", 2}})}, g{full(Shape{{"i", 2}, {"j", 2}}, 0.5)};
  const auto stepped = opt.step(p, g, 0.1);
  REQUIRE(stepped[0].to_vector<double>() == AdamW().step(p, g, 0.1)[0].to_vector<double>());
  REQUIRE(stepped[0].to_vector<double>() == AdamW(AdamWConfig{}).step(p, g, 0.1)[0].to_vector<double>());
}

TEST_CASE("AdamW refuses a gradient typed otherwise than its parameter, naming it and the fix", "[nn][mesh][errors]") {
  using Catch::Matchers::Contains;
  Runtime rt = Runtime::local(Mesh::parse("dp=2"));
  for (const std::string zero : {"", "dp"}) {
    INFO("shard_state_over '" << zero << "'");
    // Each device's own gradient for a replicated parameter: each copy would move its own way.
    auto per_device = [](Shard& s) { return pvary(full(Shape{{"i", 4}}, 1.0 + s.device()), "dp"); };
    REQUIRE_THROWS_WITH(rt.run([&](Shard& s) {
                          AdamW opt({.shard_state_over = zero});
                          const Parameters p = Parameters::from_values({{"w", Shape{{"i", 4}}}}, {ones(Shape{{"i", 4}})});
                          static_cast<void>(opt.step(p, {per_device(s)}, 0.1));
                        }),
                        Contains("AdamW::step") && Contains("parameter 'w'") && Contains("Varying over mesh axis 'dp'") &&
                            Contains("parameter is Invariant") && Contains("psum or pmean the gradient over 'dp'"));
    REQUIRE_THROWS_WITH(rt.run([&](Shard& s) {
                          AdamW opt({.shard_state_over = zero});
                          static_cast<void>(opt.step({ones(Shape{{"i", 4}})}, {per_device(s)}, 0.1));
                        }),
                        Contains("parameter 0") && Contains("'dp'"));
    // Summed first, the same step on every device.
    const auto updated = rt.run([&](Shard& s) {
      AdamW opt({.shard_state_over = zero});
      return opt.step({ones(Shape{{"i", 4}})}, {pmean(per_device(s), "dp")}, 0.1)[0].to_vector<double>();
    });
    REQUIRE(updated[0] == updated[1]);
  }
  // A block's gradient must be the same block: not a per-device (or partial) value.
  REQUIRE_THROWS_WITH(Runtime::local(Mesh::parse("mp=2")).run([](Shard& s) {
                        const Tensor w = s.shard(ones(Shape{{"i", 4}}), {{"i", "mp"}});
                        static_cast<void>(AdamW().step({w}, {pvary(ones(Shape{{"i", 2}}), "mp")}, 0.1));
                      }),
                      Contains("Varying over mesh axis 'mp'") && Contains("Split along 'i'"));
  // A partial sum (a sum over an axis cut along mp) is one term of the gradient, not the gradient.
  REQUIRE_THROWS_WITH(Runtime::local(Mesh::parse("mp=2")).run([](Shard& s) {
                        const Tensor rows = s.shard(ones(Shape{{"r", 4}, {"i", 2}}), {{"r", "mp"}});
                        static_cast<void>(AdamW().step({ones(Shape{{"i", 2}})}, {sum(rows, "r")}, 0.1));
                      }),
                      Contains("Partial (a partial sum) over mesh axis 'mp'") && Contains("psum or pmean the gradient over 'mp'"));
}

TEST_CASE("AdamW refuses ZeRO over a mesh axis the mesh lacks", "[nn][mesh][errors]") {
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_WITH(Runtime::local(Mesh::parse("dp=2")).run([](Shard&) {
                        AdamW opt({.shard_state_over = "tp"});
                        static_cast<void>(opt.step({ones(Shape{{"i", 4}})}, {ones(Shape{{"i", 4}})}, 0.1));
                      }),
                      Contains("shard_state_over") && Contains("'tp'") && Contains("dp=2"));
  REQUIRE_THROWS_WITH(Runtime::local(Mesh::parse("dp=2")).run([](Shard&) {
                        AdamW opt({.shard_state_over = "tp"});
                        opt.load_state({ones(Shape{{"i", 4}}), ones(Shape{{"i", 4}})}, 1);
                      }),
                      Contains("'tp'") && Contains("dp=2"));
}

TEST_CASE("gradient accumulation refuses micro-batches whose gradients are typed differently", "[nn][mesh][errors]") {
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_WITH(Runtime::local(Mesh::parse("dp=2")).run([](Shard& s) {
                        GradAccumulator acc;
                        const Tensor g = pvary(full(Shape{{"i", 4}}, 1.0 + s.device()), "dp");
                        acc.add({psum(g, "dp")});
                        acc.add({g});  // this micro-batch's sum was forgotten
                      }),
                      Contains("GradAccumulator::add") && Contains("Varying over mesh axis 'dp'") && Contains("Invariant"));
}
