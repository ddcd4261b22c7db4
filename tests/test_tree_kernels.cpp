// Deterministic mode's CPU kernels (SumTree on), compared bit for bit:
//  - the tree GEMM against a scalar host implementation of the same tree (recursive, std::fma) on
//    odd shapes, transposes, padded leading dimensions, batches and beta 0 and 1; a block of rows
//    or columns computed alone gives the same bits as in the whole product;
//  - split consistency, the point of the mode: a sum cut into p blocks (p = 2, 4), each block
//    computed with SumTree::canonical_for_block_of(p) and the blocks added pairwise as a psum
//    does ((b0 + b1) + (b2 + b3)), gives the bits of the whole computed with
//    canonical_for_block_of(1); for gemm over K, reduce over a leading axis, layer_norm_backward's
//    dscale and dbias over rows, scatter_add_rows over ids (blocks that pick nothing included);
//  - reduce, layer_norm_backward and scatter_add_rows against nax::tree_sum over their terms;
//  - attention with the tree on: close to an f64 reference, not OpenBLAS's bits, and the same bits
//    for a head however its matrices are laid out;
//  - the elementwise and row kernels of a training step: an element's bits do not depend on its
//    position in the array or the array's length (vector body against scalar tail).
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iomanip>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "comparison.h"
#include "nax/core/dtype.h"
#include "nax/kernels/sum_tree.h"
#include "nax/kernels/kernels.h"

namespace {

using nax::DType;
using nax::SumTree;
namespace kn = nax::kernels;

kn::Kernels& cpu() { return *kn::cpu_kernels_ptr(); }

std::mt19937_64& rng() {
  static std::mt19937_64 engine{0x7ee5eed};
  return engine;
}

template <typename T>
std::vector<T> random_values(std::size_t n, double scale = 1.0, double mean = 0.0) {
  std::normal_distribution<double> dist(mean, scale);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(rng()));
  return v;
}

std::int64_t random_int(std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng()); }

template <typename T>
DType dtype_of() {
  return std::is_same_v<T, float> ? DType::f32 : DType::f64;
}

using nax::testing::add_pairwise;
using nax::testing::require_same_bits;

// --- GEMM ---

// The reference: sum over k of a[k] b[k] in the tree's order, a leaf by std::fma from zero.
template <typename T>
T fma_tree(const T* a, const T* b, std::int64_t n, const SumTree& tree) {
  if (tree.halves(n)) return fma_tree(a, b, n / 2, tree.half()) + fma_tree(a + n / 2, b + n / 2, n / 2, tree.half());
  T acc = 0;
  for (std::int64_t i = 0; i < n; ++i) acc = std::fma(a[i], b[i], acc);
  return acc;
}

// A batch of GEMMs with its operands stored as GemmShape says (padded leading dimensions).
template <typename T>
struct GemmCase {
  kn::GemmShape shape;
  std::vector<T> a, b, c;

  static GemmCase make(std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b, std::int64_t batch,
                       double beta, const SumTree& tree) {
    GemmCase g;
    auto& s = g.shape;
    s.trans_a = trans_a, s.trans_b = trans_b, s.m = m, s.n = n, s.k = k, s.batch = batch, s.beta = beta, s.tree = tree;
    s.lda = (trans_a ? m : k) + random_int(0, 3);
    s.ldb = (trans_b ? k : n) + random_int(0, 3);
    s.ldc = n + random_int(0, 3);
    s.stride_a = (trans_a ? k : m) * s.lda + random_int(0, 5);
    s.stride_b = (trans_b ? n : k) * s.ldb + random_int(0, 5);
    s.stride_c = m * s.ldc + random_int(0, 5);
    g.a = random_values<T>(static_cast<std::size_t>(batch * s.stride_a));
    g.b = random_values<T>(static_cast<std::size_t>(batch * s.stride_b));
    g.c = random_values<T>(static_cast<std::size_t>(batch * s.stride_c));
    return g;
  }
  T a_at(std::int64_t t, std::int64_t i, std::int64_t kk) const {
    return a[static_cast<std::size_t>(t * shape.stride_a + (shape.trans_a ? kk * shape.lda + i : i * shape.lda + kk))];
  }
  T b_at(std::int64_t t, std::int64_t kk, std::int64_t j) const {
    return b[static_cast<std::size_t>(t * shape.stride_b + (shape.trans_b ? j * shape.ldb + kk : kk * shape.ldb + j))];
  }
  std::vector<T> run() const {
    std::vector<T> out = c;
    cpu().gemm(dtype_of<T>(), shape, a.data(), b.data(), out.data());
    return out;
  }
  std::vector<T> reference() const {
    const auto& s = shape;
    std::vector<T> out = c, row(static_cast<std::size_t>(s.k)), col(row.size());
    for (std::int64_t t = 0; t < s.batch; ++t)
      for (std::int64_t i = 0; i < s.m; ++i)
        for (std::int64_t j = 0; j < s.n; ++j) {
          for (std::int64_t kk = 0; kk < s.k; ++kk) row[kk] = a_at(t, i, kk), col[kk] = b_at(t, kk, j);
          const T sum = fma_tree(row.data(), col.data(), s.k, s.tree);
          T& ct = out[static_cast<std::size_t>(t * s.stride_c + i * s.ldc + j)];
          ct = s.beta != 0 ? sum + static_cast<T>(s.beta) * ct : sum;
        }
    return out;
  }
  std::string describe() const {
    std::ostringstream o;
    o << "m " << shape.m << " n " << shape.n << " k " << shape.k << " trans " << shape.trans_a << shape.trans_b << " batch "
      << shape.batch << " beta " << shape.beta << " forced " << shape.tree.forced << " leaf " << shape.tree.leaf;
    return o.str();
  }
};

