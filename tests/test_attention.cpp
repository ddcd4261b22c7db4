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

// Random q, k and v of one shape.
std::vector<Tensor> qkv(const Shape& shape) { return {random_input(shape, "q"), random_input(shape, "k"), random_input(shape, "v")}; }

// `rules`, and the batch over dp where the mesh has dp.
AxisRules with_batch_over_dp(AxisRules rules, const Mesh& mesh) {
  if (mesh.has("dp")) rules.set("batch", {"dp"});
  return rules;
}

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

// Which keys query i sees in the references: j <= i + query_offset, or all.
struct Visible {
  std::int64_t query_offset = 0;
  bool all = false;
  bool operator()(std::int64_t i, std::int64_t j) const { return all || j <= i + query_offset; }
};

struct Reference {
  std::vector<double> out;  // in q's layout
  std::vector<double> lse;  // [q's other axes in order, seq]: attention_block's layout
};

// softmax(q k^T / sqrt(D) + mask) v and each row's log-sum-exp, with the [Tq x Tk] scores of each
// batch index materialised, in f64. A row that sees no key: out 0, lse -inf.
Reference reference_block(const Tensor& q, const Tensor& k, const Tensor& v, Visible visible) {
  const auto qv = q.to_vector<double>(), kv = k.to_vector<double>(), vv = v.to_vector<double>();
  const std::int64_t tq = q.size("seq"), tk = k.size("seq"), d = q.size("head_dim");
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Reference r{std::vector<double>(qv.size()), {}};
  for_each_index(without(q.shape(), {"seq", "head_dim"}), [&](Index index) {
    auto element = [&](const Tensor& t, const std::vector<double>& values, std::int64_t s, std::int64_t h) {
      index["seq"] = s, index["head_dim"] = h;
      return values[static_cast<std::size_t>(offset_of(t.shape(), index))];
    };
    for (std::int64_t i = 0; i < tq; ++i) {
      std::vector<double> row(static_cast<std::size_t>(tk), -INFINITY);
      for (std::int64_t j = 0; j < tk; ++j) {
        if (!visible(i, j)) continue;
        double s = 0;
        for (std::int64_t h = 0; h < d; ++h) s += element(q, qv, i, h) * element(k, kv, j, h);
        row[static_cast<std::size_t>(j)] = s * scale;
      }
      const double top = tk > 0 ? *std::max_element(row.begin(), row.end()) : -INFINITY;
      double total = 0;
      for (double& x : row) total += x = top == -INFINITY ? 0.0 : std::exp(x - top);
      r.lse.push_back(top == -INFINITY ? -INFINITY : top + std::log(total));
      for (std::int64_t h = 0; h < d; ++h) {
        double o = 0;
        for (std::int64_t j = 0; j < tk; ++j) o += total > 0 ? row[static_cast<std::size_t>(j)] / total * element(v, vv, j, h) : 0.0;
        index["seq"] = i, index["head_dim"] = h;
        r.out[static_cast<std::size_t>(offset_of(q.shape(), index))] = o;
      }
    }
  });
  return r;
}

// causal_attention's: queries at the last positions of the keys.
std::vector<double> reference_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  return reference_block(q, k, v, Visible{k.size("seq") - q.size("seq")}).out;
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
    check_gradients(attention_loss, qkv(shape), kGradTolerance);
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
    const AxisRules rules = with_batch_over_dp({{"heads", "mp"}}, rt.mesh());
    const std::vector<Tensor> globals = qkv(Shape{{"batch", 2}, {"seq", 3}, {"heads", 4}, {"head_dim", 2}});

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

// --- attention_block and combine_attention: the pieces of attention over a sequence in blocks ---

