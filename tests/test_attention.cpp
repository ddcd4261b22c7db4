// causal_attention and rotary: forward against naive loops (several layouts, the KV-cache case,
// several query blocks), gradients against finite differences in f64 on the host and with heads
// cut over mp on meshes, the memory bound of the fused op (no [batch x heads x seq x seq] tensor),
// rotary's relative-position invariant, and the error messages.
#include <cmath>
#include <limits>

#include "grad_check.h"

using namespace nax;
using Catch::Matchers::Contains;
using nax::testing::check_gradients;
using nax::testing::check_mesh_gradients;
using nax::testing::for_each_index;
using nax::testing::GradCheckOptions;
using nax::testing::max_rel_error;
using nax::testing::random_input;
using nax::testing::weighted_sum;

namespace {

using Index = std::map<std::string, std::int64_t>;

std::int64_t offset_of(const Shape& shape, const Index& index) {
  const auto strides = shape.strides();
  std::int64_t offset = 0;
  for (int i = 0; i < shape.rank(); ++i) offset += index.at(shape[i].name) * strides[static_cast<std::size_t>(i)];
  return offset;
}

Shape without(const Shape& shape, const std::vector<std::string>& names) {
  std::vector<Axis> axes;
  for (const auto& a : shape.axes())
    if (std::find(names.begin(), names.end(), a.name) == names.end()) axes.push_back(a);
  return Shape(axes);
}

// softmax(q k^T / sqrt(D) + causal mask) v with the [Tq x Tk] scores of each batch index
// materialised, in f64; the values in q's layout.
std::vector<double> reference_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  const auto qv = q.to_vector<double>(), kv = k.to_vector<double>(), vv = v.to_vector<double>();
  const std::int64_t tq = q.size("seq"), tk = k.size("seq"), d = q.size("head_dim");
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> out(qv.size());
  for_each_index(without(q.shape(), {"seq", "head_dim"}), [&](Index index) {
    std::vector<double> scores(static_cast<std::size_t>(tq * tk));
    auto element = [&](const Tensor& t, const std::vector<double>& values, std::int64_t s, std::int64_t h) {
      index["seq"] = s, index["head_dim"] = h;
      return values[static_cast<std::size_t>(offset_of(t.shape(), index))];
    };
    for (std::int64_t i = 0; i < tq; ++i)
      for (std::int64_t j = 0; j < tk; ++j) {
        double s = 0;
        for (std::int64_t h = 0; h < d; ++h) s += element(q, qv, i, h) * element(k, kv, j, h);
        const bool masked = j > i + tk - tq;
        scores[static_cast<std::size_t>(i * tk + j)] = s * scale + (masked ? -INFINITY : 0.0);
      }
    for (std::int64_t i = 0; i < tq; ++i) {
      double* row = scores.data() + i * tk;
      const double top = *std::max_element(row, row + tk);
      double total = 0;
      for (std::int64_t j = 0; j < tk; ++j) total += row[j] = std::exp(row[j] - top);
      for (std::int64_t h = 0; h < d; ++h) {
        double o = 0;
        for (std::int64_t j = 0; j < tk; ++j) o += row[j] / total * element(v, vv, j, h);
        index["seq"] = i, index["head_dim"] = h;
        out[static_cast<std::size_t>(offset_of(q.shape(), index))] = o;
      }
    }
  });
  return out;
}

// The same attention composed of primitive ops (scores materialised), for gradients at sizes
// too large for finite differences.
Tensor composite_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  const std::int64_t tq = q.size("seq"), tk = k.size("seq");
  std::vector<double> mask(static_cast<std::size_t>(tq * tk));
  for (std::int64_t i = 0; i < tq; ++i)
    for (std::int64_t j = 0; j < tk; ++j) mask[static_cast<std::size_t>(i * tk + j)] = j > i + tk - tq ? -1e9 : 0.0;
  Tensor scores = dot(q, rename(k, "seq", "kseq"), "head_dim") * (1.0 / std::sqrt(static_cast<double>(q.size("head_dim"))));
  scores = scores + from_vector(Shape{{"seq", tq}, {"kseq", tk}}, mask, q.dtype());
  Tensor e = exp(scores - stop_gradient(max(scores, "kseq")));
  return transpose(dot(e / sum(e, "kseq"), rename(v, "seq", "kseq"), "kseq"), q.shape().names());
}

Tensor fixed_input(const Shape& shape, std::uint64_t seed, DType dtype = DType::f64) {
  return random_normal(shape, seed, "attention input", 1.0, dtype);
}