const std::vector<std::int64_t> kSizes{1, 2, 3, 7, 8, 31, 33, 64, 100};

TEMPLATE_TEST_CASE("tree gemm: each element is the tree's sum of fused multiply-adds", "[tree]", float, double) {
  const std::vector<SumTree> trees{SumTree{.on = true}, SumTree::canonical_for_block_of(4),
                                   SumTree{.on = true, .forced = 1, .leaf = 5}};
  int cases = 0;
  for (std::int64_t k : {1, 2, 3, 7, 8, 31, 33, 64, 100, 256, 1000})
    for (std::int64_t m : kSizes) {
      const std::int64_t n = kSizes[static_cast<std::size_t>(random_int(0, static_cast<std::int64_t>(kSizes.size()) - 1))];
      if (k == 1000 && m * n > 400) continue;
      const auto g = GemmCase<TestType>::make(m, n, k, random_int(0, 1) == 1, random_int(0, 1) == 1, random_int(1, 2),
                                              random_int(0, 1) == 1 ? 1.0 : 0.0, trees[static_cast<std::size_t>(cases++ % 3)]);
      require_same_bits(g.run(), g.reference(), g.describe());
    }
}

TEMPLATE_TEST_CASE("tree gemm: a long K and a wide op(B), packed in several blocks of columns", "[tree]", float, double) {
  for (const bool trans_b : {false, true}) {
    const auto g = GemmCase<TestType>::make(7, 333, 4096, trans_b, trans_b, 1, 1.0, SumTree{.on = true});
    require_same_bits(g.run(), g.reference(), g.describe());
  }
}

// op(B) read along its rows and 512 columns or more take the wide register tile (8 rows of 3
// vectors with AVX-512): the same bits as the reference, and as the narrow tile computing a few
// of its columns alone.
TEMPLATE_TEST_CASE("tree gemm: the wide tile of a wide op(B) gives the reference's bits and the narrow tile's", "[tree]", float,
                   double) {
  using T = TestType;
  for (const bool trans_a : {false, true})
    for (const double beta : {0.0, 1.0}) {
      const auto g = GemmCase<T>::make(29, 1000, 256, trans_a, false, 2, beta, SumTree{.on = true});
      require_same_bits(g.run(), g.reference(), g.describe());
    }
  const auto g = GemmCase<T>::make(21, 600, 128, false, false, 1, 0.0, SumTree{.on = true});
  const auto whole = g.run();
  kn::GemmShape s = g.shape;
  s.n = 100;
  std::vector<T> c(static_cast<std::size_t>(s.m * s.ldc));
  cpu().gemm(dtype_of<T>(), s, g.a.data(), g.b.data() + 250, c.data());
  for (std::int64_t i = 0; i < s.m; ++i)
    require_same_bits(c.data() + i * s.ldc, whole.data() + i * s.ldc + 250, static_cast<std::size_t>(s.n), "columns alone");
}

TEST_CASE("tree gemm: beta 0 does not read C, and an empty K gives beta C", "[tree]") {
  auto g = GemmCase<float>::make(5, 9, 17, false, false, 1, 0.0, SumTree{.on = true});
  std::fill(g.c.begin(), g.c.end(), std::numeric_limits<float>::quiet_NaN());
  const auto out = g.run();
  for (std::int64_t i = 0; i < 5; ++i)
    for (std::int64_t j = 0; j < 9; ++j) REQUIRE(std::isfinite(out[static_cast<std::size_t>(i * g.shape.ldc + j)]));
  require_same_bits(out, g.reference(), "beta 0 over NaN");
  const auto e = GemmCase<double>::make(4, 6, 0, true, false, 2, 1.0, SumTree{.on = true});
  require_same_bits(e.run(), e.reference(), "k = 0");
}

TEMPLATE_TEST_CASE("tree gemm: rows and columns computed alone give the bits of the whole product", "[tree]", float, double) {
  using T = TestType;
  for (const bool trans_a : {false, true})
    for (const bool trans_b : {false, true}) {
      const std::int64_t m = 45, n = 70, k = 96;
      const auto g = GemmCase<T>::make(m, n, k, trans_a, trans_b, 1, 0.0, SumTree{.on = true});
      const auto whole = g.run();
      for (const auto& [r0, r1] : std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 1}, {3, 4}, {5, 20}, {17, 45}}) {
        kn::GemmShape s = g.shape;
        s.m = r1 - r0;
        std::vector<T> c(static_cast<std::size_t>(s.m * s.ldc));
        cpu().gemm(dtype_of<T>(), s, g.a.data() + (trans_a ? r0 : r0 * s.lda), g.b.data(), c.data());
        for (std::int64_t i = 0; i < s.m; ++i)
          require_same_bits(c.data() + i * s.ldc, whole.data() + (r0 + i) * s.ldc, static_cast<std::size_t>(n), "rows alone");
      }
      for (const auto& [c0, c1] : std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 1}, {1, 2}, {5, 38}, {33, 70}}) {
        kn::GemmShape s = g.shape;
        s.n = c1 - c0;
        std::vector<T> c(static_cast<std::size_t>(m * s.ldc));
        cpu().gemm(dtype_of<T>(), s, g.a.data(), g.b.data() + (trans_b ? c0 * s.ldb : c0), c.data());
        for (std::int64_t i = 0; i < m; ++i)
          require_same_bits(c.data() + i * s.ldc, whole.data() + i * s.ldc + c0, static_cast<std::size_t>(s.n), "columns alone");
      }
    }
}

