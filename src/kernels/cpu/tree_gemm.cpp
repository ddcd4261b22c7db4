// Deterministic mode's GEMM (GemmShape::tree): every C element is its sum over k in the SumTree's
// order, a leaf accumulated by fused multiply-adds from zero in index order, a node left + right,
// then + beta C. Each element's operation sequence is fixed by k and the tree alone, so it does
// not depend on m, n, the batch, the layouts, the alignment or threads (OpenBLAS's order can
// depend on any of them). Blocked as usual: op(B) packed into panels of a tile's columns, op(A)
// read where it lies when untransposed (its rows run along k) and packed into panels of its rows
// otherwise, the tile's accumulators in registers; the tree's pending partial sums wait on a small
// stack beside the tile. Vector lanes and the zero padding of edge tiles do
// exactly what a scalar std::fma would, so edge elements get the same bits as the others.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/fma_vector.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/sum_schedule.h"

namespace nax::cpu {

namespace {

// A register tile of `rows` x `vectors` vectors of C. With `hold_left`, the newest pending partial
// sum stays in registers too (a second set of accumulators): a leaf that completes a node then adds
// its left sibling without a trip through memory, which pays when leaves are short; long leaves
// prefer more rows (fewer loads of B per multiply-add: with AVX-512, 12 rows of 2 vectors use 24
// of the 32 registers and run about 3% faster than 8 rows on the `small` model's shapes).
template <typename T, bool kHoldLeft, bool kWide = false>
struct Tile {
  using Value = T;
  using Vec = FmaVector<T>;
  static constexpr bool hold_left = kHoldLeft;
  static constexpr bool avx512 = Vec::width > 1 && sizeof(typename Vec::V) == 64;
  // Wide: 8 rows of 3 vectors, 11 loads per 24 multiply-adds instead of 14 (up to 8% faster where
  // B is read along its rows and wide enough that few columns are padding).
  static constexpr int vectors = Vec::width == 1 ? 4 : (avx512 && kWide && !kHoldLeft) ? 3 : 2;
  static constexpr int rows = Vec::width == 1 ? 4 : avx512 ? (kHoldLeft ? 6 : vectors == 3 ? 8 : 12) : (kHoldLeft ? 3 : 6);
  static constexpr int cols = vectors * Vec::width;
};

// One operand as the product sees it: op(X), with op the transpose when `trans`.
template <typename T>
struct Operand {
  const T* data;
  std::int64_t ld;
  bool trans;
};

// A panel packed across its source's rows is written a chunk of k at a time, so the lines being
// filled stay in the L1 cache while each source row passes over them.
constexpr std::int64_t kPackChunk = 64;

// out[kk * W + j] = rows[j * ld + kk] for every kk < k and j < W (a panel whose lines are the
// source's rows, written k-major) by vector gathers where the build has them, 16 rows of f32 at a
// time; false where it does not (the caller copies element by element).
template <int W, typename T>
bool gather_rows([[maybe_unused]] const T* rows, [[maybe_unused]] std::int64_t ld, [[maybe_unused]] std::int64_t k,
                 [[maybe_unused]] T* out) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && W % 16 == 0) {
    if (ld > std::numeric_limits<std::int32_t>::max() / 16) return false;
    const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32(static_cast<int>(ld)));
    for (std::int64_t kk = 0; kk < k; ++kk)
      for (int v = 0; v < W / 16; ++v)
        _mm512_storeu_ps(out + kk * W + v * 16,
                         _mm512_mask_i32gather_ps(_mm512_setzero_ps(), 0xFFFF, offsets, rows + v * 16 * ld + kk, 4));
    return true;
  }
#endif
  return false;
}

