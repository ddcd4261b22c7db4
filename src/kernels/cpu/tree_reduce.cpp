// Deterministic mode's sum reduction: each output's inputs, in the row-major order of the reduced
// dimensions, summed in the SumTree's order (a leaf from its first term, then +=; a node left +
// right). Outputs are computed in chunks along the innermost kept dimension, so that a leaf's
// loop runs across a chunk of independent sums: vectorised where the chunk is contiguous, else
// several chains of additions side by side.
#include <algorithm>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/sum_schedule.h"

namespace nax::cpu {

namespace {

// The row-major walk over a group of a layout's dimensions, tracking each operand's offset.
struct Walk {
  int rank = 0;
  Dims sizes{};
  std::array<Dims, 2> strides{};
  Dims index{};
  std::array<std::int64_t, 2> offset{};

  void add(const Layout<2>& l, int d) {
    sizes[rank] = l.sizes[d];
    for (int k = 0; k < 2; ++k) strides[k][rank] = l.strides[k][d];
    ++rank;
  }
  std::int64_t count() const {
    std::int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= sizes[d];
    return n;
  }
  void seek(std::int64_t linear) {
    offset = {0, 0};
    for (int d = rank - 1; d >= 0; --d) {
      index[d] = linear % sizes[d];
      linear /= sizes[d];
      for (int k = 0; k < 2; ++k) offset[k] += index[d] * strides[k][d];
    }
  }
  // Elements left in the innermost dimension's run from here, and its input stride.
  std::int64_t run_left() const { return rank == 0 ? 1 : sizes[rank - 1] - index[rank - 1]; }
  std::int64_t run_stride() const { return rank == 0 ? 0 : strides[0][rank - 1]; }
  // Steps over `run` (at most run_left()) elements.
  void skip(std::int64_t run) {
    if (rank == 0) return;
    index[rank - 1] += run - 1;
    for (int k = 0; k < 2; ++k) offset[k] += (run - 1) * strides[k][rank - 1];
    next();
  }
  void next() {
    for (int d = rank - 1; d >= 0; --d) {
      for (int k = 0; k < 2; ++k) offset[k] += strides[k][d];
      if (++index[d] < sizes[d]) return;
      for (int k = 0; k < 2; ++k) offset[k] -= strides[k][d] * sizes[d];
      index[d] = 0;
    }
  }
};

// acc[x] = p[x] (first) or acc[x] += p[x], x < width: outputs side by side, vectorised.
template <typename T>
void load_or_add(bool first, const T* p, std::int64_t width, T* acc) {
  if (first) {
    for (std::int64_t x = 0; x < width; ++x) acc[x] = p[x];
  } else {
    for (std::int64_t x = 0; x < width; ++x) acc[x] += p[x];
  }
}

// The same for kWidth outputs `step` apart, over a run of `run` inputs `stride` apart: kWidth
// independent chains of additions.
template <typename T, int kWidth>
void add_run(bool first, const T* p, std::int64_t step, std::int64_t stride, std::int64_t run, T* acc) {
  T a[kWidth];
  for (int x = 0; x < kWidth; ++x) a[x] = first ? p[x * step] : acc[x] + p[x * step];
  for (std::int64_t j = 1; j < run; ++j)
    for (int x = 0; x < kWidth; ++x) a[x] += p[x * step + j * stride];
  for (int x = 0; x < kWidth; ++x) acc[x] = a[x];
}

constexpr int kChains = 8;

// A leaf: acc[x] = the sum over reduced indices [begin, begin + length), in order, of the inputs of
// output x (at base + x * step), x < width. Walks runs of the innermost reduced dimension.
template <typename T>
void leaf_sums(const Walk& reduced, std::int64_t begin, std::int64_t length, const T* base, std::int64_t step, std::int64_t width,
               T* acc) {
  Walk r = reduced;
  r.seek(begin);
  bool first = true;
  for (std::int64_t done = 0; done < length; first = false) {
    const std::int64_t run = std::min(length - done, r.run_left()), stride = r.run_stride();
    const T* p = base + r.offset[0];
    if (step == 1) {
      for (std::int64_t j = 0; j < run; ++j) load_or_add(first && j == 0, p + j * stride, width, acc);
    } else {
      std::int64_t x = 0;
      for (; x + kChains <= width; x += kChains) add_run<T, kChains>(first, p + x * step, step, stride, run, acc + x);
      for (; x < width; ++x) add_run<T, 1>(first, p + x * step, step, stride, run, acc + x);
    }
    done += run;
    r.skip(run);
  }
}

template <typename T>
void tree_sum_typed(const T* in, T* out, std::int64_t out_count, const Layout<2>& layout, const SumTree& tree) {
  std::fill(out, out + out_count, T(0));
  const Layout<2> l = coalesce(layout);
  Walk reduced, outer;
  std::int64_t inner = 1, inner_in = 0, inner_out = 0;  // the innermost kept dimension: size, strides
  int inner_dim = -1;
  for (int d = 0; d < l.rank; ++d) {
    if (l.sizes[d] == 0) return;  // nothing to sum, or no outputs
    if (l.strides[1][d] != 0) inner_dim = d;
  }
  for (int d = 0; d < l.rank; ++d) {
    if (l.strides[1][d] == 0)
      reduced.add(l, d);
    else if (d != inner_dim)
      outer.add(l, d);
  }
  if (inner_dim >= 0) inner = l.sizes[inner_dim], inner_in = l.strides[0][inner_dim], inner_out = l.strides[1][inner_dim];

  const SumSchedule schedule = sum_schedule(reduced.count(), tree);
  const std::int64_t chunk = std::min<std::int64_t>(inner, inner_in == 1 ? 2048 : 64);
  std::vector<T> stack(static_cast<std::size_t>(schedule.depth * chunk));
  const std::int64_t outer_count = outer.count();
  for (std::int64_t o = 0; o < outer_count; ++o) {
    outer.seek(o);
    for (std::int64_t c0 = 0; c0 < inner; c0 += chunk) {
      const std::int64_t width = std::min(chunk, inner - c0);
      const T* base = in + outer.offset[0] + c0 * inner_in;
      sum_columns(schedule, width, stack.data(), [&](std::int64_t begin, std::int64_t length, T* acc) {
        leaf_sums(reduced, begin, length, base, inner_in, width, acc);
      });
      T* po = out + outer.offset[1] + c0 * inner_out;
      for (std::int64_t x = 0; x < width; ++x) po[x * inner_out] = stack[static_cast<std::size_t>(x)];
    }
  }
}

}  // namespace

void tree_sum(DType dtype, const void* in, void* out, std::int64_t out_count, const Layout<2>& layout, const SumTree& tree) {
  NAX_DISPATCH_NUMERIC(dtype, "reduce", T,
                       tree_sum_typed<T>(static_cast<const T*>(in), static_cast<T*>(out), out_count, layout, tree));
}

}  // namespace nax::cpu