TEMPLATE_TEST_CASE("tree gemm: K cut into p blocks and added pairwise gives the bits of the whole", "[tree]", float, double) {
  using T = TestType;
  // (max cut, p): the default max cut with every cut it takes, and larger max cuts with their finest.
  const std::vector<std::pair<std::int64_t, std::int64_t>> cuts{{8, 2}, {8, 4}, {8, 8}, {16, 16}, {64, 4}, {64, 64}};
  for (const std::int64_t k : {64, 96, 100, 256, 1024, 4 * 37, 64 * 3})
    for (const auto& [max_cut, p] : cuts) {
      if (k % p != 0) continue;
      INFO("max cut " << max_cut);
      const std::int64_t m = 13, n = 35, kb = k / p;
      // A (m x k) and B (k x n) row-major; block b is A's columns and B's rows [b kb, (b + 1) kb).
      const auto a = random_values<T>(static_cast<std::size_t>(m * k)), b = random_values<T>(static_cast<std::size_t>(k * n));
      kn::GemmShape whole{
          .m = m, .n = n, .k = k, .lda = k, .ldb = n, .ldc = n, .tree = SumTree::canonical_for_block_of(1, max_cut)};
      std::vector<T> want(static_cast<std::size_t>(m * n));
      cpu().gemm(dtype_of<T>(), whole, a.data(), b.data(), want.data());
      std::vector<std::vector<T>> blocks;
      for (std::int64_t blk = 0; blk < p; ++blk) {
        kn::GemmShape s = whole;
        s.k = kb;
        s.tree = SumTree::canonical_for_block_of(p, max_cut);
        blocks.emplace_back(static_cast<std::size_t>(m * n));
        cpu().gemm(dtype_of<T>(), s, a.data() + blk * kb, b.data() + blk * kb * n, blocks.back().data());
      }
      require_same_bits(add_pairwise(blocks), want, "k " + std::to_string(k) + " in " + std::to_string(p) + " blocks");
    }
}

// --- reduce ---

// Row-major strides of `sizes`.
std::vector<std::int64_t> strides_of(const std::vector<std::int64_t>& sizes) {
  std::vector<std::int64_t> s(sizes.size(), 1);
  for (std::size_t d = sizes.size(); d-- > 1;) s[d - 1] = s[d] * sizes[d];
  return s;
}

// Sum of a row-major tensor of `sizes` over the axes marked in `reduced`, by the kernel.
template <typename T>
std::vector<T> kernel_sum(const std::vector<T>& x, const std::vector<std::int64_t>& sizes, const std::vector<bool>& reduced,
                          const SumTree& tree) {
  std::vector<std::int64_t> kept_sizes;
  for (std::size_t d = 0; d < sizes.size(); ++d)
    if (!reduced[d]) kept_sizes.push_back(sizes[d]);
  const auto in_strides = strides_of(sizes), kept_strides = strides_of(kept_sizes);
  kn::Layout<2> layout;
  layout.rank = static_cast<int>(sizes.size());
  std::size_t kept = 0, out_count = 1;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    layout.sizes[d] = sizes[d];
    layout.strides[0][d] = in_strides[d];
    layout.strides[1][d] = reduced[d] ? 0 : kept_strides[kept++];
    if (!reduced[d]) out_count *= static_cast<std::size_t>(sizes[d]);
  }
  std::vector<T> out(out_count, std::numeric_limits<T>::quiet_NaN());
  cpu().reduce(nax::ReduceOp::sum, dtype_of<T>(), x.data(), out.data(), static_cast<std::int64_t>(out_count), layout, tree);
  return out;
}

// The reference: each output's inputs listed row-major over the reduced axes, then nax::tree_sum.
template <typename T>
std::vector<T> reference_sum(const std::vector<T>& x, const std::vector<std::int64_t>& sizes, const std::vector<bool>& reduced,
                             const SumTree& tree) {
  const auto strides = strides_of(sizes);
  std::vector<std::vector<T>> terms;  // per output, in order
  std::vector<std::int64_t> index(sizes.size(), 0);
  for (std::size_t e = 0; e < x.size(); ++e) {
    std::int64_t rest = static_cast<std::int64_t>(e), out = 0;
    for (std::size_t d = sizes.size(); d-- > 0;) index[d] = rest % sizes[d], rest /= sizes[d];
    for (std::size_t d = 0; d < sizes.size(); ++d)
      if (!reduced[d]) out = out * sizes[d] + index[d];
    if (terms.size() <= static_cast<std::size_t>(out)) terms.resize(static_cast<std::size_t>(out) + 1);
    terms[static_cast<std::size_t>(out)].push_back(x[e]);  // row-major: reduced indices in order
  }
  std::vector<T> want;
  for (const auto& t : terms) want.push_back(nax::tree_sum(t.data(), static_cast<std::int64_t>(t.size()), tree));
  return want;
}