// One panel of W lines (rows of op(A), or columns of op(B)) from line `first` on, k x W (k-major),
// of which the first `valid` exist and the rest are zero. A line's k values lie along a row of the
// stored operand when `lines_are_rows` (op(A) untransposed, op(B) transposed: read one row per line,
// written W apart) and down its columns otherwise (one stored row per kk, W values side by side).
// Either way the source is read along its rows.
template <int W, typename T>
void pack_panel(const T* data, std::int64_t ld, bool lines_are_rows, std::int64_t k, std::int64_t first, std::int64_t valid,
                T* out) {
  if (!lines_are_rows) {
    for (std::int64_t kk = 0; kk < k; ++kk) {
      const T* src = data + kk * ld + first;
      T* dst = out + kk * W;
      if (valid == W) {
        std::memcpy(dst, src, sizeof(T) * W);
        continue;
      }
      for (int j = 0; j < valid; ++j) dst[j] = src[j];
      for (int j = static_cast<int>(valid); j < W; ++j) dst[j] = T(0);
    }
    return;
  }
  if (valid == W && gather_rows<W>(data + first * ld, ld, k, out)) return;
  for (std::int64_t k0 = 0; k0 < k; k0 += kPackChunk) {
    const std::int64_t k1 = std::min(k, k0 + kPackChunk);
    for (int j = 0; j < W; ++j) {
      if (j >= valid) {
        for (std::int64_t kk = k0; kk < k1; ++kk) out[kk * W + j] = T(0);
        continue;
      }
      const T* src = data + (first + j) * ld;
      for (std::int64_t kk = k0; kk < k1; ++kk) out[kk * W + j] = src[kk];
    }
  }
}

// Rows [row0, row0 + rows) of op(A) (m x k) as panels of the tile's rows R, each k x R (k-major);
// rows past m are zero.
template <typename Tile, typename T = typename Tile::Value>
void pack_a(const Operand<T>& a, std::int64_t m, std::int64_t k, std::int64_t row0, std::int64_t rows, T* out) {
  constexpr int R = Tile::rows;
  for (std::int64_t first = row0; first < row0 + rows; first += R, out += k * R)
    pack_panel<R>(a.data, a.ld, !a.trans, k, first, std::min<std::int64_t>(R, m - first), out);
}

// Columns [col0, col0 + cols) of op(B) (k x n) as panels of the tile's columns C, each k x C
// (row-major); columns past n are zero.
template <typename Tile, typename T = typename Tile::Value>
void pack_b(const Operand<T>& b, std::int64_t k, std::int64_t n, std::int64_t col0, std::int64_t cols, T* out) {
  constexpr int C = Tile::cols;
  for (std::int64_t first = col0; first < col0 + cols; first += C, out += k * C)
    pack_panel<C>(b.data, b.ld, b.trans, k, first, std::min<std::int64_t>(C, n - first), out);
}

// The tile's sums over k in the schedule's tree: b a packed (k x cols) panel; a a packed (k x rows)
// panel, or with kDirectA the tile's rows of op(A) where they lie in A, a_ld apart (A untransposed:
// its rows run along k already, so packing would only copy them); out rows x cols with rows ld
// apart; stack holds (schedule.depth - 1) tiles of pending partial sums.
template <typename Tile, bool kDirectA, typename T = typename Tile::Value>
void tile_sums(const T* a, std::int64_t a_ld, const T* b, const SumSchedule& schedule, T* stack, T* out, std::int64_t ld) {
  using Vec = typename Tile::Vec;
  using V = typename Vec::V;
  constexpr int R = Tile::rows, NV = Tile::vectors, C = Tile::cols, W = Vec::width;
  V acc[R][NV], left[Tile::hold_left ? R : 1][NV];
  for (auto& row : acc)
    for (auto& x : row) x = Vec::zero();
  for (auto& row : left)
    for (auto& x : row) x = Vec::zero();
  T* pending = stack;  // past the partial sums waiting in memory
  bool left_held = false, first = true;
  for (const SumLeaf& leaf : schedule.leaves) {
    if (!first) {  // the previous node waits as a left half
      if (!Tile::hold_left || left_held) {
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < NV; ++v) Vec::store(pending + r * C + v * W, Tile::hold_left ? left[r][v] : acc[r][v]);
        pending += R * C;
      }
      if constexpr (Tile::hold_left) {
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < NV; ++v) left[r][v] = acc[r][v];
        left_held = true;
      }
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) acc[r][v] = Vec::zero();
    }
    first = false;
    constexpr std::int64_t a_step = kDirectA ? 1 : R;
    const std::int64_t a_row = kDirectA ? a_ld : 1;
    const T* ak = a + leaf.begin * a_step;
    const T* bk = b + leaf.begin * C;
    for (std::int64_t kk = 0; kk < leaf.length; ++kk, ak += a_step, bk += C) {
      V bv[NV];
      for (int v = 0; v < NV; ++v) bv[v] = Vec::load(bk + v * W);
      for (int r = 0; r < R; ++r) {
        const V av = Vec::splat(ak[r * a_row]);
        for (int v = 0; v < NV; ++v) acc[r][v] = Vec::fma(av, bv[v], acc[r][v]);
      }
    }
    for (int m = 0; m < leaf.merges; ++m) {
      if (left_held) {
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < NV; ++v) acc[r][v] = Vec::add(left[r][v], acc[r][v]);
        left_held = false;
      } else {
        pending -= R * C;
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < NV; ++v) acc[r][v] = Vec::add(Vec::load(pending + r * C + v * W), acc[r][v]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) Vec::store(out + r * ld + v * W, acc[r][v]);
}

