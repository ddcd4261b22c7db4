// Shape, indexing, scan and dynamic-slice ops (nax/ops/index_ops.h): forwards against plain f64 host
// loops (ties, NaN, -inf, repeated and dropped ids included); gradients against central finite
// differences in f64 (check_gradients defaults); vary rules and gradients on meshes (offsets from
// axis_index, a batch cut over dp, argmax/top_k/cumsum along an axis cut over mp against the
// whole-axis ops); the composed paths (a device without the row kernels) against the kernels;
// errors naming the op, the axis and the mesh axis.
#include "grad_check.h"
#include "remote_device.h"

using namespace nax;
using nax::testing::at;
using nax::testing::check_gradients;
using nax::testing::check_mesh_gradients;
using nax::testing::for_each_index;
using nax::testing::random_input;
using nax::testing::require_close_nan_matching;
using nax::testing::weighted_sum;
using Catch::Matchers::Contains;

namespace {

using Index = std::map<std::string, std::int64_t>;

const Shape kX{{"b", 2}, {"s", 5}, {"e", 3}};

Tensor ids_of(const Shape& shape, const std::vector<std::int32_t>& values) { return from_vector(shape, values, DType::i32); }

Shape without(const Shape& shape, const std::string& axis) {
  std::vector<Axis> kept;
  for (const auto& a : shape.axes())
    if (a.name != axis) kept.push_back(a);
  return Shape(kept);
}

// The values of x along `axis` through `index`.
std::vector<double> row_through(const Tensor& x, const std::vector<double>& values, Index index, const std::string& axis) {
  std::vector<double> row;
  for (std::int64_t k = 0; k < x.size(axis); ++k) {
    index[axis] = k;
    row.push_back(at(x, values, index));
  }
  return row;
}

// numpy's argmax / argmin: the first NaN, else the first extreme.
std::int64_t reference_arg(const std::vector<double>& row, bool largest) {
  std::int64_t best = 0;
  for (std::size_t i = 0; i < row.size(); ++i) {
    if (std::isnan(row[i])) return static_cast<std::int64_t>(i);
    if (largest ? row[i] > row[static_cast<std::size_t>(best)] : row[i] < row[static_cast<std::size_t>(best)]) best = static_cast<std::int64_t>(i);
  }
  return best;
}

// Indices of the k largest, descending, ties by the lower index, NaN largest.
std::vector<std::int64_t> reference_top_k(const std::vector<double>& row, std::int64_t k) {
  std::vector<std::int64_t> order(row.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  auto key = [&](std::int64_t i) { return std::isnan(row[static_cast<std::size_t>(i)]) ? INFINITY : row[static_cast<std::size_t>(i)]; };
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    const bool nan_a = std::isnan(row[static_cast<std::size_t>(a)]), nan_b = std::isnan(row[static_cast<std::size_t>(b)]);
    if (nan_a != nan_b) return nan_a;
    return key(a) > key(b);
  });
  order.resize(static_cast<std::size_t>(k));
  return order;
}