TEMPLATE_TEST_CASE("tree reduce: each output the tree sum of its inputs in row-major order", "[tree]", float, double) {
  using T = TestType;
  const std::vector<std::int64_t> sizes{6, 40, 33};
  const auto x = random_values<T>(6 * 40 * 33);
  for (const std::vector<bool>& reduced : std::vector<std::vector<bool>>{{true, false, false},
                                                                         {false, true, false},
                                                                         {false, false, true},
                                                                         {true, false, true},
                                                                         {true, true, false},
                                                                         {false, true, true},
                                                                         {true, true, true}})
    for (const SumTree& tree :
         {SumTree{.on = true}, SumTree::canonical_for_block_of(2), SumTree{.on = true, .forced = 0, .leaf = 4}}) {
      std::string what = "reduced";
      for (bool r : reduced) what += r ? " y" : " n";
      require_same_bits(kernel_sum(x, sizes, reduced, tree), reference_sum(x, sizes, reduced, tree), what);
    }
}

TEMPLATE_TEST_CASE("tree reduce: a leading axis cut into p blocks and added pairwise gives the bits of the whole", "[tree]",
                   float, double) {
  using T = TestType;
  for (const std::vector<std::int64_t>& sizes : std::vector<std::vector<std::int64_t>>{{64, 50}, {100, 9}, {8, 6, 37}, {4, 1000}})
    for (const std::int64_t p : {2, 4}) {
      const auto x = random_values<T>(static_cast<std::size_t>(sizes[0] * sizes[1] * (sizes.size() > 2 ? sizes[2] : 1)));
      // Axes 0 (cut) and, for rank 3, 1 are summed; the last is kept.
      std::vector<bool> reduced(sizes.size(), true);
      reduced.back() = false;
      const auto want = kernel_sum(x, sizes, reduced, SumTree::canonical_for_block_of(1));
      std::vector<std::int64_t> block_sizes = sizes;
      block_sizes[0] /= p;
      const std::size_t block_elements = x.size() / static_cast<std::size_t>(p);
      std::vector<std::vector<T>> blocks;
      for (std::int64_t b = 0; b < p; ++b) {
        std::vector<T> part(x.begin() + static_cast<std::ptrdiff_t>(b * block_elements),
                            x.begin() + static_cast<std::ptrdiff_t>((b + 1) * block_elements));
        blocks.push_back(kernel_sum(part, block_sizes, reduced, SumTree::canonical_for_block_of(p)));
      }
      require_same_bits(add_pairwise(blocks), want,
                        "leading axis of " + std::to_string(sizes[0]) + " in " + std::to_string(p) + " blocks");
    }
}

// --- layer_norm_backward ---

template <typename T>
struct LayerNormCase {
  std::int64_t rows, n;
  std::vector<T> x, scale, bias, dy, mean, rstd;

  LayerNormCase(std::int64_t rows_in, std::int64_t n_in) : rows(rows_in), n(n_in) {
    x = random_values<T>(static_cast<std::size_t>(rows * n), 2.0, 0.5);
    scale = random_values<T>(static_cast<std::size_t>(n));
    bias = random_values<T>(static_cast<std::size_t>(n));
    dy = random_values<T>(static_cast<std::size_t>(rows * n));
    std::vector<T> y(x.size());
    mean.resize(static_cast<std::size_t>(rows));
    rstd.resize(static_cast<std::size_t>(rows));
    cpu().layer_norm_forward(dtype_of<T>(), rows, n, x.data(), scale.data(), bias.data(), 1e-5, y.data(), mean.data(),
                             rstd.data());
  }

  // dx, dscale, dbias of rows [r0, r0 + count).
  struct Grads {
    std::vector<T> dx, dscale, dbias;
  };
  Grads run(std::int64_t r0, std::int64_t count, const SumTree& tree) const {
    Grads g{std::vector<T>(static_cast<std::size_t>(count * n)), std::vector<T>(static_cast<std::size_t>(n)),
            std::vector<T>(static_cast<std::size_t>(n))};
    cpu().layer_norm_backward(dtype_of<T>(), count, n, x.data() + r0 * n, scale.data(), mean.data() + r0, rstd.data() + r0,
                              dy.data() + r0 * n, g.dx.data(), g.dscale.data(), g.dbias.data(), tree);
    return g;
  }
};

TEMPLATE_TEST_CASE("tree layer_norm_backward: dscale and dbias the tree sums over rows, dx unchanged", "[tree]", float, double) {
  using T = TestType;
  for (const auto& [rows, n] : std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 5}, {64, 33}, {100, 300}, {7, 1}}) {
    INFO("rows " << rows << " n " << n);
    const LayerNormCase<T> c(rows, n);
    const auto got = c.run(0, rows, SumTree{.on = true});
    const auto plain = c.run(0, rows, SumTree{});
    require_same_bits(got.dx, plain.dx, "dx");
    std::vector<T> terms_s(static_cast<std::size_t>(rows)), terms_b(terms_s.size());
    for (std::int64_t j = 0; j < n; ++j) {
      for (std::int64_t r = 0; r < rows; ++r) {
        const auto e = static_cast<std::size_t>(r * n + j);
        const T xhat = (c.x[e] - c.mean[static_cast<std::size_t>(r)]) * c.rstd[static_cast<std::size_t>(r)];
        terms_s[static_cast<std::size_t>(r)] = c.dy[e] * xhat;
        terms_b[static_cast<std::size_t>(r)] = c.dy[e];
      }
      const T want_s = nax::tree_sum(terms_s.data(), rows, SumTree{.on = true});
      const T want_b = nax::tree_sum(terms_b.data(), rows, SumTree{.on = true});
      require_same_bits(&got.dscale[static_cast<std::size_t>(j)], &want_s, 1, "dscale column " + std::to_string(j));
      require_same_bits(&got.dbias[static_cast<std::size_t>(j)], &want_b, 1, "dbias column " + std::to_string(j));
    }
  }
}