// C's block (rows x cols of the tile) = tile, or tile + beta C.
template <typename Tile, typename T = typename Tile::Value>
void store_tile(const T* tile, std::int64_t rows, std::int64_t cols, T beta, T* c, std::int64_t ldc) {
  constexpr int C = Tile::cols;
  for (std::int64_t r = 0; r < rows; ++r, c += ldc, tile += C)
    for (std::int64_t j = 0; j < cols; ++j) c[j] = beta == T(0) ? tile[j] : tile[j] + beta * c[j];
}

// Rows of op(A) per packed block: about 256 KiB of it, reused by every column panel of a block
// of op(B).
template <typename Tile, typename T = typename Tile::Value>
std::int64_t block_rows(std::int64_t k) {
  constexpr int R = Tile::rows;
  const std::int64_t rows = std::clamp<std::int64_t>(
      (std::int64_t{1} << 18) / static_cast<std::int64_t>(sizeof(T)) / std::max<std::int64_t>(k, 1), R, 1024);
  return rows / R * R;
}

// Columns of op(B) per packed block: about 2 MiB of it (the packed copy of a large B, a vocabulary
// projection's, stays small), reused by every row block of op(A).
template <typename Tile, typename T = typename Tile::Value>
std::int64_t block_cols(std::int64_t k) {
  constexpr int C = Tile::cols;
  const std::int64_t cols =
      std::max<std::int64_t>((std::int64_t{1} << 21) / static_cast<std::int64_t>(sizeof(T)) / std::max<std::int64_t>(k, 1), C);
  return cols / C * C;
}

template <typename Tile, typename T = typename Tile::Value>
void tree_gemm_one(const GemmShape& g, const Operand<T>& a, const Operand<T>& b, T* c, T* a_packed, T* b_packed,
                   const SumSchedule& schedule, T* stack) {
  constexpr int R = Tile::rows, C = Tile::cols;
  const std::int64_t k = g.k, mc = block_rows<Tile>(k), nc = block_cols<Tile>(k);
  // op(A) untransposed is read where it lies, but for a last panel short of R rows (packed, zero
  // padded, so that no row past m is read)
  const bool direct_a = !a.trans;
  T tile[R * C];
  for (std::int64_t col0 = 0; col0 < g.n; col0 += nc) {
    const std::int64_t cols = std::min(nc, g.n - col0);
    pack_b<Tile>(b, k, g.n, col0, cols, b_packed);
    for (std::int64_t i0 = 0; i0 < g.m; i0 += mc) {
      const std::int64_t rows = std::min(mc, g.m - i0);
      if (!direct_a) pack_a<Tile>(a, g.m, k, i0, rows, a_packed);
      else if (rows % R != 0) pack_a<Tile>(a, g.m, k, i0 + rows / R * R, rows % R, a_packed);
      for (std::int64_t j0 = 0; j0 < cols; j0 += C) {
        const T* b_panel = b_packed + (j0 / C) * k * C;
        for (std::int64_t p = 0; p < rows; p += R) {
          T* c_tile = c + (i0 + p) * g.ldc + col0 + j0;
          const std::int64_t tile_rows = std::min<std::int64_t>(R, rows - p), tile_cols = std::min<std::int64_t>(C, cols - j0);
          const bool direct = direct_a && tile_rows == R;
          const T* a_panel = direct ? a.data + (i0 + p) * a.ld : a_packed + (direct_a ? 0 : (p / R) * k * R);
          auto sums = [&](T* out, std::int64_t ld) {
            if (direct) tile_sums<Tile, true>(a_panel, a.ld, b_panel, schedule, stack, out, ld);
            else tile_sums<Tile, false>(a_panel, 0, b_panel, schedule, stack, out, ld);
          };
          if (g.beta == 0 && tile_rows == R && tile_cols == C) {  // a whole tile goes straight from registers to C
            sums(c_tile, g.ldc);
            continue;
          }
          sums(tile, C);
          store_tile<Tile>(tile, tile_rows, tile_cols, static_cast<T>(g.beta), c_tile, g.ldc);
        }
      }
    }
  }
}