// GPT-J's rotate_every_two form, element by element.
std::vector<double> reference_rotary(const Tensor& x, std::int64_t rotary_dims, std::int64_t offset, double base) {
  const auto xv = x.to_vector<double>();
  std::vector<double> out(xv.size());
  for_each_index(x.shape(), [&](Index index) {
    const std::int64_t h = index["head_dim"], pair = h / 2, position = index["seq"] + offset;
    const auto at = static_cast<std::size_t>(offset_of(x.shape(), index));
    if (h >= rotary_dims) {
      out[at] = xv[at];
      return;
    }
    index["head_dim"] = 2 * pair;
    const double x0 = xv[static_cast<std::size_t>(offset_of(x.shape(), index))];
    index["head_dim"] = 2 * pair + 1;
    const double x1 = xv[static_cast<std::size_t>(offset_of(x.shape(), index))];
    const double angle = static_cast<double>(position) * std::pow(base, -2.0 * static_cast<double>(pair) / static_cast<double>(rotary_dims));
    out[at] = h % 2 == 0 ? x0 * std::cos(angle) - x1 * std::sin(angle) : x1 * std::cos(angle) + x0 * std::sin(angle);
  });
  return out;
}

const GradCheckOptions kGradTolerance{1e-6, 1e-6};  // eps, tolerance on the relative difference

}  // namespace

// --- forward ---

TEST_CASE("causal_attention matches a naive reference in f64 for every layout", "[attention]") {
  const std::vector<std::vector<Shape>> layouts = {
      // q, k, v
      {Shape{{"batch", 2}, {"seq", 5}, {"heads", 3}, {"head_dim", 4}}},  // heads after seq: strided rows
      {Shape{{"batch", 2}, {"heads", 3}, {"seq", 5}, {"head_dim", 4}}},
      {Shape{{"heads", 3}, {"seq", 5}, {"batch", 2}, {"head_dim", 4}}},
      {Shape{{"head_dim", 4}, {"batch", 2}, {"seq", 5}, {"heads", 3}}},  // head_dim not last: permuted
      {Shape{{"seq", 5}, {"head_dim", 4}}},                              // no batch axes
      {Shape{{"batch", 2}, {"seq", 5}, {"heads", 3}, {"head_dim", 4}}, Shape{{"heads", 3}, {"batch", 2}, {"seq", 5}, {"head_dim", 4}},
       Shape{{"seq", 5}, {"head_dim", 4}, {"batch", 2}, {"heads", 3}}},  // k and v in orders of their own
  };
  std::uint64_t seed = 1;
  for (const auto& shapes : layouts) {
    const Shape& qs = shapes[0];
    Tensor q = fixed_input(qs, seed++), k = fixed_input(shapes.size() > 1 ? shapes[1] : qs, seed++);
    Tensor v = fixed_input(shapes.size() > 2 ? shapes[2] : qs, seed++);
    INFO("q " << q.str() << " k " << k.str() << " v " << v.str());
    Tensor out = causal_attention(q, k, v, "seq", "head_dim");
    REQUIRE(out.shape() == q.shape());
    REQUIRE(out.dtype() == DType::f64);
    REQUIRE(max_rel_error(out.to_vector<double>(), reference_attention(q, k, v)) <= 1e-12);
  }
}

TEST_CASE("causal_attention with a KV cache: queries sit at the last positions", "[attention]") {
  const Shape q_shape{{"batch", 2}, {"seq", 3}, {"heads", 2}, {"head_dim", 4}};
  const Shape kv_shape{{"batch", 2}, {"seq", 7}, {"heads", 2}, {"head_dim", 4}};
  Tensor q_full = fixed_input(kv_shape, 11), k = fixed_input(kv_shape, 12), v = fixed_input(kv_shape, 13);
  Tensor q = contiguous_copy(slice(q_full, "seq", 4, 7));
  REQUIRE(q.shape() == q_shape);
  Tensor out = causal_attention(q, k, v, "seq", "head_dim");
  REQUIRE(max_rel_error(out.to_vector<double>(), reference_attention(q, k, v)) <= 1e-12);
  // The last rows of the full causal attention are the cached-decoding rows.
  Tensor full_tail = contiguous_copy(slice(causal_attention(q_full, k, v, "seq", "head_dim"), "seq", 4, 7));
  REQUIRE(max_rel_error(out.to_vector<double>(), full_tail.to_vector<double>()) <= 1e-12);
  // One query against the whole cache.
  Tensor last = contiguous_copy(slice(q_full, "seq", 6, 7));
  REQUIRE(max_rel_error(causal_attention(last, k, v, "seq", "head_dim").to_vector<double>(), reference_attention(last, k, v)) <= 1e-12);
  // No queries: an empty result, and zero gradients for the cache.
  Tensor none = zeros(Shape{{"batch", 2}, {"seq", 0}, {"heads", 2}, {"head_dim", 4}}, DType::f64);
  const auto grads = value_and_grad([](auto& p) {
                        Tensor out = causal_attention(p[0], p[1], p[2], "seq", "head_dim");
                        return sum(out, out.shape().names());
                      }, {none, k, v}).second;
  REQUIRE(grads[1].to_vector<double>() == std::vector<double>(static_cast<std::size_t>(k.numel()), 0.0));
  REQUIRE(grads[2].shape() == v.shape());
}