TEMPLATE_TEST_CASE("tree layer_norm_backward: rows cut into p blocks and added pairwise give the bits of the whole", "[tree]",
                   float, double) {
  using T = TestType;
  for (const std::int64_t rows : {64, 96, 1024})
    for (const std::int64_t p : {2, 4}) {
      const LayerNormCase<T> c(rows, 45);
      const auto whole = c.run(0, rows, SumTree::canonical_for_block_of(1));
      std::vector<std::vector<T>> dscale, dbias;
      for (std::int64_t b = 0; b < p; ++b) {
        auto part = c.run(b * rows / p, rows / p, SumTree::canonical_for_block_of(p));
        require_same_bits(part.dx.data(), whole.dx.data() + b * rows / p * c.n, part.dx.size(), "dx of a block");
        dscale.push_back(part.dscale);
        dbias.push_back(part.dbias);
      }
      require_same_bits(add_pairwise(dscale), whole.dscale, "dscale over " + std::to_string(p) + " blocks");
      require_same_bits(add_pairwise(dbias), whole.dbias, "dbias over " + std::to_string(p) + " blocks");
    }
}

// --- scatter_add_rows ---

// The reference: table row t = nax::tree_sum over i of the dense terms (grad row i where ids[i]
// picks t, else +0), column by column.
template <typename T>
std::vector<T> reference_scatter(const std::vector<std::int32_t>& ids, kn::VocabRange range, const std::vector<T>& grad,
                                 std::int64_t row, const SumTree& tree) {
  const auto count = static_cast<std::int64_t>(ids.size());
  std::vector<T> out(static_cast<std::size_t>(range.local * row)), terms(ids.size());
  for (std::int64_t t = 0; t < range.local; ++t)
    for (std::int64_t j = 0; j < row; ++j) {
      for (std::int64_t i = 0; i < count; ++i)
        terms[static_cast<std::size_t>(i)] =
            ids[static_cast<std::size_t>(i)] == range.start + t ? grad[static_cast<std::size_t>(i * row + j)] : T(0);
      out[static_cast<std::size_t>(t * row + j)] = nax::tree_sum(terms.data(), count, tree);
    }
  return out;
}

template <typename T>
std::vector<T> kernel_scatter(const std::int32_t* ids, std::int64_t count, kn::VocabRange range, const T* grad, std::int64_t row,
                              const SumTree& tree) {
  std::vector<T> out(static_cast<std::size_t>(range.local * row), std::numeric_limits<T>::quiet_NaN());
  cpu().scatter_add_rows(dtype_of<T>(), ids, count, range, grad, row, out.data(), tree);
  return out;
}

// Gradients with signed zeros among them (only signed zeros when `zeros_only`): a dense tree
// turns -0 + +0 into +0, which the kernel must reproduce without adding the absent terms one by one.
template <typename T>
std::vector<T> gradient_with_zeros(std::size_t n, bool zeros_only = false) {
  auto g = random_values<T>(n);
  for (auto& v : g) {
    const auto u = random_int(0, zeros_only ? 1 : 9);
    if (u == 0) v = T(-0.0);
    if (u == 1) v = T(0.0);
  }
  return g;
}

TEMPLATE_TEST_CASE("tree scatter_add_rows: each row the dense tree sum of the gradient rows that pick it", "[tree]", float,
                   double) {
  using T = TestType;
  for (const std::int64_t count : {1, 5, 64, 100, 333}) {
    const std::int64_t vocab = 11, row = 3;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(count));
    for (auto& id : ids) id = static_cast<std::int32_t>(random_int(0, vocab - 1));
    for (const bool zeros_only : {false, true}) {
      const auto grad = gradient_with_zeros<T>(static_cast<std::size_t>(count * row), zeros_only);
      for (const kn::VocabRange range : {kn::VocabRange{0, vocab}, kn::VocabRange{4, 5}})
        for (const SumTree& tree :
             {SumTree{.on = true}, SumTree::canonical_for_block_of(4), SumTree{.on = true, .forced = 0, .leaf = 3}})
          require_same_bits(kernel_scatter(ids.data(), count, range, grad.data(), row, tree),
                            reference_scatter(ids, range, grad, row, tree),
                            "count " + std::to_string(count) + " range start " + std::to_string(range.start) +
                                (zeros_only ? ", signed zeros" : ""));
    }
  }
}