// The packed panels (0: op(A)'s, 1: op(B)'s) and the pending sums (2), kept per thread between
// calls: a deterministic step makes thousands of small GEMMs (attention's blocks), and fresh zeroed
// buffers for each, page faults included, cost more than many of their products.
template <typename T>
T* scratch(int which, std::size_t count) {
  thread_local std::vector<T> buffers[3];
  std::vector<T>& buffer = buffers[which];
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

template <typename Tile, typename T = typename Tile::Value>
void tree_gemm_tiled(const GemmShape& g, const T* a, const T* b, T* c, const SumSchedule& schedule) {
  constexpr int R = Tile::rows, C = Tile::cols;
  const std::int64_t mc = std::min(block_rows<Tile>(g.k), g.m), nc = std::min(block_cols<Tile>(g.k), g.n);
  // An untransposed op(A) is read in place, but for one last panel short of R rows (tree_gemm_one)
  const std::int64_t a_rows = g.trans_a ? (mc + R - 1) / R * R : R;
  T* a_packed = scratch<T>(0, static_cast<std::size_t>(std::max<std::int64_t>(1, a_rows * g.k)));
  T* b_packed = scratch<T>(1, static_cast<std::size_t>(std::max<std::int64_t>(1, (nc + C - 1) / C * C * g.k)));
  T* stack = scratch<T>(2, static_cast<std::size_t>(std::max(1, schedule.depth) * R * C));
  for (std::int64_t t = 0; t < g.batch; ++t)
    tree_gemm_one<Tile>(g, {a + t * g.stride_a, g.lda, g.trans_a}, {b + t * g.stride_b, g.ldb, g.trans_b}, c + t * g.stride_c,
                        a_packed, b_packed, schedule, stack);
}

// Leaves of 16 or more amortise a trip through memory per node (shorter ones keep the left half in registers).
template <typename T>
void tree_gemm_typed(const GemmShape& g, const T* a, const T* b, T* c) {
  if (g.m <= 0 || g.n <= 0) return;
  const SumSchedule schedule = sum_schedule(g.k, g.tree);
  const bool long_leaves = !schedule.leaves.empty() && g.k >= 16 * static_cast<std::int64_t>(schedule.leaves.size());
  if (long_leaves && !g.trans_b && g.n >= 512)
    tree_gemm_tiled<Tile<T, false, true>>(g, a, b, c, schedule);
  else if (long_leaves)
    tree_gemm_tiled<Tile<T, false>>(g, a, b, c, schedule);
  else
    tree_gemm_tiled<Tile<T, true>>(g, a, b, c, schedule);
}

}  // namespace

void tree_gemm(DType dtype, const GemmShape& shape, const void* a, const void* b, void* c) {
  switch (dtype) {
    case DType::f32:
      return tree_gemm_typed(shape, static_cast<const float*>(a), static_cast<const float*>(b), static_cast<float*>(c));
    case DType::f64:
      return tree_gemm_typed(shape, static_cast<const double*>(a), static_cast<const double*>(b), static_cast<double*>(c));
    default:
      fail("gemm", "deterministic mode: unsupported dtype {}", dtype_name(dtype));
  }
}

}  // namespace nax::cpu