TEST_CASE("causal_attention over several query blocks, with and without a cache", "[attention]") {
  for (auto [tq, tk] : {std::pair<std::int64_t, std::int64_t>{300, 300}, {200, 261}}) {
    INFO("tq " << tq << " tk " << tk);
    Tensor q = fixed_input(Shape{{"seq", tq}, {"heads", 2}, {"head_dim", 8}}, 21);
    Tensor k = fixed_input(Shape{{"seq", tk}, {"heads", 2}, {"head_dim", 8}}, 22);
    Tensor v = fixed_input(Shape{{"heads", 2}, {"seq", tk}, {"head_dim", 8}}, 23);
    REQUIRE(max_rel_error(causal_attention(q, k, v, "seq", "head_dim").to_vector<double>(), reference_attention(q, k, v)) <= 1e-12);
  }
}

TEST_CASE("causal_attention in f32 and bf16 against the f64 reference", "[attention]") {
  const Shape shape{{"batch", 2}, {"seq", 70}, {"heads", 3}, {"head_dim", 16}};
  for (auto [dtype, tolerance] : {std::pair{DType::f32, 2e-6}, {DType::bf16, 2e-2}}) {
    INFO(dtype_name(dtype));
    Tensor q = fixed_input(shape, 31, dtype), k = fixed_input(shape, 32, dtype), v = fixed_input(shape, 33, dtype);
    Tensor out = causal_attention(q, k, v, "seq", "head_dim");
    REQUIRE(out.dtype() == dtype);
    REQUIRE(out.shape() == shape);
    // The reference sees the same (rounded) input values, in f64.
    REQUIRE(max_rel_error(out.to_vector<double>(), reference_attention(q, k, v)) <= tolerance);
  }
}

// --- gradients ---

TEST_CASE("causal_attention gradients against finite differences", "[attention]") {
  // f64, eps 1e-6, |analytic - numeric| / max(1, |analytic|, |numeric|) <= 1e-6; fresh inputs per run.
  const Shape shape{{"batch", 2}, {"seq", 3}, {"heads", 2}, {"head_dim", 3}};
  auto attention_loss = [](const std::vector<Tensor>& p) { return weighted_sum(causal_attention(p[0], p[1], p[2], "seq", "head_dim")); };
  SECTION("heads after seq") {
    check_gradients(attention_loss, {random_input(shape, "q"), random_input(shape, "k"), random_input(shape, "v")}, kGradTolerance);
  }
  SECTION("head_dim first, k and v in other orders") {
    const Shape q_shape{{"head_dim", 3}, {"seq", 3}, {"batch", 2}, {"heads", 2}};
    const Shape k_shape{{"heads", 2}, {"seq", 3}, {"head_dim", 3}, {"batch", 2}};
    check_gradients(attention_loss, {random_input(q_shape, "q"), random_input(k_shape, "k"), random_input(shape, "v")}, kGradTolerance);
  }
  SECTION("KV cache: k and v longer than q") {
    const Shape kv_shape{{"batch", 2}, {"seq", 5}, {"heads", 2}, {"head_dim", 3}};
    check_gradients(attention_loss, {random_input(shape, "q"), random_input(kv_shape, "k"), random_input(kv_shape, "v")},
                    kGradTolerance);
  }
  SECTION("only some inputs take gradients") {
    Tensor k = random_input(shape, "k"), v = random_input(shape, "v");
    check_gradients([&](const std::vector<Tensor>& p) { return weighted_sum(causal_attention(p[0], k, v, "seq", "head_dim")); },
                    {random_input(shape, "q")}, kGradTolerance);
  }
}