namespace {

// Element-wise (an infinite lse, a row that sees no key, must be matched exactly).
void require_block_matches(const AttentionBlock& got, const Reference& want, double tolerance) {
  nax::testing::require_close(got.out.to_vector<double>(), want.out, tolerance);
  nax::testing::require_close(got.lse.to_vector<double>(), want.lse, tolerance);
}

// out and lse of `block` as one scalar, so that gradients flow from both.
Tensor block_loss(const AttentionBlock& block) { return weighted_sum(block.out, 7) + weighted_sum(block.lse, 8); }

std::vector<std::pair<int, int>> ring_pairs(int n) {
  std::vector<std::pair<int, int>> pairs;
  for (int i = 0; i < n; ++i) pairs.push_back({i, (i + 1) % n});
  return pairs;
}

// Ring attention over `cp`, written per shard: device r holds block r of the queries, keys and
// values (contiguous blocks of `seq`); the key and value blocks travel around the ring (started
// ppermutes, overlapping the block in hand), each attended under the mask of where it sits.
// `skip_masked`: blocks from after the queries are not computed (else attended, all masked).
Tensor ring_attention(Shard& s, const Tensor& q, const Tensor& k, const Tensor& v, bool skip_masked) {
  const int n = s.mesh().axis_size("cp"), r = s.coord("cp");
  const std::int64_t block = q.size("seq");
  Tensor k_block = k, v_block = v;
  AttentionBlock total;
  for (int step = 0; step < n; ++step) {
    Pending<Tensor> k_next, v_next;
    if (step + 1 < n) k_next = start_ppermute(k_block, "cp", ring_pairs(n)), v_next = start_ppermute(v_block, "cp", ring_pairs(n));
    const int source = (r - step + n) % n;
    if (source <= r || !skip_masked) {
      const AttentionBlock b = attention_block(q, k_block, v_block, "seq", "head_dim", AttentionMask::causal((r - source) * block));
      total = step == 0 ? b : combine_attention(total, b);
    }
    if (step + 1 < n) k_block = k_next.wait(), v_block = v_next.wait();
  }
  return total.out;
}

}  // namespace

TEST_CASE("attention_block matches the f64 reference under every mask", "[attention][block]") {
  struct Case {
    std::int64_t tq, tk;
    AttentionMask mask;
    Visible visible;
  };
  const std::vector<Case> cases = {
      {6, 6, AttentionMask::causal(), {0}},              // a block against itself
      {6, 9, AttentionMask::causal(3), {3}},             // causal_attention's KV-cache layout
      {6, 4, AttentionMask::causal(6), {6}},             // keys wholly before the queries: all seen
      {6, 6, AttentionMask::causal(-2), {-2}},           // keys partly after: the first two rows see none
      {5, 6, AttentionMask::causal(-6), {-6}},           // keys wholly after: out 0, lse -inf
      {7, 3, AttentionMask::full(), {0, true}},          // more queries than keys, no mask
      {300, 200, AttentionMask::causal(-40), {-40}},     // several query blocks, rows without keys among them
      {4, 0, AttentionMask::full(), {0, true}},          // no keys
  };
  std::uint64_t seed = 200;
  for (const auto& c : cases) {
    INFO("tq " << c.tq << " tk " << c.tk << " offset " << c.mask.query_offset << (c.mask.all_keys ? " full" : ""));
    for (const auto& layout : {std::vector<std::string>{"batch", "seq", "heads", "head_dim"}, {"heads", "head_dim", "seq", "batch"}}) {
      auto shape = [&](std::int64_t len) {
        std::vector<Axis> axes;
        for (const auto& name : layout)
          axes.push_back({name, name == "seq" ? len : name == "batch" ? 2 : name == "heads" ? 3 : 4});
        return Shape(axes);
      };
      Tensor q = fixed_input(shape(c.tq), seed++), k = fixed_input(shape(c.tk), seed++), v = fixed_input(shape(c.tk), seed++);
      const AttentionBlock got = attention_block(q, k, v, "seq", "head_dim", c.mask);
      REQUIRE(got.out.shape() == q.shape());
      std::vector<Axis> lse_axes = without(q.shape(), {"seq", "head_dim"}).axes();
      lse_axes.push_back({"seq", c.tq});
      REQUIRE(got.lse.shape() == Shape(lse_axes));
      REQUIRE(got.lse.dtype() == DType::f64);
      require_block_matches(got, reference_block(q, k, v, c.visible), 1e-12);
    }
  }
}

TEST_CASE("attention_block in bf16: f32 lse, bf16 out, against the f64 reference", "[attention][block]") {
  const Shape qs{{"batch", 2}, {"seq", 40}, {"heads", 2}, {"head_dim", 16}}, ks{{"batch", 2}, {"seq", 24}, {"heads", 2}, {"head_dim", 16}};
  Tensor q = fixed_input(qs, 301, DType::bf16), k = fixed_input(ks, 302, DType::bf16), v = fixed_input(ks, 303, DType::bf16);
  const AttentionBlock got = attention_block(q, k, v, "seq", "head_dim", AttentionMask::causal(-8));
  REQUIRE(got.out.dtype() == DType::bf16);
  REQUIRE(got.lse.dtype() == DType::f32);
  require_block_matches(got, reference_block(q, k, v, Visible{-8}), 2e-2);
}

