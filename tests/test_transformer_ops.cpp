// Transformer ops (layer_norm, gelu, softmax, log_softmax, where, embedding, pick, cross_entropy):
// forwards against plain loops (f64, and f32/bf16 against the loops on rounded inputs); gradients
// against central finite differences in f64 on fresh random inputs (check_gradients defaults:
// eps 1e-6, |analytic - numeric| <= 1e-6 relative); the vocab-parallel embedding and loss on
// meshes mp=1, mp=2, mp=4, dp=2,mp=2 (batch over dp) and dp+mp (vocab over both) against the
// single-device values and finite differences of the whole mesh program; layer_norm on a batch cut
// over dp (its scale/bias gradients summed over dp); errors on bad input. About 1 s in all.
#include "grad_check.h"

using namespace nax;
using nax::testing::at;
using nax::testing::check_gradients;
using nax::testing::check_mesh_gradients;
using nax::testing::for_each_index;
using nax::testing::fresh_seed;
using nax::testing::random_input;
using nax::testing::require_close;
using nax::testing::weighted_sum;
using Catch::Matchers::Contains;

namespace {

using Index = std::map<std::string, std::int64_t>;
using Row = std::vector<double>;

const Shape kX{{"b", 2}, {"s", 3}, {"e", 5}};     // for finite differences
const Shape kWide{{"b", 2}, {"s", 16}, {"e", 24}};  // for forward checks: rows long enough to be well conditioned

// The values of x along `axis` through `index`.
Row row_through(const Tensor& x, const std::vector<double>& values, Index index, const std::string& axis) {
  Row row;
  for (std::int64_t k = 0; k < x.size(axis); ++k) {
    index[axis] = k;
    row.push_back(at(x, values, index));
  }
  return row;
}

// Reference of a row op with x's shape: element `index` is f(row along `axis` through it, k).
template <typename F>
std::vector<double> reference_rows(const Tensor& x, const std::string& axis, F&& f) {
  const auto values = x.to_vector<double>();
  std::vector<double> out;
  for_each_index(x.shape(), [&](const Index& i) { out.push_back(f(row_through(x, values, i, axis), i.at(axis))); });
  return out;
}

double row_mean(const Row& r) {
  double s = 0;
  for (double v : r) s += v;
  return s / static_cast<double>(r.size());
}

double row_max(const Row& r) { return *std::max_element(r.begin(), r.end()); }

double log_sum_exp(const Row& r) {
  const double m = row_max(r);
  double s = 0;
  for (double v : r) s += std::exp(v - m);
  return m + std::log(s);
}

std::vector<double> layer_norm_reference(const Tensor& x, const std::string& axis, const Tensor& scale, const Tensor& bias,
                                         double eps) {
  const auto g = scale.to_vector<double>(), b = bias.to_vector<double>();
  return reference_rows(x, axis, [&](const Row& r, std::int64_t k) {
    const double mu = row_mean(r);
    Row sq;
    for (double v : r) sq.push_back((v - mu) * (v - mu));
    return (r[static_cast<std::size_t>(k)] - mu) / std::sqrt(row_mean(sq) + eps) * g[static_cast<std::size_t>(k)] +
           b[static_cast<std::size_t>(k)];
  });
}

double gelu_reference(double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }

// Uniform random ids in [0, vocab), fresh per run.
Tensor random_ids(const Shape& shape, int vocab, const std::string& name) {
  const std::uint64_t seed = fresh_seed();
  UNSCOPED_INFO("ids " << name << " seed " << seed);
  std::vector<std::int32_t> ids;
  for (double u : random_uniform(shape, seed, name, 0, vocab, DType::f64).to_vector<double>())
    ids.push_back(std::min(vocab - 1, static_cast<std::int32_t>(u)));
  return from_vector(shape, ids, DType::i32);
}

// x rounded to `dtype`, as f64: the reference input of a computation in that dtype.
Tensor rounded(const Tensor& x, DType dtype) { return cast(cast(x, dtype), DType::f64); }

Tensor ids_of(const Shape& shape, const std::vector<std::int32_t>& ids) { return from_vector(shape, ids, DType::i32); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// layer_norm

TEST_CASE("layer_norm matches a plain loop over the innermost axis and over a middle one", "[transformer]") {
  Tensor x = random_input(kWide, "x") + 3.0;  // an offset mean, as after a residual
  for (const std::string axis : {"e", "s"}) {
    INFO("axis " << axis);
    const Shape param{{axis, x.size(axis)}};
    Tensor scale = random_input(param, "scale"), bias = random_input(param, "bias");
    Tensor y = layer_norm(x, axis, scale, bias, 1e-5);
    REQUIRE(y.shape() == x.shape());
    REQUIRE(y.dtype() == DType::f64);
    require_close(y, layer_norm_reference(x, axis, scale, bias, 1e-5), 1e-12);
    for (auto [dtype, tolerance] : {std::pair{DType::f32, 1e-5}, std::pair{DType::bf16, 1e-2}}) {  // computed in f32
      INFO(dtype_name(dtype));
      Tensor yd = layer_norm(cast(x, dtype), axis, cast(scale, dtype), cast(bias, dtype), 1e-5);
      REQUIRE(yd.dtype() == dtype);
      require_close(yd, layer_norm_reference(rounded(x, dtype), axis, rounded(scale, dtype), rounded(bias, dtype), 1e-5), tolerance);
    }
  }
}

TEST_CASE("layer_norm gradients match finite differences", "[transformer]") {
  for (const std::string axis : {"e", "s"}) {
    INFO("axis " << axis);
    const Shape param{{axis, kX.size(axis)}};
    check_gradients([axis](auto& p) { return weighted_sum(layer_norm(p[0], axis, p[1], p[2])); },
                    {random_input(kX, "x") + 2.0, random_input(param, "scale"), random_input(param, "bias")});
  }
}

// ---------------------------------------------------------------------------------------------
// gelu

TEST_CASE("gelu matches the tanh formula and its gradient matches finite differences", "[transformer]") {
  Tensor x = random_input(kWide, "x", 2.0);
  std::vector<double> want;
  for (double v : x.to_vector<double>()) want.push_back(gelu_reference(v));
  Tensor y = gelu(x);
  REQUIRE(y.shape() == x.shape());
  require_close(y, want, 1e-14);
  require_close(gelu(cast(x, DType::f32)), gelu(rounded(x, DType::f32)).to_vector<double>(), 1e-6);
  require_close(gelu(cast(x, DType::bf16)), gelu(rounded(x, DType::bf16)).to_vector<double>(), 1e-2);
  check_gradients([](auto& p) { return weighted_sum(gelu(p[0])); }, {random_input(kX, "x", 2.0)});
}

// ---------------------------------------------------------------------------------------------
// softmax, log_softmax

TEST_CASE("softmax and log_softmax match plain loops and stay finite for large logits", "[transformer]") {
  Tensor x = random_input(kWide, "x", 5.0) + 800.0;  // exp(800) overflows: only a stable form works
  for (const std::string axis : {"e", "s"}) {
    INFO("axis " << axis);
    Tensor p = softmax(x, axis), lp = log_softmax(x, axis);
    REQUIRE(p.shape() == x.shape());
    REQUIRE(lp.shape() == x.shape());
    require_close(p, reference_rows(x, axis, [](const Row& r, std::int64_t k) {
                    return std::exp(r[static_cast<std::size_t>(k)] - log_sum_exp(r));
                  }), 1e-12);
    require_close(lp, reference_rows(x, axis, [](const Row& r, std::int64_t k) {
                    return r[static_cast<std::size_t>(k)] - log_sum_exp(r);
                  }), 1e-12);
    require_close(softmax(cast(x - 800.0, DType::f32), axis), softmax(rounded(x - 800.0, DType::f32), axis).to_vector<double>(), 1e-6);
    require_close(log_softmax(cast(x - 800.0, DType::bf16), axis),
                  log_softmax(rounded(x - 800.0, DType::bf16), axis).to_vector<double>(), 1e-2);
  }
}

TEST_CASE("softmax and log_softmax gradients match finite differences", "[transformer]") {
  for (const std::string axis : {"e", "s"}) {
    INFO("axis " << axis);
    check_gradients([axis](auto& p) { return weighted_sum(softmax(p[0], axis)); }, {random_input(kX, "x", 2.0)});
    check_gradients([axis](auto& p) { return weighted_sum(log_softmax(p[0], axis)); }, {random_input(kX, "x", 2.0)});
  }
}

// ---------------------------------------------------------------------------------------------
// where

TEST_CASE("where broadcasts by name: a's axes, then b's others, then cond's others", "[transformer]") {
  Tensor a = random_input(Shape{{"i", 3}, {"j", 2}}, "a"), b = random_input(Shape{{"j", 2}, {"k", 4}}, "b");
  const std::vector<double> mask{1, 0, -2, 0};
  for (DType cond_dtype : {DType::i32, DType::f64, DType::f32}) {
    INFO("cond " << dtype_name(cond_dtype));
    Tensor cond = from_vector(Shape{{"k", 4}}, mask, cond_dtype);
    Tensor y = where(cond, a, b);
    REQUIRE(y.shape() == Shape{{"i", 3}, {"j", 2}, {"k", 4}});
    const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
    std::vector<double> want;
    for_each_index(y.shape(), [&](const Index& i) {
      want.push_back(mask[static_cast<std::size_t>(i.at("k"))] != 0 ? at(a, va, i) : at(b, vb, i));
    });
    require_close(y, want, 0);
  }
  // cond supplies an axis of its own.
  Tensor cond = from_vector(Shape{{"m", 2}}, std::vector<double>{0, 1});
  Tensor y = where(cond, random_input(Shape{{"j", 2}}, "a"), random_input(Shape{{"j", 2}}, "b"));
  REQUIRE(y.shape() == Shape{{"j", 2}, {"m", 2}});
}

TEST_CASE("where sends the gradient to a and b through the mask, none to cond", "[transformer]") {
  // cond away from 0, so that finite differences in cond see a flat function.
  Tensor cond = from_vector(Shape{{"i", 3}, {"k", 4}}, std::vector<double>{1, -1, 2, -2, 1, 1, -1, -1, 2, -3, 3, 1});
  Tensor a = random_input(Shape{{"i", 3}, {"j", 2}}, "a"), b = random_input(Shape{{"j", 2}, {"k", 4}}, "b");
  check_gradients([](auto& p) { return weighted_sum(where(p[2], p[0], p[1])); }, {a, b, cond});
  auto [value, grads] = value_and_grad([](auto& p) { return sum(where(p[2], p[0], p[1]), {"i", "j", "k"}); }, {a, b, cond});
  REQUIRE(grads[2].to_vector<double>() == std::vector<double>(12, 0.0));
}

// ---------------------------------------------------------------------------------------------
// embedding, pick, cross_entropy on one device

TEST_CASE("embedding picks table rows; its gradient scatter-adds into the table", "[transformer]") {
  const Shape ids_shape{{"batch", 2}, {"seq", 3}};
  Tensor ids = ids_of(ids_shape, {0, 5, 2, 5, 5, 1});  // repeated ids accumulate
  for (const Shape& table_shape : {Shape{{"vocab", 6}, {"embed", 3}}, Shape{{"embed", 3}, {"vocab", 6}}}) {
    INFO("table " << table_shape.str());
    Tensor table = random_input(table_shape, "table");
    Tensor y = embedding(table, ids, "vocab");
    REQUIRE(y.shape() == Shape{{"batch", 2}, {"seq", 3}, {"embed", 3}});
    const auto vt = table.to_vector<double>(), vi = ids.to_vector<double>();
    std::vector<double> want;
    for_each_index(y.shape(), [&](const Index& i) {
      want.push_back(at(table, vt, {{"vocab", static_cast<std::int64_t>(at(ids, vi, i))}, {"embed", i.at("embed")}}));
    });
    require_close(y, want, 0);
    check_gradients([&](auto& p) { return weighted_sum(embedding(p[0], ids, "vocab")); }, {table});
  }
  Tensor table16 = cast(random_input(Shape{{"vocab", 6}, {"embed", 3}}, "table"), DType::bf16);
  REQUIRE(embedding(table16, ids, "vocab").dtype() == DType::bf16);
  require_close(embedding(table16, ids, "vocab"), embedding(cast(table16, DType::f64), ids, "vocab").to_vector<double>(), 0);
}

TEST_CASE("pick and cross_entropy match plain loops and finite differences", "[transformer]") {
  Tensor logits = random_input(Shape{{"batch", 2}, {"seq", 3}, {"vocab", 5}}, "logits", 2.0);
  Tensor targets = random_ids(Shape{{"seq", 3}, {"batch", 2}}, 5, "targets");  // another axis order
  const auto vl = logits.to_vector<double>(), vt = targets.to_vector<double>();
  std::vector<double> picked;
  double loss = 0;
  for_each_index(targets.shape(), [&](const Index& i) {
    Index li = i;
    li["vocab"] = static_cast<std::int64_t>(at(targets, vt, i));
    picked.push_back(at(logits, vl, li));
    loss += log_sum_exp(row_through(logits, vl, li, "vocab")) - picked.back();
  });
  Tensor p = pick(logits, targets, "vocab");
  REQUIRE(p.shape() == targets.shape());
  require_close(p, picked, 0);
  Tensor ce = cross_entropy(logits + 700.0, targets, "vocab");  // stable for large logits
  REQUIRE(ce.rank() == 0);
  REQUIRE(ce.item() == Approx(loss / 6).epsilon(1e-10));
  Tensor ce16 = cross_entropy(cast(logits, DType::bf16), targets, "vocab");  // computed in f32
  REQUIRE(ce16.dtype() == DType::f32);
  REQUIRE(ce16.item() == Approx(cross_entropy(rounded(logits, DType::bf16), targets, "vocab").item()).epsilon(1e-5));

  check_gradients([&](auto& q) { return weighted_sum(pick(q[0], targets, "vocab")); }, {logits});
  check_gradients([&](auto& q) { return cross_entropy(q[0], targets, "vocab"); }, {logits});
}

TEST_CASE("bf16 inputs compute in f32 and get bf16 gradients close to the f64 ones", "[transformer]") {
  const Shape logits_shape{{"b", 2}, {"s", 3}, {"v", 5}};
  const std::vector<Tensor> inputs{rounded(random_input(kX, "x"), DType::bf16), rounded(random_input(Shape{{"e", 5}}, "scale"), DType::bf16),
                                   rounded(random_input(Shape{{"e", 5}}, "bias"), DType::bf16),
                                   rounded(random_input(logits_shape, "logits"), DType::bf16)};
  const Tensor w = rounded(random_input(kX, "w"), DType::bf16), targets = random_ids(Shape{{"b", 2}, {"s", 3}}, 5, "targets");
  auto loss = [&](const std::vector<Tensor>& p) {
    Tensor y = log_softmax(gelu(layer_norm(p[0], "e", p[1], p[2])), "s");
    Tensor ce = cross_entropy(p[3], targets, "v");
    return cast(sum(y * cast(w, p[0].dtype()), kX.names()), ce.dtype()) + ce;
  };
  std::vector<Tensor> inputs16;
  for (const auto& t : inputs) inputs16.push_back(cast(t, DType::bf16));
  auto [value16, grads16] = value_and_grad(loss, inputs16);
  auto [value64, grads64] = value_and_grad(loss, inputs);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    INFO("input " << i);
    REQUIRE(grads16[i].dtype() == DType::bf16);
    REQUIRE(nax::testing::max_rel_error(grads16[i].to_vector<double>(), grads64[i].to_vector<double>()) <= 5e-2);
  }
}

// ---------------------------------------------------------------------------------------------
// on meshes

namespace {

const Shape kTable{{"vocab", 8}, {"embed", 3}};
const Shape kHead{{"embed", 3}, {"vocab", 8}};
const Shape kTokens{{"batch", 2}, {"seq", 2}};

// A tiny language model: embedding, tanh, output head, loss. Vocab-parallel over `vocab_axes`.
Tensor tiny_lm_loss(const Tensor& table, const Tensor& head, const Tensor& ids, const Tensor& targets,
                    const std::vector<std::string>& vocab_axes) {
  Tensor h = embedding(table, ids, "vocab");
  if (!vocab_axes.empty()) h = psum(h, vocab_axes);
  Tensor logits = dot(tanh(h), head, "embed");
  return cross_entropy(logits, targets, "vocab", vocab_axes);
}

// The tiny model with its vocab cut over `vocab_axes` (and the batch over `batch_axes`, if any)
// against the same model on one device: the embedding, the loss, the vary types and the gradients.
void check_vocab_parallel(const std::string& spec, const std::vector<std::string>& vocab_axes,
                          const std::vector<std::string>& batch_axes) {
  INFO("mesh " << spec << ", vocab over " << Names(vocab_axes).str());
  Tensor table = random_input(kTable, "table"), head = random_input(kHead, "head");
  Tensor ids = random_ids(kTokens, 8, "ids"), targets = random_ids(kTokens, 8, "targets");
  const double host_loss = tiny_lm_loss(table, head, ids, targets, {}).item();
  const auto host_embedded = embedding(table, ids, "vocab").to_vector<double>();

  Runtime rt = Runtime::local(Mesh::parse(spec));
  AxisRules rules{{"vocab", vocab_axes}};
  if (!batch_axes.empty()) rules.set("batch", batch_axes);
  auto program = [&](Shard& s, const std::vector<Tensor>& p) {
    Tensor loss = tiny_lm_loss(p[0], p[1], s.shard(ids, rules), s.shard(targets, rules), vocab_axes);
    return batch_axes.empty() ? loss : pmean(loss, batch_axes);  // Invariant over every mesh axis
  };
  auto losses = rt.run([&](Shard& s) {
    Tensor table_block = s.shard(table, rules), head_block = s.shard(head, rules);
    Tensor partial = embedding(table_block, s.shard(ids, rules), "vocab");
    for (const auto& m : vocab_axes) NAX_EXPECT(partial.vary().partial_sum(m));  // rows of other blocks are 0
    Tensor embedded = psum(partial, vocab_axes);
    NAX_EXPECT(s.gather(embedded).to_vector<double>() == host_embedded);  // one nonzero term per sum
    Tensor picked = pick(dot(embedded, head_block, "embed"), s.shard(targets, rules), "vocab");
    for (const auto& m : vocab_axes) NAX_EXPECT(picked.vary().partial_sum(m));
    Tensor local_loss = tiny_lm_loss(table_block, head_block, s.shard(ids, rules), s.shard(targets, rules), vocab_axes);
    for (const auto& m : vocab_axes) NAX_EXPECT(local_loss.vary().kind(m) == Vary::Invariant);
    for (const auto& m : batch_axes) NAX_EXPECT(local_loss.vary().local_mean(m));  // this device's mean
    return program(s, {table_block, head_block}).item();
  });
  for (double l : losses) REQUIRE(l == Approx(host_loss).epsilon(1e-12));
  check_mesh_gradients(rt, program, {table, head}, rules);
}

}  // namespace

TEST_CASE("vocab-parallel embedding and cross_entropy agree with one device, gradients included", "[transformer][mesh]") {
  check_vocab_parallel("mp=1", {"mp"}, {});
  check_vocab_parallel("mp=2", {"mp"}, {});
  check_vocab_parallel("mp=4", {"mp"}, {});
  check_vocab_parallel("dp=2,mp=2", {"mp"}, {"dp"});
  check_vocab_parallel("dp=2,mp=2", {"dp", "mp"}, {});  // one vocab block per device, ranked dp-major
}

TEST_CASE("layer_norm, gelu and softmax on a batch cut over dp: scale and bias gradients are summed", "[transformer][mesh]") {
  const Shape shape{{"batch", 4}, {"embed", 3}};
  Tensor x = random_input(shape, "x"), scale = random_input(Shape{{"embed", 3}}, "scale");
  Tensor bias = random_input(Shape{{"embed", 3}}, "bias"), w = random_input(shape, "w");
  for (const std::string spec : {"dp=2", "dp=2,mp=2"}) {
    INFO("mesh " << spec);
    Runtime rt = Runtime::local(Mesh::parse(spec));
    const AxisRules rules{{"batch", "dp"}};
    check_mesh_gradients(rt, [&](Shard& s, const std::vector<Tensor>& p) {
      Tensor y = softmax(gelu(layer_norm(p[0], "embed", p[1], p[2])), "embed") + log_softmax(p[0], "embed");
      return psum(sum(y * s.shard(w, rules), {"batch", "embed"}), "dp");
    }, {x, scale, bias}, rules);
  }
}

// ---------------------------------------------------------------------------------------------
// errors

TEST_CASE("transformer ops reject bad input with clear errors", "[transformer][errors]") {
  Tensor x = random_input(Shape{{"batch", 2}, {"embed", 4}}, "x");
  Tensor scale = ones(Shape{{"embed", 4}}, DType::f64), bias = zeros(Shape{{"embed", 4}}, DType::f64);
  Tensor table = random_input(Shape{{"vocab", 6}, {"embed", 3}}, "table");
  Tensor ids = ids_of(Shape{{"batch", 2}, {"seq", 2}}, {0, 1, 6, 2});

  REQUIRE_THROWS_WITH(layer_norm(x, "embed", ones(Shape{{"embed", 3}}, DType::f64), bias),
                      Contains("layer_norm") && Contains("scale must have exactly the normalised axis [embed=4]") &&
                          Contains("[embed=3]"));
  REQUIRE_THROWS_WITH(layer_norm(x, "embed", scale, ones(Shape{{"batch", 2}, {"embed", 4}}, DType::f64)),
                      Contains("bias must have exactly the normalised axis [embed=4]"));
  REQUIRE_THROWS_WITH(layer_norm(x, "model", scale, bias), Contains("layer_norm") && Contains("model"));
  REQUIRE_THROWS_WITH(layer_norm(x, "embed", cast(scale, DType::f32), bias), Contains("layer_norm") && Contains("dtype mismatch"));
  REQUIRE_THROWS_WITH(gelu(ids), Contains("gelu") && Contains("floating"));
  REQUIRE_THROWS_WITH(softmax(x, "vocab"), Contains("softmax") && Contains("vocab"));

  REQUIRE_THROWS_WITH(embedding(table, cast(ids, DType::f32), "vocab"),
                      Contains("embedding") && Contains("ids must be i32") && Contains("f32[batch=2, seq=2]"));
  REQUIRE_THROWS_WITH(embedding(table, ids, "vocab"),
                      Contains("embedding") && Contains("id 6 at [batch=1, seq=0]") && Contains("outside the vocabulary [0, 6)"));
  REQUIRE_THROWS_WITH(embedding(table, ids_of(Shape{{"seq", 2}}, {-1, 0}), "vocab"), Contains("id -1 at [seq=0]"));
  REQUIRE_THROWS_WITH(embedding(table, ids_of(Shape{{"embed", 2}}, {0, 0}), "vocab"),
                      Contains("embedding") && Contains("ids axis 'embed' is also an axis of the table"));

  Tensor logits = random_input(Shape{{"batch", 2}, {"vocab", 6}}, "logits");
  REQUIRE_THROWS_WITH(pick(logits, ids_of(Shape{{"batch", 2}}, {0, 9}), "vocab"),
                      Contains("pick") && Contains("target 9 at [batch=1]"));
  REQUIRE_THROWS_WITH(cross_entropy(logits, ids_of(Shape{{"seq", 2}}, {0, 1}), "vocab"),
                      Contains("cross_entropy") && Contains("must have exactly the axes of the logits") && Contains("[batch=2]"));
  REQUIRE_THROWS_WITH(cross_entropy(logits, ids_of(Shape{{"batch", 2}}, {0, 1}), "vocab", {"mp"}),
                      Contains("cross_entropy") && Contains("mesh_axes (mp) must be the mesh axes that cut the vocab"));

  REQUIRE_THROWS_WITH(where(ones(Shape{{"a", 3}}), ones(Shape{{"a", 3}}), ones(Shape{{"a", 4}})),
                      Contains("where") && Contains("axis 'a' has size 3 in a but 4 in b"));
  REQUIRE_THROWS_WITH(where(ones(Shape{{"a", 2}}), ones(Shape{{"a", 3}}), ones(Shape{{"a", 3}})),
                      Contains("where") && Contains("axis 'a' has size 3 in a but 2 in cond"));
  REQUIRE_THROWS_WITH(where(ones(Shape{{"a", 3}}), ones(Shape{{"a", 3}}), ones(Shape{{"a", 3}}, DType::f64)),
                      Contains("where") && Contains("dtype mismatch"));
}

TEST_CASE("row ops over an axis cut across devices are refused; ids are checked against the whole vocab",
          "[transformer][errors][mesh]") {
  Runtime rt = Runtime::local(Mesh::parse("mp=2"));
  const AxisRules cut{{"embed", "mp"}, {"vocab", "mp"}};
  Tensor x = random_input(Shape{{"batch", 2}, {"embed", 4}}, "x");
  Tensor scale = ones(Shape{{"embed", 4}}, DType::f64), bias = zeros(Shape{{"embed", 4}}, DType::f64);
  REQUIRE_THROWS_WITH(rt.run([&](Shard& s) { layer_norm(s.shard(x, cut), "embed", s.shard(scale, {}), s.shard(bias, {})); }),
                      Contains("layer_norm") && Contains("axis 'embed'") && Contains("cut over mesh axis 'mp'"));
  Tensor logits = random_input(Shape{{"batch", 2}, {"vocab", 8}}, "logits");
  REQUIRE_THROWS_WITH(rt.run([&](Shard& s) { softmax(s.shard(logits, cut), "vocab"); }),
                      Contains("softmax") && Contains("cut over mesh axis 'mp'") && Contains("vocab-parallel"));
  REQUIRE_THROWS_WITH(rt.run([&](Shard& s) { log_softmax(s.shard(logits, cut), "vocab"); }),
                      Contains("log_softmax") && Contains("vocab-parallel"));
  Tensor targets = ids_of(Shape{{"batch", 2}}, {7, 3});
  REQUIRE_THROWS_WITH(rt.run([&](Shard& s) { cross_entropy(s.shard(logits, cut), s.shard(targets, cut), "vocab"); }),
                      Contains("cross_entropy") && Contains("mesh_axes () must be the mesh axes that cut the vocab"));
  // 7 is in the global vocabulary [0, 8) though outside the first device's block; 8 is not.
  rt.run([&](Shard& s) { pick(s.shard(logits, cut), s.shard(targets, cut), "vocab"); });
  Tensor table = random_input(Shape{{"vocab", 8}, {"embed", 2}}, "table");
  REQUIRE_THROWS_WITH(rt.run([&](Shard& s) { embedding(s.shard(table, {{"vocab", "mp"}}), s.shard(ids_of(Shape{{"seq", 2}}, {8, 0}), {}), "vocab"); }),
                      Contains("embedding") && Contains("id 8 at [seq=0]") && Contains("outside the vocabulary [0, 8)"));
}