TEMPLATE_TEST_CASE("tree scatter_add_rows: ids cut into p blocks and added pairwise give the bits of the whole", "[tree]", float,
                   double) {
  using T = TestType;
  for (const std::int64_t count : {64, 256, 4 * 25})
    for (const std::int64_t p : {2, 4}) {
      const std::int64_t vocab = 9, row = 4, per_block = count / p;
      std::vector<std::int32_t> ids(static_cast<std::size_t>(count));
      for (std::int64_t i = 0; i < count; ++i)  // block 1 picks only row 0: its other rows are +0
        ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i / per_block == 1 ? 0 : random_int(0, vocab - 2));
      for (const bool zeros_only : {false, true}) {
        const auto grad = gradient_with_zeros<T>(static_cast<std::size_t>(count * row), zeros_only);
        const kn::VocabRange range{0, vocab};  // row vocab - 1 is picked by no id
        const auto whole = kernel_scatter(ids.data(), count, range, grad.data(), row, SumTree::canonical_for_block_of(1));
        std::vector<std::vector<T>> blocks;
        for (std::int64_t b = 0; b < p; ++b)
          blocks.push_back(kernel_scatter(ids.data() + b * per_block, per_block, range, grad.data() + b * per_block * row, row,
                                          SumTree::canonical_for_block_of(p)));
        require_same_bits(add_pairwise(blocks), whole, "count " + std::to_string(count) + " in " + std::to_string(p) + " blocks");
        for (std::int64_t j = 0; j < row; ++j)
          REQUIRE(std::bit_cast<std::uint64_t>(double(whole[static_cast<std::size_t>((vocab - 1) * row + j)])) == 0);
      }
    }
}

// --- attention ---

template <typename T>
struct AttentionRun {
  std::vector<T> out, lse;
};

// One head's causal attention (tq = tk = t) with the tree on, its q, k, v rows `stride` apart at
// element `offset` of their buffers; the result packed densely.
template <typename T>
AttentionRun<T> attention_of(const std::vector<T>& q, const std::vector<T>& k, const std::vector<T>& v, std::int64_t t,
                             std::int64_t d, std::int64_t stride, std::int64_t offset, std::int64_t block_rows,
                             bool tree = true) {
  auto place = [&](const std::vector<T>& dense) {
    std::vector<T> buf(static_cast<std::size_t>(offset + t * stride), T(7));
    for (std::int64_t r = 0; r < t; ++r) std::copy_n(dense.data() + r * d, d, buf.data() + offset + r * stride);
    return buf;
  };
  const auto qb = place(q), kb = place(k), vb = place(v);
  std::vector<T> ob(qb.size()), lse(static_cast<std::size_t>(t));
  const std::int64_t offsets[1] = {offset};
  kn::AttentionSizes s{.dtype = dtype_of<T>(),
                       .batches = 1,
                       .tq = t,
                       .tk = t,
                       .head_dim = d,
                       .scale = 0.125,
                       .block_rows = block_rows,
                       .tree = SumTree{.on = tree}};
  std::vector<T> scratch(static_cast<std::size_t>(cpu().attention_forward_scratch(s)));
  cpu().causal_attention_forward(s, {qb.data(), offsets, stride}, {kb.data(), offsets, stride}, {vb.data(), offsets, stride},
                                 {ob.data(), offsets, stride}, lse.data(), scratch.data());
  AttentionRun<T> r{std::vector<T>(static_cast<std::size_t>(t * d)), lse};
  for (std::int64_t row = 0; row < t; ++row) std::copy_n(ob.data() + offset + row * stride, d, r.out.data() + row * d);
  return r;
}

TEMPLATE_TEST_CASE("tree attention: close to f64, and the same bits however the head is laid out", "[tree]", float, double) {
  using T = TestType;
  const std::int64_t t = 70, d = 16;
  const auto q = random_values<T>(static_cast<std::size_t>(t * d)), k = random_values<T>(q.size()),
             v = random_values<T>(q.size());
  const auto base = attention_of(q, k, v, t, d, d, 0, 32);
  for (const auto& [stride, offset] : std::vector<std::pair<std::int64_t, std::int64_t>>{{d + 1, 3}, {3 * d, 1}, {d, 5}}) {
    const auto other = attention_of(q, k, v, t, d, stride, offset, 32);
    require_same_bits(other.out, base.out, "out, stride " + std::to_string(stride));
    require_same_bits(other.lse, base.lse, "lse, stride " + std::to_string(stride));
  }
  // The tree is honoured: OpenBLAS's order (the default mode) gives other bits somewhere.
  const auto blas = attention_of(q, k, v, t, d, d, 0, 32, false);
  REQUIRE(std::memcmp(blas.out.data(), base.out.data(), base.out.size() * sizeof(T)) != 0);
  for (std::int64_t i = 0; i < t; ++i) {  // f64 reference
    std::vector<double> score(static_cast<std::size_t>(i + 1));
    double top = -INFINITY;
    for (std::int64_t j = 0; j <= i; ++j) {
      double s = 0;
      for (std::int64_t e = 0; e < d; ++e) s += double(q[i * d + e]) * double(k[j * d + e]);
      score[static_cast<std::size_t>(j)] = s * 0.125, top = std::max(top, s * 0.125);
    }
    double total = 0;
    for (auto& s : score) s = std::exp(s - top), total += s;
    CHECK(std::abs(double(base.lse[static_cast<std::size_t>(i)]) - (top + std::log(total))) < 1e-4);
    for (std::int64_t e = 0; e < d; ++e) {
      double o = 0;
      for (std::int64_t j = 0; j <= i; ++j) o += score[static_cast<std::size_t>(j)] / total * double(v[j * d + e]);
      CHECK(std::abs(double(base.out[static_cast<std::size_t>(i * d + e)]) - o) < 1e-4);
    }
  }
}

// --- elementwise and row kernels: an element's bits independent of its position ---