TEST_CASE("attention_block gradients from out and lse against finite differences", "[attention][block]") {
  const Shape qs{{"batch", 2}, {"seq", 4}, {"heads", 2}, {"head_dim", 3}}, ks{{"heads", 2}, {"seq", 3}, {"head_dim", 3}, {"batch", 2}};
  for (const AttentionMask mask : {AttentionMask::causal(), AttentionMask::causal(1), AttentionMask::full()}) {
    INFO("offset " << mask.query_offset << (mask.all_keys ? " full" : ""));
    auto loss = [mask](const std::vector<Tensor>& p) { return block_loss(attention_block(p[0], p[1], p[2], "seq", "head_dim", mask)); };
    check_gradients(loss, {random_input(qs, "q"), random_input(ks, "k"), random_input(ks, "v")}, kGradTolerance);
  }
  SECTION("only lse used: out's node still runs, with lse's gradient") {
    auto loss = [](const std::vector<Tensor>& p) { return weighted_sum(attention_block(p[0], p[1], p[2], "seq", "head_dim").lse); };
    check_gradients(loss, {random_input(qs, "q"), random_input(ks, "k"), random_input(ks, "v")}, kGradTolerance);
  }
}

TEST_CASE("attention_block: rows that see no key have zero gradients, never NaN", "[attention][block]") {
  const Shape shape{{"seq", 6}, {"heads", 2}, {"head_dim", 4}};
  const std::vector<Tensor> inputs = qkv(shape);
  // The first three rows see no key; out of them is 0, and the loss reads only out (lse is -inf there).
  const auto grads = value_and_grad([](auto& p) { return weighted_sum(attention_block(p[0], p[1], p[2], "seq", "head_dim",
                                                                                      AttentionMask::causal(-3)).out); },
                                    inputs).second;
  const auto dq = grads[0].to_vector<double>();
  for (double x : dq) REQUIRE(std::isfinite(x));
  for (std::int64_t i = 0; i < 3 * 2 * 4; ++i) REQUIRE(dq[static_cast<std::size_t>(i)] == 0.0);
  // dk and dv: only the keys the last three rows see (0..2) take gradients.
  const auto dv = grads[2].to_vector<double>();
  for (std::int64_t i = 3 * 2 * 4; i < 6 * 2 * 4; ++i) REQUIRE(dv[static_cast<std::size_t>(i)] == 0.0);
}

TEST_CASE("combine_attention of two key blocks equals attention over both, values and gradients", "[attention][block]") {
  // Queries at positions 8..15 of a causal sequence, keys 0..15 in two blocks: 0..9 and 10..15.
  const Shape qs{{"batch", 2}, {"seq", 8}, {"heads", 2}, {"head_dim", 4}};
  const std::vector<Tensor> inputs = {random_input(qs, "q"), random_input(Shape{{"batch", 2}, {"seq", 16}, {"heads", 2}, {"head_dim", 4}}, "k"),
                                      random_input(Shape{{"batch", 2}, {"seq", 16}, {"heads", 2}, {"head_dim", 4}}, "v")};
  auto whole = [](const std::vector<Tensor>& p) { return attention_block(p[0], p[1], p[2], "seq", "head_dim", AttentionMask::causal(8)); };
  // The queries' first position `at`; the keys cut at `cut`.
  auto blocks = [](const std::vector<Tensor>& p, std::int64_t at, std::int64_t cut) {
    const std::int64_t end = p[1].size("seq");
    auto part = [&](std::int64_t begin, std::int64_t stop) {
      return attention_block(p[0], slice(p[1], "seq", begin, stop), slice(p[2], "seq", begin, stop), "seq", "head_dim",
                             AttentionMask::causal(at - begin));
    };
    return combine_attention(part(0, cut), part(cut, end));
  };
  auto in_blocks = [&](const std::vector<Tensor>& p) { return blocks(p, 8, 10); };
  const AttentionBlock a = whole(inputs), b = in_blocks(inputs);
  REQUIRE(max_rel_error(b.out.to_vector<double>(), a.out.to_vector<double>()) <= 1e-12);
  REQUIRE(max_rel_error(b.lse.to_vector<double>(), a.lse.to_vector<double>()) <= 1e-12);
  require_block_matches(b, reference_block(inputs[0], inputs[1], inputs[2], Visible{8}), 1e-12);
  const auto g_whole = value_and_grad([&](auto& p) { return block_loss(whole(p)); }, inputs).second;
  const auto g_blocks = value_and_grad([&](auto& p) { return block_loss(in_blocks(p)); }, inputs).second;
  for (std::size_t i = 0; i < inputs.size(); ++i) REQUIRE(max_rel_error(g_blocks[i].to_vector<double>(), g_whole[i].to_vector<double>()) <= 1e-10);
  // And against finite differences, through the combine.
  check_gradients([&](const std::vector<Tensor>& p) { return block_loss(blocks(p, 2, 3)); },
                  {random_input(Shape{{"seq", 3}, {"head_dim", 2}}, "q"), random_input(Shape{{"seq", 5}, {"head_dim", 2}}, "k"),
                   random_input(Shape{{"seq", 5}, {"head_dim", 2}}, "v")},
                  kGradTolerance);
}

