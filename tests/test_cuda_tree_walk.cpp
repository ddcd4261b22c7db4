// The CUDA kernels' walks of deterministic mode's sum tree (src/kernels/cuda/tree_walk.h), run on
// the CPU (the header is host and device code) against the recursive host reference of the tree,
// bit for bit: TreeStack and TreeDot as the tree GEMM uses them, sparse_tree_sum as the tree
// scatter does. The kernels around them need a GPU (test_cuda_kernels); these walks do not.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/tree_walk.h"
#include "nax/kernels/sum_tree.h"

namespace {

using nax::SumTree;
namespace cd = nax::cuda::detail;

std::vector<SumTree> trees() {
  return {SumTree::canonical_for_block_of(1),         SumTree::canonical_for_block_of(4),
          SumTree::canonical_for_block_of(1, 64),     SumTree::canonical_for_block_of(8, 64),
          SumTree{.on = true, .forced = 0},           SumTree{.on = true, .forced = 3, .leaf = 4},
          SumTree{.on = true, .forced = 0, .leaf = 1}};
}

template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Terms of mixed sizes and signs, so that the order of additions shows in the last bits; some -0.
template <typename T>
std::vector<T> terms(std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(std::ldexp(normal(rng), exponent(rng)));
  for (std::size_t i = 3; i < n; i += 11) v[i] = -T{0};
  return v;
}

// The fma tree of a GEMM element, recursively: leaves fma from +0, node = left + right.
template <typename T>
T recursive_dot(const T* a, const T* b, std::int64_t n, SumTree tree) {
  if (tree.halves(n)) return recursive_dot(a, b, n / 2, tree.half()) + recursive_dot(a + n / 2, b + n / 2, n / 2, tree.half());
  T acc = 0;
  for (std::int64_t i = 0; i < n; ++i) acc = std::fma(a[i], b[i], acc);
  return acc;
}

template <typename T>
void check_walks(std::int64_t n, SumTree tree, std::mt19937_64& rng) {
  const std::string what = "n=" + std::to_string(n) + " forced=" + std::to_string(tree.forced) + " leaf=" + std::to_string(tree.leaf);
  INFO(what);
  const cd::TreeShape shape = cd::tree_shape(tree, n, "test");
  REQUIRE(shape.leaf * shape.leaves() == n);

  // Leaves folded from their first term, pushed in order: nax::tree_sum's bits.
  const auto x = terms<T>(static_cast<std::size_t>(n), rng);
  cd::TreeStack<T> stack;
  for (std::int64_t l = 0; l < shape.leaves(); ++l) {
    T acc = x[l * shape.leaf];
    for (std::int64_t i = 1; i < shape.leaf; ++i) acc = cd::add_rn(acc, x[l * shape.leaf + i]);
    stack.push(acc, l);
  }
  CHECK(stack.size == 1);
  CHECK(same_bits(stack.result(), nax::tree_sum(x.data(), n, tree)));

  // TreeDot, term by term.
  const auto y = terms<T>(static_cast<std::size_t>(n), rng);
  cd::TreeDot<T> dot(shape.leaf);
  for (std::int64_t i = 0; i < n; ++i) dot.add(x[i], y[i]);
  CHECK(same_bits(dot.result(), recursive_dot(x.data(), y.data(), n, tree)));

  // sparse_tree_sum over a few picked positions == the dense tree with +0 elsewhere.
  for (double density : {0.0, 0.02, 0.3, 1.0}) {
    std::bernoulli_distribution picked(density);
    std::vector<std::int32_t> positions;
    std::vector<T> dense(static_cast<std::size_t>(n), T{0});
    for (std::int64_t i = 0; i < n; ++i)
      if (picked(rng) || (density > 0 && i == n - 1)) {
        positions.push_back(static_cast<std::int32_t>(i));
        dense[i] = x[i];
      }
    if (positions.empty()) continue;  // the kernel writes +0 for a row no id picks
    const T sparse = cd::sparse_tree_sum<T>(positions.data(), static_cast<std::int64_t>(positions.size()), shape,
                                            [&](std::int64_t p) { return x[p]; });
    INFO("density " << density << ", " << positions.size() << " picks");
    CHECK(same_bits(sparse, nax::tree_sum(dense.data(), n, tree)));
  }
}

}  // namespace

TEST_CASE("cuda tree walks: the stack, the dot and the sparse walk give the tree's bits", "[cuda][deterministic]") {
  std::mt19937_64 rng(0x7ee5);
  for (SumTree tree : trees())
    for (std::int64_t n : {1, 2, 3, 5, 8, 25, 32, 33, 64, 96, 100, 127, 128, 192, 256, 384, 1000, 1024, 4096, 6144}) {
      check_walks<float>(n, tree, rng);
      check_walks<double>(n, tree, rng);
    }
}

TEST_CASE("cuda tree walks: signed zeros follow the dense tree", "[cuda][deterministic]") {
  // A -0 term alone in its leaf stays -0 only where no +0 sibling or absent term is added to it.
  const SumTree tree = SumTree::canonical_for_block_of(1);
  const std::int64_t n = 64;
  const cd::TreeShape shape = cd::tree_shape(tree, n, "test");
  for (std::int32_t at : {0, 1, 31, 63}) {
    std::vector<float> dense(n, 0.0f);
    dense[at] = -0.0f;
    const float sparse = cd::sparse_tree_sum<float>(&at, 1, shape, [](std::int64_t) { return -0.0f; });
    INFO("position " << at);
    CHECK(same_bits(sparse, nax::tree_sum(dense.data(), n, tree)));
    CHECK(same_bits(sparse, 0.0f));  // +0: some +0 was added to it
  }
  // Every set of picked positions, each term -0, under trees whose leaves hold several terms (gaps
  // before, between and after the picks inside a leaf).
  for (SumTree small : {SumTree{.on = true, .forced = 1, .leaf = 32}, SumTree{.on = true, .forced = 0, .leaf = 4}})
    for (std::int64_t size : {8, 12}) {
      const cd::TreeShape small_shape = cd::tree_shape(small, size, "test");
      for (std::uint32_t mask = 1; mask < (1u << size); ++mask) {
        std::vector<std::int32_t> picks;
        std::vector<float> dense(size, 0.0f);
        for (std::int32_t i = 0; i < size; ++i)
          if (mask & (1u << i)) {
            picks.push_back(i);
            dense[i] = -0.0f;
          }
        const float got = cd::sparse_tree_sum<float>(picks.data(), static_cast<std::int64_t>(picks.size()), small_shape,
                                                     [](std::int64_t) { return -0.0f; });
        INFO("size " << size << " mask " << mask << " leaf " << small.leaf);
        REQUIRE(same_bits(got, nax::tree_sum(dense.data(), size, small)));
      }
    }
  std::vector<float> all_negative(n, -0.0f);
  std::vector<std::int32_t> every(n);
  for (std::int32_t i = 0; i < n; ++i) every[i] = i;
  const float sparse = cd::sparse_tree_sum<float>(every.data(), n, shape, [](std::int64_t) { return -0.0f; });
  CHECK(same_bits(sparse, -0.0f));
  CHECK(same_bits(sparse, nax::tree_sum(all_negative.data(), n, tree)));
}