// fn(offset, length) computes elements [offset, offset + length) of an array into a fresh vector;
// every sub-range must give the bits of the whole array's computation.
template <typename T, typename Fn>
void require_position_independent(std::int64_t n, Fn&& fn, const std::string& what) {
  const std::vector<T> whole = fn(0, n);
  REQUIRE(static_cast<std::int64_t>(whole.size()) == n);
  for (const std::int64_t offset : {0, 1, 3, 7, 16, 17, 40})
    for (const std::int64_t length : {1, 3, 8, 15, 16, 17, 31, 33, 64, 100}) {
      if (offset + length > n) continue;
      const std::vector<T> part = fn(offset, length);
      require_same_bits(part.data(), whole.data() + offset, static_cast<std::size_t>(length),
                        what + " at " + std::to_string(offset) + " length " + std::to_string(length));
    }
}

kn::Layout<3> contiguous3(std::int64_t n, std::int64_t b_stride) {
  kn::Layout<3> l;
  l.rank = 1;
  l.sizes[0] = n;
  l.strides = {kn::Dims{1}, kn::Dims{b_stride}, kn::Dims{1}};
  return l;
}

TEMPLATE_TEST_CASE("elementwise kernels: an element's bits do not depend on its position or the array's length", "[tree]", float,
                   double) {
  using T = TestType;
  const DType dt = dtype_of<T>();
  const std::int64_t n = 200;
  auto x = random_values<T>(static_cast<std::size_t>(n), 3.0);
  x[5] = T(0), x[6] = T(-0.0), x[9] = T(40), x[10] = T(-90), x[11] = std::numeric_limits<T>::quiet_NaN();
  auto y = random_values<T>(static_cast<std::size_t>(n), 2.0, 0.5);
  std::vector<T> positive(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) positive[i] = std::abs(x[i]) + T(0.01);

  using kn::BinaryOp;
  for (const BinaryOp op :
       {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::max, BinaryOp::min, BinaryOp::pow, BinaryOp::lt})
    for (const std::int64_t b_stride : {1, 0}) {
      const auto& a = op == BinaryOp::pow ? positive : x;
      require_position_independent<T>(
          n,
          [&](std::int64_t o, std::int64_t len) {
            std::vector<T> out(static_cast<std::size_t>(len));
            cpu().binary(op, dt, a.data() + o, y.data() + (b_stride == 0 ? 0 : o), out.data(), contiguous3(len, b_stride));
            return out;
          },
          "binary " + std::to_string(static_cast<int>(op)) + " b stride " + std::to_string(b_stride));
    }
  using kn::UnaryOp;
  for (const UnaryOp op :
       {UnaryOp::neg, UnaryOp::abs, UnaryOp::exp, UnaryOp::log, UnaryOp::sqrt, UnaryOp::rsqrt, UnaryOp::tanh, UnaryOp::square}) {
    const auto& in = op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt ? positive : x;
    require_position_independent<T>(
        n,
        [&](std::int64_t o, std::int64_t len) {
          std::vector<T> out(static_cast<std::size_t>(len));
          cpu().unary(op, dt, in.data() + o, out.data(), len);
          return out;
        },
        "unary " + std::to_string(static_cast<int>(op)));
  }
  require_position_independent<T>(
      n,
      [&](std::int64_t o, std::int64_t len) {
        std::vector<T> out(static_cast<std::size_t>(len));
        cpu().gelu_forward(dt, len, x.data() + o, out.data());
        return out;
      },
      "gelu_forward");
  require_position_independent<T>(
      n,
      [&](std::int64_t o, std::int64_t len) {
        std::vector<T> out(static_cast<std::size_t>(len));
        cpu().gelu_backward(dt, len, x.data() + o, y.data() + o, out.data());
        return out;
      },
      "gelu_backward");
  const std::vector<T> cond = [&] {
    std::vector<T> c(x.size());
    for (std::size_t i = 0; i < c.size(); ++i) c[i] = T(i % 3 == 0);
    return c;
  }();
  require_position_independent<T>(
      n,
      [&](std::int64_t o, std::int64_t len) {
        std::vector<T> out(static_cast<std::size_t>(len));
        kn::Layout<4> l;
        l.rank = 1;
        l.sizes[0] = len;
        l.strides = {kn::Dims{1}, kn::Dims{1}, kn::Dims{1}, kn::Dims{1}};
        cpu().where(dt, cond.data() + o, x.data() + o, y.data() + o, out.data(), l);
        return out;
      },
      "where");
  require_position_independent<T>(
      n,
      [&](std::int64_t o, std::int64_t len) {
        std::vector<T> out(x.begin() + o, x.begin() + o + len);
        cpu().accumulate(nax::ReduceOp::sum, dt, out.data(), y.data() + o, static_cast<std::size_t>(len));
        return out;
      },
      "accumulate");
  require_position_independent<T>(
      n,
      [&](std::int64_t o, std::int64_t len) {
        std::vector<T> out(static_cast<std::size_t>(len));
        kn::Layout<2> l;
        l.rank = 1;
        l.sizes[0] = len;
        l.strides = {kn::Dims{1}, kn::Dims{1}};
        cpu().copy(sizeof(T), x.data() + o, out.data(), l);
        return out;
      },
      "copy");
  require_position_independent<std::uint16_t>(
      n,
      [&](std::int64_t o, std::int64_t len) {
        std::vector<std::uint16_t> out(static_cast<std::size_t>(len));
        cpu().convert(dt, x.data() + o, DType::bf16, out.data(), len);
        return out;
      },
      "convert to bf16");
  const std::vector<std::uint16_t> halves = [&] {
    std::vector<std::uint16_t> h(x.size());
    cpu().convert(dt, x.data(), DType::bf16, h.data(), n);
    return h;
  }();
  require_position_independent<T>(
      n,
      [&](std::int64_t o, std::int64_t len) {
        std::vector<T> out(static_cast<std::size_t>(len));
        cpu().convert(DType::bf16, halves.data() + o, dt, out.data(), len);
        return out;
      },
      "convert from bf16");
}