TEST_CASE("combine_attention with blocks that see nothing: identity, and no NaN", "[attention][block]") {
  const Shape shape{{"seq", 4}, {"head_dim", 3}};
  const std::vector<Tensor> inputs = qkv(shape);
  auto program = [](const std::vector<Tensor>& p, std::int64_t empty_offset) {
    const AttentionBlock seen = attention_block(p[0], p[1], p[2], "seq", "head_dim");
    const AttentionBlock none = attention_block(p[0], p[1], p[2], "seq", "head_dim", AttentionMask::causal(empty_offset));
    return std::pair{combine_attention(none, seen), combine_attention(none, none)};
  };
  const auto [one, neither] = program(inputs, -4);
  require_block_matches(one, reference_block(inputs[0], inputs[1], inputs[2], Visible{0}), 1e-12);
  require_block_matches(neither, reference_block(inputs[0], inputs[1], inputs[2], Visible{-4}), 0.0);
  const auto grads = value_and_grad([&](auto& p) {
                       const auto [a, b] = program(p, -4);
                       return weighted_sum(a.out) + weighted_sum(b.out);
                     }, inputs).second;
  const auto want = value_and_grad([](auto& p) { return weighted_sum(attention_block(p[0], p[1], p[2], "seq", "head_dim").out); },
                                   inputs).second;
  for (std::size_t i = 0; i < inputs.size(); ++i) REQUIRE(max_rel_error(grads[i].to_vector<double>(), want[i].to_vector<double>()) <= 1e-12);
}

TEST_CASE("ring attention over cp written per shard equals causal attention, values and gradients", "[attention][block][mesh]") {
  for (const char* mesh : {"cp=2", "cp=4", "dp=2,cp=2"}) {
    Runtime rt = Runtime::local(Mesh::parse(mesh));
    const AxisRules rules = with_batch_over_dp({{"seq", "cp"}}, rt.mesh());
    const std::vector<Tensor> globals = qkv(Shape{{"batch", 2}, {"seq", 8}, {"heads", 2}, {"head_dim", 3}});
    const Tensor host = causal_attention(globals[0], globals[1], globals[2], "seq", "head_dim");
    for (bool skip_masked : {true, false}) {
      INFO(mesh << (skip_masked ? " skipping masked blocks" : " attending masked blocks"));
      const auto results = rt.run([&](Shard& s) {
        const Tensor q = s.shard(globals[0], rules);
        const Tensor out = ring_attention(s, q, s.shard(globals[1], rules), s.shard(globals[2], rules), skip_masked);
        NAX_EXPECT(out.vary() == q.vary());  // cut along seq as q is, without a cast
        return s.gather(out).to_vector<double>();
      });
      REQUIRE(max_rel_error(results[0], host.to_vector<double>()) <= 1e-12);
    }
    INFO(mesh);
    auto loss_of = [](bool skip_masked) {
      return [skip_masked](Shard& s, const std::vector<Tensor>& p) {
        Tensor out = ring_attention(s, p[0], p[1], p[2], skip_masked);
        Tensor loss = psum(sum(out * out * out, out.shape().names()), "cp");
        return s.mesh().has("dp") ? psum(loss, "dp") : loss;
      };
    };
    check_mesh_gradients(rt, loss_of(false), globals, rules, kGradTolerance);
    // Skipping the masked blocks leaves some devices' received blocks unused: their ppermutes'
    // transposes would not run there (the gradients of the keys they sent on would be lost), and
    // the backward says so instead of computing wrong gradients.
    REQUIRE_THROWS_WITH(rt.run([&](Shard& s) {
      std::vector<Tensor> local;
      for (const auto& g : globals) local.push_back(s.shard(g, rules));
      (void)value_and_grad([&](const std::vector<Tensor>& p) { return loss_of(true)(s, p); }, local);
    }), Contains("in the backward of start_ppermute") && Contains("use it on every device"));
  }
}