TEST_CASE("causal_attention gradients over several query blocks match the composed ops", "[attention]") {
  for (auto [tq, tk] : {std::pair<std::int64_t, std::int64_t>{260, 260}, {150, 270}}) {
    INFO("tq " << tq << " tk " << tk);
    std::vector<Tensor> inputs = {random_input(Shape{{"seq", tq}, {"heads", 2}, {"head_dim", 4}}, "q"),
                                  random_input(Shape{{"seq", tk}, {"heads", 2}, {"head_dim", 4}}, "k"),
                                  random_input(Shape{{"heads", 2}, {"seq", tk}, {"head_dim", 4}}, "v")};
    auto fused = value_and_grad([](auto& p) { return weighted_sum(causal_attention(p[0], p[1], p[2], "seq", "head_dim")); }, inputs);
    auto composed = value_and_grad([](auto& p) { return weighted_sum(composite_attention(p[0], p[1], p[2])); }, inputs);
    REQUIRE(std::abs(fused.first.item() - composed.first.item()) <= 1e-10 * std::max(1.0, std::abs(composed.first.item())));
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      INFO("input " << i);
      REQUIRE(fused.second[i].shape() == inputs[i].shape());
      REQUIRE(max_rel_error(fused.second[i].to_vector<double>(), composed.second[i].to_vector<double>()) <= 1e-10);
    }
  }
}

TEST_CASE("causal_attention on a mesh: heads over mp, batch over dp", "[attention][mesh]") {
  for (const char* mesh : {"mp=2", "dp=2,mp=2"}) {
    INFO(mesh);
    Runtime rt = Runtime::local(Mesh::parse(mesh));
    AxisRules rules{{"heads", "mp"}};
    if (rt.mesh().has("dp")) rules.set("batch", {"dp"});
    const Shape shape{{"batch", 2}, {"seq", 3}, {"heads", 4}, {"head_dim", 2}};
    const std::vector<Tensor> globals = {random_input(shape, "q"), random_input(shape, "k"), random_input(shape, "v")};

    // Forward: each device's block of the host result, vary Split like the inputs.
    const Tensor host = causal_attention(globals[0], globals[1], globals[2], "seq", "head_dim");
    const auto results = rt.run([&](Shard& s) {
      Tensor out = causal_attention(s.shard(globals[0], rules), s.shard(globals[1], rules), s.shard(globals[2], rules), "seq", "head_dim");
      NAX_EXPECT(out.vary() == s.shard(globals[0], rules).vary());
      return s.gather(out).to_vector<double>();
    });
    REQUIRE(max_rel_error(results[0], host.to_vector<double>()) <= 1e-12);

    // Gradients: the loss is the psum over mp of each device's sum over its heads, pmean over dp.
    check_mesh_gradients(
        rt,
        [](Shard& s, const std::vector<Tensor>& p) {
          Tensor out = causal_attention(p[0], p[1], p[2], "seq", "head_dim");
          Tensor loss = psum(sum(out * out * out, out.shape().names()), "mp");
          return s.mesh().has("dp") ? pmean(loss, "dp") : loss;
        },
        globals, rules, kGradTolerance);
  }
}

TEST_CASE("causal_attention forward and backward never hold a [batch x heads x seq x seq] tensor", "[attention][memory]") {
  constexpr std::int64_t kBatch = 2, kHeads = 8, kSeq = 256, kHeadDim = 16;
  constexpr std::size_t kScoresBytes = kBatch * kHeads * kSeq * kSeq * sizeof(float);  // 4 MiB
  Runtime rt = Runtime::local(Mesh::parse("x=1"));
  const auto peaks = rt.run([](Shard& s) {
    const Shape shape{{"batch", kBatch}, {"seq", kSeq}, {"heads", kHeads}, {"head_dim", kHeadDim}};
    Tensor q = parameter(random_normal(shape, 1, "q")), k = parameter(random_normal(shape, 2, "k"));
    Tensor v = parameter(random_normal(shape, 3, "v"));
    const std::size_t inputs = s.memory().bytes_in_use;
    s.device_ptr()->allocator().reset_peak();
    Tensor out = causal_attention(q, k, v, "seq", "head_dim");
    auto grads = grad(sum(out, out.shape().names()), {q, k, v});
    NAX_EXPECT(grads[2].shape() == shape);
    return std::pair{inputs, s.memory().peak_bytes_in_use};
  });
  const auto [inputs, peak] = peaks[0];
  INFO("inputs " << inputs << " B, peak " << peak << " B, one scores tensor " << kScoresBytes << " B");
  // q, k, v, out, dout and dq, dk, dv are 256 KiB each; the scratch is at most 2 x [128 x 256] f32.
  REQUIRE(peak < kScoresBytes);
  REQUIRE(peak - inputs < kScoresBytes / 2);
}