TEST_CASE("adamw kernel: an element's bits do not depend on its position or the array's length", "[tree]") {
  const std::int64_t n = 200;
  const auto p = random_values<float>(n), g = random_values<float>(n), m = random_values<float>(n, 0.1);
  auto v = random_values<float>(n, 0.01);
  for (auto& e : v) e = std::abs(e);
  const kn::AdamWStep step{.lr = 1e-3, .weight_decay = 0.1, .correction1 = 0.19, .correction2 = 0.0975};
  for (int which = 0; which < 3; ++which)
    require_position_independent<float>(
        n,
        [&](std::int64_t o, std::int64_t len) {
          std::vector<float> outs[3];
          for (auto& out : outs) out.resize(static_cast<std::size_t>(len));
          cpu().adamw(len, p.data() + o, m.data() + o, v.data() + o, g.data() + o, outs[0].data(), outs[1].data(), outs[2].data(),
                      step);
          return outs[which];
        },
        "adamw output " + std::to_string(which));
}

TEMPLATE_TEST_CASE("row kernels: a row's bits do not depend on the other rows", "[tree]", float, double) {
  using T = TestType;
  const DType dt = dtype_of<T>();
  for (const std::int64_t n : {1, 15, 16, 17, 33, 100}) {
    const std::int64_t rows = 9;
    const auto x = random_values<T>(static_cast<std::size_t>(rows * n), 3.0), dy = random_values<T>(x.size());
    const auto scale = random_values<T>(static_cast<std::size_t>(n)), bias = random_values<T>(static_cast<std::size_t>(n));
    // Every kernel's outputs for rows [r0, r0 + count), concatenated.
    auto outputs = [&](std::int64_t r0, std::int64_t count) {
      const std::size_t size = static_cast<std::size_t>(count * n);
      std::vector<T> all, y(size), dx(size), mean(static_cast<std::size_t>(count)), rstd(mean.size());
      for (const bool log : {false, true}) {
        cpu().softmax_forward(dt, count, n, x.data() + r0 * n, y.data(), log);
        cpu().softmax_backward(dt, count, n, y.data(), dy.data() + r0 * n, dx.data(), log);
        all.insert(all.end(), y.begin(), y.end());
        all.insert(all.end(), dx.begin(), dx.end());
      }
      cpu().layer_norm_forward(dt, count, n, x.data() + r0 * n, scale.data(), bias.data(), 1e-5, y.data(), mean.data(),
                               rstd.data());
      std::vector<T> dscale(static_cast<std::size_t>(n)), dbias(dscale.size());
      cpu().layer_norm_backward(dt, count, n, x.data() + r0 * n, scale.data(), mean.data(), rstd.data(), dy.data() + r0 * n,
                                dx.data(), dscale.data(), dbias.data(), SumTree{.on = true});
      for (const auto* part : {&y, &mean, &rstd, &dx}) all.insert(all.end(), part->begin(), part->end());
      return all;
    };
    const auto whole = outputs(0, rows);
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto alone = outputs(r, 1);
      // The whole's outputs for row r, gathered from its concatenation.
      std::vector<T> want;
      std::size_t at = 0;
      for (const std::int64_t width : {n, n, n, n, n, std::int64_t{1}, std::int64_t{1}, n}) {
        const auto begin = whole.begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(r * width));
        want.insert(want.end(), begin, begin + width);
        at += static_cast<std::size_t>(rows * width);
      }
      require_same_bits(alone, want, "row " + std::to_string(r) + " of length " + std::to_string(n));
    }
  }
}

TEST_CASE("rotary kernel: a row's bits depend only on its data and absolute position", "[tree]") {
  const std::int64_t seq = 24, head_dim = 8, outer = 5;
  const auto x = random_values<float>(static_cast<std::size_t>(outer * seq * head_dim));
  kn::RotarySizes s{.dtype = DType::f32, .seq_len = seq, .seq_stride = head_dim, .head_dim_stride = 1, .rotary_dims = 6};
  std::vector<std::int64_t> offsets;
  for (std::int64_t o = 0; o < outer; ++o) offsets.push_back(o * seq * head_dim);
  auto whole = x;
  cpu().rotary_in_place(s, whole.data(), offsets.data(), outer);
  // Positions [8, 24) of outer index 3 alone, as a sequence starting at position 8.
  std::vector<float> part(x.begin() + 3 * seq * head_dim + 8 * head_dim, x.begin() + 4 * seq * head_dim);
  kn::RotarySizes ps = s;
  ps.seq_len = 16, ps.position_offset = 8;
  const std::int64_t zero[1] = {0};
  cpu().rotary_in_place(ps, part.data(), zero, 1);
  require_same_bits(part.data(), whole.data() + 3 * seq * head_dim + 8 * head_dim, part.size(), "rotary rows 8.. of head 3");
}

}  // namespace