// x with some ties, a NaN row, an all -inf row: rows along "s".
Tensor tricky_rows(const Shape& shape = kX) {
  std::vector<double> v = random_input(shape, "tricky").to_vector<double>();
  auto set = [&](Index i, double value) {
    auto strides = shape.strides();
    v[static_cast<std::size_t>(i["b"] * strides[0] + i["s"] * strides[1] + i["e"] * strides[2])] = value;
  };
  set({{"b", 0}, {"s", 1}, {"e", 0}}, 7.0);
  set({{"b", 0}, {"s", 3}, {"e", 0}}, 7.0);  // a tie for the max
  set({{"b", 0}, {"s", 2}, {"e", 1}}, NAN);
  set({{"b", 0}, {"s", 4}, {"e", 1}}, NAN);
  for (std::int64_t s = 0; s < 5; ++s) set({{"b", 1}, {"s", s}, {"e", 2}}, -INFINITY);
  set({{"b", 1}, {"s", 0}, {"e", 0}}, -INFINITY);
  return from_vector(shape, v, DType::f64);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// shape ops

TEST_CASE("expand_dims, squeeze and stack move axes by name and keep the values", "[index_ops]") {
  Tensor x = random_input(kX, "x");
  Tensor e = expand_dims(x, "one", 1);
  REQUIRE(e.shape() == Shape{{"b", 2}, {"one", 1}, {"s", 5}, {"e", 3}});
  REQUIRE(e.to_vector<double>() == x.to_vector<double>());
  REQUIRE(expand_dims(x, "one", 3).shape().names() == std::vector<std::string>{"b", "s", "e", "one"});
  Tensor back = squeeze(e, "one");
  REQUIRE(back.shape() == kX);
  REQUIRE(back.to_vector<double>() == x.to_vector<double>());
  REQUIRE(squeeze(expand_dims(expand_dims(x, "u"), "v", 4), {"v", "u"}).shape() == kX);

  Tensor y = random_input(kX, "y");
  Tensor st = stack({x, transpose(y, {"e", "b", "s"})}, "pair", 2);  // the second in another order
  REQUIRE(st.shape() == Shape{{"b", 2}, {"s", 5}, {"pair", 2}, {"e", 3}});
  const auto xs = x.to_vector<double>(), ys = y.to_vector<double>(), got = st.to_vector<double>();
  for_each_index(st.shape(), [&](const Index& i) {
    Index j{{"b", i.at("b")}, {"s", i.at("s")}, {"e", i.at("e")}};
    REQUIRE(at(st, got, i) == at(x, i.at("pair") == 0 ? xs : ys, j));
  });
}

TEST_CASE("zeros_like, ones_like and full_like copy shape, device and vary type, not the values", "[index_ops]") {
  Tensor x = random_input(kX, "x");
  REQUIRE(zeros_like(x).to_vector<double>() == std::vector<double>(30, 0.0));
  REQUIRE(ones_like(x).shape() == kX);
  REQUIRE(ones_like(x).dtype() == DType::f64);
  REQUIRE(full_like(x, 2.5, DType::f32).dtype() == DType::f32);
  REQUIRE(full_like(x, 2.5, DType::f32).to_vector<double>() == std::vector<double>(30, 2.5));
  REQUIRE_FALSE(zeros_like(parameter(x)).requires_grad());
  Runtime rt = Runtime::local(Mesh::parse("dp=2,mp=2"));
  rt.run([&](Shard& s) {
    Tensor local = s.shard(x, AxisRules{{"b", "dp"}}) + cast(axis_index("mp"), DType::f64);
    NAX_EXPECT(zeros_like(local).vary() == local.vary());
    NAX_EXPECT(full_like(local, 3.0).shape() == local.shape());
    NAX_EXPECT(&zeros_like(local).device() == &local.device());
    return 0;
  });
}

TEST_CASE("shape op gradients match finite differences", "[index_ops][grad]") {
  Tensor x = random_input(kX, "x"), y = random_input(kX, "y");
  check_gradients([](const std::vector<Tensor>& p) { return weighted_sum(square(expand_dims(p[0], "one", 2))); }, {x});
  check_gradients([](const std::vector<Tensor>& p) {
    return weighted_sum(square(squeeze(expand_dims(expand_dims(p[0], "u", 1), "v"), {"u", "v"})));
  }, {x});
  check_gradients([](const std::vector<Tensor>& p) { return weighted_sum(p[0] * stack({p[0], p[1] * p[0], p[1]}, "k", 1)); }, {x, y});
}

TEST_CASE("squeezing an axis cut over a mesh axis leaves a Varying value, its gradient the blocks", "[index_ops][mesh]") {
  const Shape shape{{"b", 4}, {"e", 3}};
  Tensor x = random_input(shape, "x");
  Runtime rt = Runtime::local(Mesh::parse("b=4"));
  const AxisRules rules{{"b", "b"}};
  rt.run([&](Shard& s) {
    Tensor row = squeeze(s.shard(x, rules), "b");
    NAX_EXPECT(row.vary().kind("b") == Vary::Varying);
    NAX_EXPECT((row.shape() == Shape{{"e", 3}}));
    return 0;
  });
  check_mesh_gradients(rt, [](Shard&, const std::vector<Tensor>& p) {
    return psum(weighted_sum(square(squeeze(p[0], "b"))), "b");
  }, {x}, rules);
}

// ---------------------------------------------------------------------------------------------
// indexing

TEST_CASE("one_hot marks each id's position; ids outside the axis give zero rows", "[index_ops]") {
  Tensor ids = ids_of(Shape{{"t", 2}, {"u", 3}}, {0, 3, 2, -1, 4, 3});
  Tensor oh = one_hot(ids, Axis{"c", 4});
  REQUIRE(oh.shape() == Shape{{"t", 2}, {"u", 3}, {"c", 4}});
  REQUIRE(oh.dtype() == DType::f32);
  const auto got = oh.to_vector<double>();
  const auto id = ids.to_vector<double>();
  for_each_index(oh.shape(), [&](const Index& i) {
    const double want = at(ids, id, {{"t", i.at("t")}, {"u", i.at("u")}}) == static_cast<double>(i.at("c")) ? 1.0 : 0.0;
    REQUIRE(at(oh, got, i) == want);
  });
  REQUIRE(one_hot(ids, Axis{"c", 4}, DType::bf16).dtype() == DType::bf16);
  REQUIRE(one_hot(ids_of(Shape{}, {2}), Axis{"c", 3}).to_vector<double>() == std::vector<double>{0, 0, 1});
}

TEST_CASE("argmax and argmin match numpy: first of ties, NaN first, all -inf rows", "[index_ops]") {
  Tensor x = tricky_rows();
  const auto values = x.to_vector<double>();
  for (bool largest : {true, false}) {
    for (const std::string axis : {"s", "b", "e"}) {
      INFO((largest ? "argmax" : "argmin") << " over " << axis);
      Tensor got = largest ? argmax(x, axis) : argmin(x, axis);
      REQUIRE(got.dtype() == DType::i32);
      REQUIRE(got.shape() == without(kX, axis));
      const auto g = got.to_vector<double>();
      for_each_index(got.shape(), [&](const Index& i) {
        Index full = i;
        full[axis] = 0;
        REQUIRE(at(got, g, i) == static_cast<double>(reference_arg(row_through(x, values, full, axis), largest)));
      });
    }
  }
  REQUIRE(argmax(cast(x, DType::f32), "s").to_vector<double>() == argmax(x, "s").to_vector<double>());
  REQUIRE(argmax(ids_of(Shape{{"n", 4}}, {3, 9, 9, -2}), "n").item() == 1);
  REQUIRE_FALSE(argmax(parameter(x), "s").requires_grad());
}

TEST_CASE("top_k gives the k largest in order with their indices: ties, NaN and -inf", "[index_ops]") {
  Tensor x = tricky_rows();
  const auto values = x.to_vector<double>();
  for (std::int64_t k : {1, 2, 5}) {
    INFO("k = " << k);
    auto [v, idx] = top_k(x, "s", k, "top");
    REQUIRE(v.shape() == Shape{{"b", 2}, {"e", 3}, {"top", k}});
    REQUIRE(idx.shape() == v.shape());
    REQUIRE(idx.dtype() == DType::i32);
    const auto gv = v.to_vector<double>(), gi = idx.to_vector<double>();
    for_each_index(without(kX, "s"), [&](const Index& i) {
      Index full = i;
      full["s"] = 0;
      const auto row = row_through(x, values, full, "s");
      const auto want = reference_top_k(row, k);
      for (std::int64_t j = 0; j < k; ++j) {
        Index at_j = i;
        at_j["top"] = j;
        INFO("row b=" << i.at("b") << " e=" << i.at("e") << " j=" << j);
        REQUIRE(at(idx, gi, at_j) == static_cast<double>(want[static_cast<std::size_t>(j)]));
        const double w = row[static_cast<std::size_t>(want[static_cast<std::size_t>(j)])], got = at(v, gv, at_j);
        REQUIRE(((std::isnan(w) && std::isnan(got)) || w == got));
      }
    });
  }
}

TEST_CASE("top_k values' gradient reaches the chosen elements", "[index_ops][grad]") {
  Tensor x = random_input(kX, "x");  // distinct values: finite differences do not change the order
  check_gradients([](const std::vector<Tensor>& p) { return weighted_sum(square(top_k(p[0], "s", 2).values)); }, {x});
  check_gradients([](const std::vector<Tensor>& p) { return weighted_sum(top_k(p[0], "e", 3, "best").values * p[0]); }, {x});
}

TEST_CASE("scatter_add adds rows at ids, repeated ids accumulate; gradients match finite differences", "[index_ops][grad]") {
  const Shape target_shape{{"row", 4}, {"e", 3}};
  Tensor target = random_input(target_shape, "target");
  Tensor ids = ids_of(Shape{{"t", 5}}, {2, 0, 2, 3, 2});
  Tensor updates = random_input(Shape{{"e", 3}, {"t", 5}}, "updates");  // another axis order
  Tensor got = scatter_add(target, "row", ids, updates);
  REQUIRE(got.shape() == target_shape);
  auto want = target.to_vector<double>();
  const auto u = updates.to_vector<double>(), id = ids.to_vector<double>();
  for (std::int64_t t = 0; t < 5; ++t)
    for (std::int64_t e = 0; e < 3; ++e) want[static_cast<std::size_t>(id[static_cast<std::size_t>(t)] * 3 + e)] += at(updates, u, {{"t", t}, {"e", e}});
  nax::testing::require_close(got, want, 1e-12);
  Tensor one = scatter_add(target, "row", ids_of(Shape{}, {1}), random_input(Shape{{"e", 3}}, "one"));
  REQUIRE(one.shape() == target_shape);
  check_gradients([&](const std::vector<Tensor>& p) { return weighted_sum(square(scatter_add(p[0], "row", ids, p[1]))); },
                  {target, updates});
}

// ---------------------------------------------------------------------------------------------
// scan

TEST_CASE("cumsum matches a running sum along any axis, inclusive and exclusive", "[index_ops]") {
  const Shape shape{{"b", 2}, {"s", 13}, {"e", 3}};  // 13: not a power of two
  Tensor x = random_input(shape, "x");
  const auto values = x.to_vector<double>();
  for (bool exclusive : {false, true})
    for (const std::string axis : {"s", "b", "e"}) {
      INFO("axis " << axis << (exclusive ? " exclusive" : " inclusive"));
      Tensor got = cumsum(x, axis, exclusive);
      REQUIRE(got.shape() == shape);
      std::vector<double> want;
      for_each_index(shape, [&](const Index& i) {
        double total = 0;
        const auto row = row_through(x, values, i, axis);
        for (std::int64_t k = 0; k < i.at(axis) + (exclusive ? 0 : 1); ++k) total += row[static_cast<std::size_t>(k)];
        want.push_back(total);
      });
      nax::testing::require_close(got, want, 1e-12);
    }
  REQUIRE(cumsum(ids_of(Shape{{"n", 4}}, {1, 2, 3, 4}), "n").to_vector<double>() == std::vector<double>{1, 3, 6, 10});
  REQUIRE(cumsum(ids_of(Shape{{"n", 1}}, {5}), "n", true).to_vector<double>() == std::vector<double>{0});
}

TEST_CASE("cumsum gradients match finite differences", "[index_ops][grad]") {
  Tensor x = random_input(kX, "x");
  for (bool exclusive : {false, true})
    for (const std::string axis : {"s", "e"})
      check_gradients([&](const std::vector<Tensor>& p) { return weighted_sum(square(cumsum(p[0], axis, exclusive))); }, {x});
}

// ---------------------------------------------------------------------------------------------
// dynamic slices

TEST_CASE("dynamic_slice and dynamic_update_slice match static slices; gradients match finite differences", "[index_ops][grad]") {
  Tensor x = random_input(kX, "x"), update = random_input(Shape{{"e", 3}, {"s", 2}, {"b", 2}}, "update");
  for (std::int32_t start : {0, 1, 3}) {
    INFO("start " << start);
    Tensor s = ids_of(Shape{}, {start});
    REQUIRE(dynamic_slice(x, "s", s, 2).to_vector<double>() == slice(x, "s", start, start + 2).to_vector<double>());
    Tensor written = dynamic_update_slice(x, update, "s", s);
    REQUIRE(written.shape() == kX);
    std::vector<double> want;
    const auto xv = x.to_vector<double>(), uv = update.to_vector<double>();
    for_each_index(kX, [&](const Index& i) {
      const std::int64_t k = i.at("s") - start;
      want.push_back(k >= 0 && k < 2 ? at(update, uv, {{"b", i.at("b")}, {"s", k}, {"e", i.at("e")}}) : at(x, xv, i));
    });
    REQUIRE(written.to_vector<double>() == want);
    check_gradients([&](const std::vector<Tensor>& p) { return weighted_sum(square(dynamic_slice(p[0], "s", s, 2))); }, {x});
    check_gradients([&](const std::vector<Tensor>& p) { return weighted_sum(square(dynamic_update_slice(p[0], p[1], "s", s))); },
                    {x, update});
  }
  REQUIRE(dynamic_slice(x, "e", ids_of(Shape{}, {0}), 3).to_vector<double>() == x.to_vector<double>());
}

TEST_CASE("dynamic_slice at axis_index offsets: each device its block, Varying, gradients summed", "[index_ops][mesh]") {
  const Shape shape{{"b", 2}, {"s", 8}};
  Tensor x = random_input(shape, "x"), w = random_input(Shape{{"b", 2}, {"s", 2}}, "w");
  for (const std::string spec : {"mp=1", "mp=2", "mp=4", "dp=2,mp=2"}) {
    INFO("mesh " << spec);
    Runtime rt = Runtime::local(Mesh::parse(spec));
    const int n = Mesh::parse(spec).group_size({"mp"});
    const std::int64_t block = 8 / n;
    const AxisRules rules = spec.find("dp") != std::string::npos ? AxisRules{{"b", "dp"}} : AxisRules{};
    rt.run([&](Shard& s) {
      Tensor local = s.shard(x, rules);
      Tensor start = axis_index("mp") * static_cast<double>(block);
      Tensor mine = dynamic_slice(local, "s", start, block);
      NAX_EXPECT(mine.vary().kind("mp") == Vary::Varying);
      const std::int64_t r = static_cast<std::int64_t>(axis_index("mp").item());
      NAX_EXPECT(mine.to_vector<double>() == slice(local, "s", r * block, (r + 1) * block).to_vector<double>());
      Tensor written = dynamic_update_slice(local, zeros_like(mine), "s", start);
      NAX_EXPECT(written.vary().kind("mp") == Vary::Varying);
      return 0;
    });
    // Each device's block scaled by its own weights; the loss sums over mp (and dp).
    check_mesh_gradients(rt, [&](Shard&, const std::vector<Tensor>& p) {
      Tensor start = axis_index("mp") * static_cast<double>(block);
      Tensor mine = dynamic_slice(p[0], "s", start, block);
      Tensor scaled = dynamic_update_slice(p[0], mine * mine, "s", start);
      Tensor loss = sum(scaled * p[0], {"b", "s"}) + sum(mine, {"b", "s"});
      return psum(loss, loss.vary().unreduced_mesh_axes());
    }, {x}, rules);
  }
}

TEST_CASE("cumsum, argmax and top_k along a whole axis of a batch cut over dp keep the split", "[index_ops][mesh]") {
  const Shape shape{{"b", 4}, {"s", 6}};
  Tensor x = random_input(shape, "x");
  Runtime rt = Runtime::local(Mesh::parse("dp=2"));
  const AxisRules rules{{"b", "dp"}};
  auto gathered = rt.run([&](Shard& s) {
    Tensor local = s.shard(x, rules);
    Tensor c = cumsum(local, "s");
    NAX_EXPECT(c.vary().kind("dp") == Vary::Split);
    return std::vector<Tensor>{s.gather(c), s.gather(argmax(local, "s")), s.gather(top_k(local, "s", 2).values)};
  })[0];
  REQUIRE(gathered[0].to_vector<double>() == cumsum(x, "s").to_vector<double>());
  REQUIRE(gathered[1].to_vector<double>() == argmax(x, "s").to_vector<double>());
  REQUIRE(gathered[2].to_vector<double>() == top_k(x, "s", 2).values.to_vector<double>());
  check_mesh_gradients(rt, [](Shard&, const std::vector<Tensor>& p) {
    const Tensor c = cumsum(p[0], "s"), v = top_k(p[0], "s", 2).values;
    return psum(sum(c * c * p[0], {"b", "s"}) + sum(v * v * v, {"b", "k"}), "dp");
  }, {x}, rules);
}

TEST_CASE("on a device without the row kernels (as CUDA) the composed ops give the kernels' results", "[index_ops][devices]") {
  // The remote double (tests/remote_device.h) keeps the default scan_rows/top_k_rows, so argmax,
  // top_k and cumsum are composed there, and no op may read its memory from the host.
  const Shape shape{{"b", 4}, {"s", 9}, {"e", 3}};
  Tensor x = tricky_rows(shape);
  Tensor y = random_input(shape, "y"), w = random_input(Shape{{"b", 4}, {"e", 3}, {"top", 3}}, "w");
  auto results = [&](Runtime rt) {
    return rt.run([&](Shard& s) {
      const AxisRules rules{{"b", "dp"}};
      const Tensor local_x = s.shard(x, rules), local_y = parameter(s.shard(y, rules));
      std::vector<Tensor> out;
      for (const std::string axis : {"s", "e"}) {
        out.push_back(s.gather(argmax(local_x, axis)));
        out.push_back(s.gather(argmin(local_x, axis)));
        out.push_back(s.gather(cumsum(local_y, axis, axis == "e")));
      }
      const TopK tricky = top_k(local_x, "s", 5);
      out.push_back(s.gather(tricky.values));
      out.push_back(s.gather(tricky.indices));
      const Tensor loss = psum(sum(top_k(local_y, "s", 3, "top").values * s.shard(w, rules), {"b", "e", "top"}) +
                                   sum(square(cumsum(local_y, "s")), {"b", "s", "e"}), "dp");
      out.push_back(s.gather(grad(loss, {local_y})[0]));
      std::vector<std::vector<double>> values;
      for (const auto& t : out) values.push_back(t.to_vector<double>());
      return values;
    })[0];
  };
  const Mesh mesh = Mesh::parse("dp=2");
  const auto on_cpu = results(Runtime::local(mesh));
  RuntimeOptions remote;
  remote.device_factory = testing::make_remote_device;
  remote.transport = Transport::device;
  const auto on_remote = results(Runtime::local(mesh, remote));
  REQUIRE(on_cpu.size() == on_remote.size());
  for (std::size_t i = 0; i < on_cpu.size(); ++i) {
    INFO("result " << i);
    require_close_nan_matching(on_remote[i], on_cpu[i], 1e-12);
  }
}

TEST_CASE("argmax, argmin, top_k and cumsum along an axis cut over mesh axes equal the whole-axis ops", "[index_ops][mesh]") {
  const Shape shape{{"b", 4}, {"v", 12}};
  Tensor x = tricky_rows(Shape{{"b", 4}, {"s", 12}, {"e", 1}});
  x = rename(squeeze(x, "e"), "s", "v");
  std::vector<double> xv = x.to_vector<double>();
  xv[27] = xv[31] = 50.0;  // a tie across blocks in row 2 (index 3 wins)
  x = from_vector(shape, xv, DType::f64);
  Tensor y = random_input(shape, "y"), w = random_input(Shape{{"b", 4}, {"k", 5}}, "w");
  for (const std::string spec : {"mp=2", "mp=3", "mp=4", "dp=2,mp=2"}) {
    INFO("mesh " << spec);
    Runtime rt = Runtime::local(Mesh::parse(spec));
    const bool dp = spec.find("dp") != std::string::npos;
    const AxisRules rules = dp ? AxisRules{{"v", "mp"}, {"b", "dp"}} : AxisRules{{"v", "mp"}};
    auto got = rt.run([&](Shard& s) {
      const Tensor local = s.shard(x, rules), local_y = s.shard(y, rules);
      const TopK best = top_k(local, "v", 5);
      NAX_EXPECT(best.values.vary().kind("mp") == Vary::Invariant);
      const Tensor c = cumsum(local_y, "v"), ce = cumsum(local_y, "v", true);
      NAX_EXPECT(c.vary().kind("mp") == Vary::Split);
      std::vector<Tensor> out{s.gather(argmax(local, "v")), s.gather(argmin(local, "v")), s.gather(best.values), s.gather(best.indices),
                              s.gather(c), s.gather(ce), s.gather(top_k(local_y, "v", 12).indices)};
      std::vector<std::vector<double>> values;
      for (const auto& t : out) values.push_back(t.to_vector<double>());
      return values;
    })[0];
    const TopK want = top_k(x, "v", 5);
    const std::vector<std::vector<double>> expected{argmax(x, "v").to_vector<double>(), argmin(x, "v").to_vector<double>(),
                                                    want.values.to_vector<double>(), want.indices.to_vector<double>(),
                                                    cumsum(y, "v").to_vector<double>(), cumsum(y, "v", true).to_vector<double>(),
                                                    top_k(y, "v", 12).indices.to_vector<double>()};
    for (std::size_t i = 0; i < expected.size(); ++i) {
      INFO("result " << i);
      require_close_nan_matching(got[i], expected[i], 1e-12);
    }
    REQUIRE(got[0][2] == 3);
    check_mesh_gradients(rt, [&](Shard& s, const std::vector<Tensor>& p) {
      const Tensor c = cumsum(p[0], "v", false), top = top_k(p[0], "v", 5).values;
      // The cumsum's sum is a partial sum over mp (v is cut), the top values' Invariant over it:
      // each finished with its own psum before they are added.
      auto total = [](const Tensor& t) { return t.vary().unreduced_mesh_axes().empty() ? t : psum(t, t.vary().unreduced_mesh_axes()); };
      return total(sum(c * c * p[0], {"b", "v"})) + total(sum(top * s.shard(w, rules), {"b", "k"}));
    }, {y}, rules);
  }
}

// ---------------------------------------------------------------------------------------------
// errors

TEST_CASE("scatter_add and dynamic_update_slice refuse an axis cut over a mesh axis, naming op, axis and mesh axis", "[index_ops][errors]") {
  // (ids cut over a mesh axis scatter into zeros as a partial sum: tests/test_partial.cpp)
  const Shape shape{{"b", 4}, {"s", 6}};
  Tensor x = random_input(shape, "x");
  Runtime rt = Runtime::local(Mesh::parse("dp=2"));
  const AxisRules rules{{"b", "dp"}};
  rt.run([&](Shard& s) {
    Tensor local = s.shard(x, rules);
    auto refuses = [&](const std::function<void()>& f, const std::string& op) {
      try {
        f();
      } catch (const Error& e) {
        const std::string m = e.what();
        NAX_EXPECT(m.find(op) != std::string::npos && m.find("'b'") != std::string::npos && m.find("'dp'") != std::string::npos);
        return;
      }
      NAX_EXPECT(!"no error");
    };
    refuses([&] { scatter_add(local, "b", ids_of(Shape{{"t", 1}}, {0}), zeros(Shape{{"t", 1}, {"s", 6}}, DType::f64)); },
            "scatter_add");
    refuses([&] { dynamic_update_slice(local, local, "b", axis_index("dp") * 0.0); }, "dynamic_update_slice");
    Tensor ids = s.shard(ids_of(Shape{{"b", 4}}, {0, 1, 1, 0}), rules);
    refuses([&] { scatter_add(ones(Shape{{"row", 2}, {"s", 6}}, DType::f64), "row", ids, local); }, "scatter_add");
    return 0;
  });
}

TEST_CASE("index ops reject bad input with clear errors", "[index_ops][errors]") {
  Tensor x = random_input(kX, "x");
  Tensor ids = ids_of(Shape{{"t", 2}}, {0, 4});
  REQUIRE_THROWS_WITH(expand_dims(x, "s"), Contains("expand_dims") && Contains("'s'"));
  REQUIRE_THROWS_WITH(expand_dims(x, "n", 4), Contains("expand_dims") && Contains("position 4"));
  REQUIRE_THROWS_WITH(squeeze(x, "s"), Contains("squeeze") && Contains("size 5"));
  REQUIRE_THROWS_WITH(stack({x, slice(x, "s", 0, 2)}, "k"), Contains("concat"));
  REQUIRE_THROWS_WITH(stack({}, "k"), Contains("stack"));
  REQUIRE_THROWS_WITH(one_hot(cast(ids, DType::f32), Axis{"c", 3}), Contains("one_hot") && Contains("i32"));
  REQUIRE_THROWS_WITH(one_hot(ids, Axis{"t", 3}), Contains("one_hot") && Contains("'t'"));
  REQUIRE_THROWS_WITH(argmax(x, "nope"), Contains("argmax") && Contains("nope"));
  REQUIRE_THROWS_WITH(top_k(x, "s", 6), Contains("top_k") && Contains("k = 6"));
  REQUIRE_THROWS_WITH(top_k(x, "s", 2, "e"), Contains("top_k") && Contains("'e'"));
  Tensor target = zeros(Shape{{"row", 4}, {"e", 3}}, DType::f64);
  REQUIRE_THROWS_WITH(scatter_add(target, "row", ids, zeros(Shape{{"t", 2}, {"e", 3}}, DType::f64)),
                      Contains("scatter_add") && Contains("[0, 4]") && Contains("size 4"));
  REQUIRE_THROWS_WITH(scatter_add(target, "row", ids_of(Shape{{"t", 2}}, {0, 1}), zeros(Shape{{"t", 2}}, DType::f64)),
                      Contains("scatter_add") && Contains("updates"));
  REQUIRE_THROWS_WITH(dynamic_slice(x, "s", ids_of(Shape{}, {4}), 2), Contains("dynamic_slice") && Contains("start 4"));
  REQUIRE_THROWS_WITH(dynamic_slice(x, "s", ids_of(Shape{}, {-1}), 2), Contains("dynamic_slice") && Contains("start -1"));
  REQUIRE_THROWS_WITH(dynamic_slice(x, "s", scalar(1.0), 2), Contains("dynamic_slice") && Contains("i32 scalar"));
  REQUIRE_THROWS_WITH(dynamic_update_slice(x, slice(x, "e", 0, 2), "s", ids_of(Shape{}, {0})),
                      Contains("dynamic_update_slice") && Contains("equal sizes"));
}

TEST_CASE("f32 and bf16 inputs: cumsum accumulates in f32, top_k and argmax pick the same elements", "[index_ops]") {
  Tensor x = random_input(kX, "x");
  Tensor x32 = cast(x, DType::f32), x16 = cast(x, DType::bf16);
  nax::testing::require_close(cumsum(x32, "s"), cumsum(x, "s").to_vector<double>(), 1e-6);
  Tensor c16 = cumsum(x16, "s");
  REQUIRE(c16.dtype() == DType::bf16);
  nax::testing::require_close(c16, cast(cumsum(cast(x16, DType::f64), "s"), DType::bf16).to_vector<double>(), 1e-2);
  REQUIRE(argmax(x16, "e").to_vector<double>() == argmax(cast(x16, DType::f64), "e").to_vector<double>());
  auto [v16, i16] = top_k(x16, "s", 3);
  REQUIRE(v16.dtype() == DType::bf16);
  REQUIRE(i16.to_vector<double>() == top_k(cast(x16, DType::f64), "s", 3).indices.to_vector<double>());
  REQUIRE(v16.to_vector<double>() == top_k(cast(x16, DType::f64), "s", 3).values.to_vector<double>());
  Tensor ids = ids_of(Shape{{"t", 4}}, {1, 0, 1, 4});
  Tensor rows = scatter_add(x16, "s", ids, cast(random_input(Shape{{"t", 4}, {"b", 2}, {"e", 3}}, "u"), DType::bf16));
  REQUIRE(rows.dtype() == DType::bf16);
  REQUIRE(rows.shape() == kX);
}
