// Deterministic mode's CPU kernels (SumTree on), compared bit for bit:
//  - the tree GEMM against a scalar host implementation of the same tree (recursive, std::fma) on
//    odd shapes, transposes, padded leading dimensions, batches and beta 0 and 1; a block of rows
//    or columns computed alone gives the same bits as in the whole product;
//  - split consistency, the point of the mode: K cut into p blocks (p = 2, 4), each block
//    computed with SumTree::canonical_for_block_of(p) and the blocks added pairwise as a psum
//    does ((b0 + b1) + (b2 + b3)), gives the bits of the whole computed with
//    canonical_for_block_of(1).
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
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

#include "nax/core/dtype.h"
#include "nax/core/sum_tree.h"
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

// Bit-for-bit equality (NaN-safe: payloads and signed zeros compared as bits), naming the first
// element that differs.
template <typename T>
void require_same_bits(const T* got, const T* want, std::size_t n, const std::string& what) {
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      INFO(what << ": element " << i << " of " << n << " differs: got " << std::setprecision(17) << static_cast<double>(got[i])
                << ", want " << static_cast<double>(want[i]));
      REQUIRE(false);
    }
  }
  SUCCEED();
}

template <typename T>
void require_same_bits(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  require_same_bits(got.data(), want.data(), got.size(), what);
}

// The pairwise halving order of a psum over p blocks: (b0 + b1) + (b2 + b3).
template <typename T>
std::vector<T> add_pairwise(std::vector<std::vector<T>> blocks) {
  while (blocks.size() > 1) {
    std::vector<std::vector<T>> next;
    for (std::size_t b = 0; b < blocks.size(); b += 2) {
      std::vector<T> sum(blocks[b].size());
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = blocks[b][i] + blocks[b + 1][i];
      next.push_back(std::move(sum));
    }
    blocks = std::move(next);
  }
  return blocks.front();
}

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

  static GemmCase make(std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b, std::int64_t batch, double beta,
                       const SumTree& tree) {
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
  const std::vector<SumTree> trees{SumTree{.on = true}, SumTree::canonical_for_block_of(4), SumTree{.on = true, .forced = 1, .leaf = 5}};
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
  for (const std::int64_t k : {64, 96, 100, 256, 1024, 4 * 37})
    for (const std::int64_t p : {2, 4}) {
      const std::int64_t m = 13, n = 35, kb = k / p;
      // A (m x k) and B (k x n) row-major; block b is A's columns and B's rows [b kb, (b + 1) kb).
      const auto a = random_values<T>(static_cast<std::size_t>(m * k)), b = random_values<T>(static_cast<std::size_t>(k * n));
      kn::GemmShape whole{.m = m, .n = n, .k = k, .lda = k, .ldb = n, .ldc = n, .tree = SumTree::canonical_for_block_of(1)};
      std::vector<T> want(static_cast<std::size_t>(m * n));
      cpu().gemm(dtype_of<T>(), whole, a.data(), b.data(), want.data());
      std::vector<std::vector<T>> blocks;
      for (std::int64_t blk = 0; blk < p; ++blk) {
        kn::GemmShape s = whole;
        s.k = kb;
        s.tree = SumTree::canonical_for_block_of(p);
        blocks.emplace_back(static_cast<std::size_t>(m * n));
        cpu().gemm(dtype_of<T>(), s, a.data() + blk * kb, b.data() + blk * kb * n, blocks.back().data());
      }
      require_same_bits(add_pairwise(blocks), want, "k " + std::to_string(k) + " in " + std::to_string(p) + " blocks");
    }
}

}  // namespace