// --- rotary ---

TEST_CASE("rotary matches GPT-J's rotate_every_two in any layout", "[attention][rotary]") {
  const std::vector<Shape> shapes = {Shape{{"batch", 2}, {"seq", 5}, {"heads", 3}, {"head_dim", 8}},
                                     Shape{{"head_dim", 8}, {"heads", 3}, {"seq", 5}}, Shape{{"seq", 5}, {"head_dim", 6}}};
  for (const auto& shape : shapes)
    for (std::int64_t rotary_dims : {std::int64_t{0}, std::int64_t{4}, shape.size("head_dim")}) {
      INFO(shape.str() << " rotary_dims " << rotary_dims);
      Tensor x = fixed_input(shape, 41);
      Tensor out = rotary(x, "seq", "head_dim", rotary_dims, 3, 100.0);
      REQUIRE(out.shape() == shape);
      REQUIRE(max_rel_error(out.to_vector<double>(), reference_rotary(x, rotary_dims, 3, 100.0)) <= 1e-14);
    }
  Tensor x32 = fixed_input(shapes[0], 42, DType::f32);
  REQUIRE(max_rel_error(rotary(x32, "seq", "head_dim", 4, 1000).to_vector<double>(), reference_rotary(x32, 4, 1000, 10000.0)) <= 1e-5);
  Tensor x16 = fixed_input(shapes[0], 43, DType::bf16);
  Tensor out16 = rotary(x16, "seq", "head_dim", 8);
  REQUIRE(out16.dtype() == DType::bf16);
  REQUIRE(max_rel_error(out16.to_vector<double>(), reference_rotary(x16, 8, 0, 10000.0)) <= 2e-2);
}

TEST_CASE("rotary gradients against finite differences", "[attention][rotary]") {
  const Shape shape{{"batch", 2}, {"seq", 4}, {"heads", 2}, {"head_dim", 6}};
  check_gradients([](auto& p) { return weighted_sum(rotary(p[0], "seq", "head_dim", 4, 5, 50.0)); }, {random_input(shape, "x")},
                  kGradTolerance);
  check_gradients([](auto& p) { return weighted_sum(rotary(transpose(p[0], {"head_dim", "seq", "batch", "heads"}), "seq", "head_dim", 6)); },
                  {random_input(shape, "x")}, kGradTolerance);
}

TEST_CASE("rotary: q . k depends only on the relative position", "[attention][rotary]") {
  const Shape shape{{"seq", 6}, {"head_dim", 8}};
  Tensor q = fixed_input(shape, 51), k = fixed_input(shape, 52);
  auto scores = [&](std::int64_t offset) {
    return dot(rotary(q, "seq", "head_dim", 8, offset), rename(rotary(k, "seq", "head_dim", 8, offset), "seq", "kseq"), "head_dim")
        .to_vector<double>();
  };
  // Both moved by the same offset: every score is unchanged.
  REQUIRE(max_rel_error(scores(0), scores(37)) <= 1e-12);
  REQUIRE(max_rel_error(scores(0), scores(1000)) <= 1e-10);
  // One vector at every position: the score of (i, j) is a function of i - j.
  const auto first = slice(q, "seq", 0, 1).to_vector<double>();
  std::vector<double> repeated;
  for (int i = 0; i < 6; ++i) repeated.insert(repeated.end(), first.begin(), first.end());
  Tensor rotated = rotary(from_vector(shape, repeated), "seq", "head_dim", 8);
  const auto same = dot(rotated, rename(rotated, "seq", "kseq"), "head_dim").to_vector<double>();
  for (std::size_t i = 1; i < 6; ++i)
    for (std::size_t j = 1; j < 6; ++j) REQUIRE(std::abs(same[i * 6 + j] - same[(i - 1) * 6 + j - 1]) <= 1e-12);
}

// --- errors ---