TEST_CASE("attention_block and combine_attention: clear errors", "[attention][block][errors]") {
  const Shape shape{{"batch", 2}, {"seq", 3}, {"heads", 2}, {"head_dim", 4}};
  Tensor q = zeros(shape), k = zeros(shape), v = zeros(shape);
  REQUIRE_THROWS_WITH(attention_block(q, k, v, "seq", "dim"), Contains("attention_block") && Contains("'dim'"));
  REQUIRE_THROWS_WITH(attention_block(q, zeros(Shape{{"batch", 2}, {"seq", 4}, {"heads", 2}, {"head_dim", 4}}), v, "seq", "head_dim"),
                      Contains("attention_block") && Contains("k and v differ in length along 'seq' (4 and 3)"));
  REQUIRE_THROWS_WITH(attention_block(zeros(Shape{{"seq", 3}, {"head_dim", 0}}), zeros(Shape{{"seq", 3}, {"head_dim", 0}}),
                                      zeros(Shape{{"seq", 3}, {"head_dim", 0}}), "seq", "head_dim"),
                      Contains("attention_block") && Contains("size 0"));
  const AttentionBlock a = attention_block(q, k, v, "seq", "head_dim");
  const AttentionBlock other = attention_block(zeros(Shape{{"batch", 2}, {"seq", 2}, {"heads", 2}, {"head_dim", 4}}), k, v, "seq", "head_dim");
  REQUIRE_THROWS_WITH(combine_attention(a, other), Contains("combine_attention") && Contains("differ in axes"));
  REQUIRE_THROWS_WITH(combine_attention(a, AttentionBlock{a.out, a.out}), Contains("combine_attention") && Contains("differ in axes"));
  REQUIRE_THROWS_WITH(combine_attention(AttentionBlock{a.out, a.out}, AttentionBlock{a.out, a.out}),
                      Contains("combine_attention") && Contains("lse must have out's axes but head_dim"));
  REQUIRE_THROWS_WITH(combine_attention(a, AttentionBlock{}), Contains("combine_attention") && Contains("undefined"));
  Runtime rt = Runtime::local(Mesh::parse("mp=2"));
  REQUIRE_THROWS_WITH(rt.run([&](Shard& s) {
    Tensor t = s.shard(zeros(shape), {{"head_dim", "mp"}});
    attention_block(t, t, t, "seq", "head_dim");
  }), Contains("attention_block") && Contains("axis 'head_dim' of q is cut over mesh axis 'mp'"));
  // Scores of two blocks of a cut sequence as a dot: the message names both ways out.
  REQUIRE_THROWS_WITH(rt.run([&](Shard& s) {
    Tensor q = s.shard(zeros(Shape{{"seq", 4}, {"head_dim", 2}}), {{"seq", "mp"}});
    dot(q, rename(q, "seq", "kseq"), "head_dim");
  }), Contains("'seq' and 'kseq', are cut over mesh axis 'mp'") && Contains("as_varying") && Contains("attention_block"));
  // causal_attention over a cut sequence points at the blockwise ops.
  REQUIRE_THROWS_WITH(rt.run([&](Shard& s) {
    Tensor t = s.shard(zeros(Shape{{"seq", 4}, {"head_dim", 2}}), {{"seq", "mp"}});
    causal_attention(t, t, t, "seq", "head_dim");
  }), Contains("causal_attention") && Contains("attention_block") && Contains("combine_attention"));
}