TEST_CASE("causal_attention and rotary: clear errors on bad input", "[attention][errors]") {
  const Shape shape{{"batch", 2}, {"seq", 3}, {"heads", 2}, {"head_dim", 4}};
  Tensor q = zeros(shape), k = zeros(shape), v = zeros(shape);
  auto attention = [](const Tensor& a, const Tensor& b, const Tensor& c) { return causal_attention(a, b, c, "seq", "head_dim"); };
  REQUIRE_THROWS_WITH(causal_attention(q, k, v, "sek", "head_dim"), Contains("causal_attention") && Contains("'sek'") && Contains("[batch=2"));
  REQUIRE_THROWS_WITH(causal_attention(q, k, v, "seq", "seq"), Contains("causal_attention") && Contains("same axis 'seq'"));
  REQUIRE_THROWS_WITH(attention(q, zeros(Shape{{"batch", 2}, {"seq", 3}, {"heads", 3}, {"head_dim", 4}}), v),
                      Contains("causal_attention") && Contains("axis 'heads' has size 2 in q but 3 in k"));
  REQUIRE_THROWS_WITH(attention(q, k, zeros(Shape{{"batch", 2}, {"seq", 3}, {"head_dim", 4}})),
                      Contains("causal_attention") && Contains("v lacks axis 'heads'"));
  REQUIRE_THROWS_WITH(attention(q, zeros(Shape{{"batch", 2}, {"seq", 3}, {"heads", 2}, {"head_dim", 4}, {"x", 1}}), v),
                      Contains("k has axis 'x' that q lacks"));
  REQUIRE_THROWS_WITH(attention(q, zeros(Shape{{"batch", 2}, {"seq", 2}, {"heads", 2}, {"head_dim", 4}}),
                                zeros(Shape{{"batch", 2}, {"seq", 2}, {"heads", 2}, {"head_dim", 4}})),
                      Contains("causal_attention") && Contains("shorter along 'seq' (2) than q (3)"));
  REQUIRE_THROWS_WITH(attention(q, zeros(Shape{{"batch", 2}, {"seq", 4}, {"heads", 2}, {"head_dim", 4}}), v),
                      Contains("causal_attention") && Contains("k and v differ in length along 'seq' (4 and 3)"));
  REQUIRE_THROWS_WITH(attention(q, zeros(shape, DType::f64), v), Contains("causal_attention") && Contains("dtype mismatch"));
  REQUIRE_THROWS_WITH(attention(zeros(shape, DType::i32), zeros(shape, DType::i32), zeros(shape, DType::i32)),
                      Contains("causal_attention") && Contains("floating"));

  REQUIRE_THROWS_WITH(rotary(q, "seq", "head_dim", 3), Contains("rotary") && Contains("rotary_dims 3") && Contains("'head_dim'"));
  REQUIRE_THROWS_WITH(rotary(q, "seq", "head_dim", 6), Contains("rotary") && Contains("rotary_dims 6") && Contains("size 4"));
  REQUIRE_THROWS_WITH(rotary(q, "pos", "head_dim", 2), Contains("rotary") && Contains("'pos'") && Contains("[batch=2"));
  REQUIRE_THROWS_WITH(rotary(q, "seq", "dim", 2), Contains("rotary") && Contains("'dim'"));
}

TEST_CASE("causal_attention and rotary refuse seq or head_dim cut over a mesh axis", "[attention][errors][mesh]") {
  Runtime rt = Runtime::local(Mesh::parse("mp=2"));
  const Shape shape{{"batch", 2}, {"seq", 4}, {"heads", 2}, {"head_dim", 4}};
  const Tensor x = zeros(shape);
  for (const char* axis : {"seq", "head_dim"}) {
    INFO(axis);
    const AxisRules cut{{axis, "mp"}};
    REQUIRE_THROWS_WITH(rt.run([&](Shard& s) {
      Tensor t = s.shard(x, cut);
      causal_attention(t, t, t, "seq", "head_dim");
    }), Contains("causal_attention") && Contains(fmt::format("axis '{}' of q is cut over mesh axis 'mp'", axis)));
    REQUIRE_THROWS_WITH(rt.run([&](Shard& s) { rotary(s.shard(x, cut), "seq", "head_dim", 2); }),
                        Contains("rotary") && Contains(fmt::format("axis '{}' is cut over mesh axis 'mp'", axis)));
  }
  // Heads cut on q but whole on k: the vary rules refuse the mix.
  REQUIRE_THROWS_WITH(rt.run([&](Shard& s) {
    causal_attention(s.shard(x, {{"heads", "mp"}}), s.shard(zeros(Shape{{"batch", 2}, {"seq", 4}, {"heads", 1}, {"head_dim", 4}}), {}),
                     s.shard(x, {{"heads", "mp"}}), "seq", "head_dim");
  }), Contains("causal_attention") && Contains("'heads'") && Contains("whole in another"));
}
