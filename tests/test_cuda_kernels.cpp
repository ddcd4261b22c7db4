// CudaKernels (src/kernels/cuda/cuda_kernels.h) against the CPU kernels: every method of the kernel
// interface runs on seeded random inputs through both; floating dtypes are checked against the CPU
// computing in f64 on the same (rounded) inputs, relative error < 1e-3 in f32 and < 1e-2 in bf16,
// i32 and pure data movement exactly. Device outputs are poisoned (every byte 0xff: NaN in f32,
// f64 and bf16) before each run, and NaN never passes. Sizes are odd, strided and broadcast, and
// empty. Without a GPU the program prints one line and exits 77, which CTest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "comparison.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "nax/kernels/kernels.h"
#include "nax/core/dtype.h"
#include "nax/core/error.h"

namespace {

using nax::DType;
using nax::ReduceOp;
namespace kn = nax::kernels;
using Bytes = std::vector<unsigned char>;

kn::Kernels& cpu() { return *kn::cpu_kernels_ptr(); }

// Never destroyed: at exit its destructor could run after the CUDA runtime has shut down.
nax::cuda::CudaKernels& gpu() {
  static auto* kernels = new nax::cuda::CudaKernels(0);
  return *kernels;
}

std::mt19937_64& rng() {
  static std::mt19937_64 engine{0x5eed2024};
  return engine;
}

std::vector<double> normal(std::size_t n, double scale = 1.0, double mean = 0.0) {
  std::normal_distribution<double> dist(mean, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng());
  return v;
}

std::vector<double> integers(std::size_t n, int lo, int hi) {
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng());
  return v;
}

// Values away from zero (divisors, logarithms): |x| in [0.5, 2.5).
std::vector<double> away_from_zero(std::size_t n, bool positive) {
  std::uniform_real_distribution<double> dist(0.5, 2.5);
  std::bernoulli_distribution sign(0.5);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng()) * (positive || sign(rng()) ? 1 : -1);
  return v;
}

const std::vector<DType> kFloating{DType::f32, DType::bf16, DType::f64};
const std::vector<DType> kAll{DType::f32, DType::bf16, DType::f64, DType::i32};

// --- host encodings ---

Bytes encode(const std::vector<double>& v, DType dtype) {
  Bytes bytes(v.size() * nax::dtype_size(dtype));
  for (std::size_t i = 0; i < v.size(); ++i) {
    unsigned char* at = bytes.data() + i * nax::dtype_size(dtype);
    switch (dtype) {
      case DType::f32: {
        const auto x = static_cast<float>(v[i]);
        std::memcpy(at, &x, sizeof x);
        break;
      }
      case DType::f64: std::memcpy(at, &v[i], sizeof(double)); break;
      case DType::bf16: {
        const nax::bf16 x(static_cast<float>(v[i]));
        std::memcpy(at, &x.bits, sizeof x.bits);
        break;
      }
      case DType::i32: {
        const auto x = static_cast<std::int32_t>(v[i]);
        std::memcpy(at, &x, sizeof x);
        break;
      }
    }
  }
  return bytes;
}

std::vector<double> decode(const Bytes& bytes, DType dtype) {
  const std::size_t size = nax::dtype_size(dtype);
  std::vector<double> v(bytes.size() / size);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const unsigned char* at = bytes.data() + i * size;
    switch (dtype) {
      case DType::f32: {
        float x;
        std::memcpy(&x, at, sizeof x);
        v[i] = x;
        break;
      }
      case DType::f64: std::memcpy(&v[i], at, sizeof(double)); break;
      case DType::bf16: {
        nax::bf16 x;
        std::memcpy(&x.bits, at, sizeof x.bits);
        v[i] = static_cast<float>(x);
        break;
      }
      case DType::i32: {
        std::int32_t x;
        std::memcpy(&x, at, sizeof x);
        v[i] = x;
        break;
      }
    }
  }
  return v;
}

// The values as the dtype stores them.
std::vector<double> rounded(const std::vector<double>& v, DType dtype) { return decode(encode(v, dtype), dtype); }

// The CPU computes floating dtypes in f64 (the reference) and i32 as i32.
DType reference_dtype(DType dtype) { return dtype == DType::i32 ? DType::i32 : DType::f64; }

// A host array in the reference dtype.
struct Host {
  DType dtype;
  Bytes bytes;
  Host(const std::vector<double>& values, DType d) : dtype(reference_dtype(d)), bytes(encode(values, dtype)) {}
  Host(std::size_t n, DType d) : dtype(reference_dtype(d)), bytes(n * nax::dtype_size(dtype), 0) {}
  void* data() { return bytes.data(); }
  std::vector<double> values() const { return decode(bytes, dtype); }
};

// --- device arrays ---

class Device {
 public:
  Device(std::size_t n, DType dtype) : n_(n), dtype_(dtype) {
    NAX_CUDA_CHECK(cudaMalloc(&ptr_, std::max<std::size_t>(bytes(), 1)));
    poison();
  }
  Device(const std::vector<double>& values, DType dtype) : Device(values.size(), dtype) { upload(encode(values, dtype)); }
  ~Device() {
    (void)cudaStreamSynchronize(gpu().stream());  // no kernel still uses the memory
    (void)cudaFree(ptr_);
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  void* get() const { return ptr_; }
  std::size_t bytes() const { return n_ * nax::dtype_size(dtype_); }
  // Ordered on the kernels' stream (a plain cudaMemset is not: the stream does not wait for it).
  void poison() { NAX_CUDA_CHECK(cudaMemsetAsync(ptr_, 0xff, bytes(), gpu().stream())); }
  void upload(const Bytes& host) { gpu().copy_from_host(ptr_, host.data(), host.size()); }
  Bytes raw() const {
    Bytes host(bytes());
    gpu().copy_to_host(host.data(), ptr_, host.size());
    return host;
  }
  std::vector<double> values() const { return decode(raw(), dtype_); }

 private:
  void* ptr_ = nullptr;
  std::size_t n_;
  DType dtype_;
};

// --- comparisons ---

// Element-wise (worst_element_scaled): f64 to near rounding; f32 and bf16 as for sums of up to
// 4096 terms accumulated in f32 (the longest reduction these cases run), bf16 rounded once more.
double tolerance(DType dtype) {
  if (dtype == DType::f64) return 1e-12;
  return nax::testing::accumulated_tolerance(dtype, 4096);
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, DType dtype, const std::string& what) {
  if (dtype == DType::i32) CHECK(got == want);
  else nax::testing::check_close_scaled(got, want, tolerance(dtype), what + " [" + std::string(nax::dtype_name(dtype)) + "]");
}

// Exact equality, infinities included; a NaN on either side fails.
void check_equal(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i])) ++bad;
  INFO(what << ": " << bad << " of " << got.size() << " elements differ");
  CHECK(bad == 0);
}

// --- layouts ---

template <int K>
kn::Layout<K> layout_of(std::initializer_list<std::int64_t> sizes, std::initializer_list<std::initializer_list<std::int64_t>> strides) {
  kn::Layout<K> l;
  l.rank = static_cast<int>(sizes.size());
  std::copy(sizes.begin(), sizes.end(), l.sizes.begin());
  int k = 0;
  for (const auto& s : strides) std::copy(s.begin(), s.end(), l.strides[k++].begin());
  return l;
}

// Elements an operand spans: 1 + the largest offset (strides are non-negative here).
template <int K>
std::size_t span(const kn::Layout<K>& l, int operand) {
  std::int64_t last = 0;
  for (int d = 0; d < l.rank; ++d) {
    if (l.sizes[d] == 0) return 0;
    last += (l.sizes[d] - 1) * l.strides[operand][d];
  }
  return static_cast<std::size_t>(last + 1);
}

template <int K>
std::string describe(const kn::Layout<K>& l) {
  std::ostringstream s;
  s << "sizes [";
  for (int d = 0; d < l.rank; ++d) s << (d ? "," : "") << l.sizes[d];
  s << "]";
  for (int k = 0; k < K; ++k) {
    s << " strides" << k << " [";
    for (int d = 0; d < l.rank; ++d) s << (d ? "," : "") << l.strides[k][d];
    s << "]";
  }
  return s.str();
}

// Operands: a and b (broadcast in various ways), out contiguous.
std::vector<kn::Layout<3>> binary_layouts() {
  return {
      layout_of<3>({1}, {{1}, {1}, {1}}),
      layout_of<3>({7}, {{1}, {1}, {1}}),
      layout_of<3>({65537}, {{1}, {1}, {1}}),
      layout_of<3>({1000}, {{1}, {0}, {1}}),                                 // b a scalar
      layout_of<3>({37, 129}, {{129, 1}, {0, 1}, {129, 1}}),                 // b broadcast over rows
      layout_of<3>({37, 129}, {{129, 1}, {1, 0}, {129, 1}}),                 // b broadcast over columns
      layout_of<3>({37, 129}, {{1, 37}, {129, 1}, {129, 1}}),                // a transposed
      layout_of<3>({5, 7, 9}, {{7, 1, 0}, {0, 9, 1}, {63, 9, 1}}),           // both broadcast
      layout_of<3>({0, 5}, {{5, 1}, {5, 1}, {5, 1}}),                        // empty
  };
}

}  // namespace

TEST_CASE("cuda kernels: backend, dtypes and memory", "[cuda]") {
  CHECK(gpu().backend() == nax::Backend::cuda);
  for (DType d : kAll) CHECK(gpu().computes(d));
  for (std::size_t n : {0, 1, 7, 100003}) {
    const auto values = normal(n);
    Device a(n, DType::f64), b(n, DType::f64);
    const Bytes host = encode(values, DType::f64);
    gpu().copy_from_host(a.get(), host.data(), host.size());
    gpu().copy_bytes(b.get(), a.get(), host.size());
    Bytes back(host.size());
    gpu().copy_to_host(back.data(), b.get(), back.size());
    CHECK(back == host);
  }
  gpu().synchronize();
}

TEST_CASE("cuda kernels: fill", "[cuda]") {
  for (DType d : kAll)
    for (std::size_t n : {0, 1, 7, 1000, 65537})
      for (double value : {0.0, 1.5, -2.25, 3e5}) {
        Device out(n, d);
        gpu().fill(d, out.get(), static_cast<std::int64_t>(n), value);
        Bytes want(n * nax::dtype_size(d));
        cpu().fill(d, want.data(), static_cast<std::int64_t>(n), value);
        CHECK(out.raw() == want);
      }
}

TEST_CASE("cuda kernels: convert between every pair of dtypes", "[cuda]") {
  for (DType from : kAll)
    for (DType to : kAll)
      for (std::size_t n : {0, 1, 7, 65537}) {
        auto values = normal(n, 300.0);  // in range of every dtype
        const Bytes in_bytes = encode(values, from);
        Device in(n, from), out(n, to);
        in.upload(in_bytes);
        gpu().convert(from, in.get(), to, out.get(), static_cast<std::int64_t>(n));
        Bytes want(n * nax::dtype_size(to));
        cpu().convert(from, in_bytes.data(), to, want.data(), static_cast<std::int64_t>(n));
        INFO(nax::dtype_name(from) << " -> " << nax::dtype_name(to) << " n=" << n);
        CHECK(out.raw() == want);
      }
}

TEST_CASE("cuda kernels: strided copy of 2-, 4- and 8-byte elements", "[cuda]") {
  const std::vector<kn::Layout<2>> layouts{
      layout_of<2>({1}, {{1}, {1}}),
      layout_of<2>({100003}, {{1}, {1}}),
      layout_of<2>({37, 129}, {{1, 37}, {129, 1}}),      // transpose
      layout_of<2>({37, 129}, {{0, 1}, {129, 1}}),       // broadcast rows
      layout_of<2>({37, 129}, {{129, 1}, {258, 2}}),     // every other destination element
      layout_of<2>({3, 5, 7, 11}, {{1, 3, 15, 105}, {385, 77, 11, 1}}),
      layout_of<2>({0, 4}, {{4, 1}, {4, 1}}),
  };
  for (const DType d : {DType::bf16, DType::f32, DType::f64})
    for (const auto& l : layouts) {
      const std::size_t es = nax::dtype_size(d);
      const Bytes src_bytes = encode(normal(span(l, 0)), d);
      Device src(span(l, 0), d), dst(span(l, 1), d);
      src.upload(src_bytes);
      gpu().copy(es, src.get(), dst.get(), l);
      Bytes want(span(l, 1) * es, 0xff);  // the elements copy does not write stay poisoned on both sides
      cpu().copy(es, src_bytes.data(), want.data(), l);
      INFO(describe(l) << " element size " << es);
      CHECK(dst.raw() == want);
    }
}

TEST_CASE("cuda kernels: binary ops on strided and broadcast operands", "[cuda]") {
  using Op = kn::BinaryOp;
  const std::vector<Op> ops{Op::add, Op::sub, Op::mul, Op::div, Op::max, Op::min, Op::pow,
                            Op::eq,  Op::ne,  Op::lt,  Op::le,  Op::gt,  Op::ge};
  for (DType d : kAll)
    for (const auto& l : binary_layouts())
      for (Op op : ops) {
        const bool integer = d == DType::i32;
        std::vector<double> a, b;
        if (op == Op::pow) {
          a = integer ? integers(span(l, 0), -4, 4) : away_from_zero(span(l, 0), true);
          b = integers(span(l, 1), 0, 3);
        } else if (op == Op::div) {
          a = integer ? integers(span(l, 0), -1000, 1000) : normal(span(l, 0));
          b = integer ? integers(span(l, 1), -9, 9) : away_from_zero(span(l, 1), false);  // i32: 0 divides to 0
        } else {
          a = integers(span(l, 0), -3, 3);  // ties, for the comparisons
          if (!integer && op != Op::eq && op != Op::ne) {
            const auto noise = normal(a.size(), 0.1);
            for (std::size_t i = 0; i < a.size(); ++i) a[i] += noise[i];
          }
          b = integer ? integers(span(l, 1), -3, 3) : rounded(integers(span(l, 1), -3, 3), d);
        }
        a = rounded(a, d);
        b = rounded(b, d);
        Device da(a, d), db(b, d), out(span(l, 2), d);
        gpu().binary(op, d, da.get(), db.get(), out.get(), l);
        Host ha(a, d), hb(b, d), want(span(l, 2), d);
        cpu().binary(op, want.dtype, ha.data(), hb.data(), want.data(), l);
        check_close(out.values(), want.values(), d, "binary op " + std::to_string(static_cast<int>(op)) + " " + describe(l));
      }
}

TEST_CASE("cuda kernels: unary ops", "[cuda]") {
  using Op = kn::UnaryOp;
  for (DType d : kAll)
    for (std::size_t n : {1, 7, 1000, 65537})
      for (Op op : {Op::neg, Op::abs, Op::exp, Op::log, Op::sqrt, Op::rsqrt, Op::tanh, Op::square}) {
        const bool needs_positive = op == Op::log || op == Op::sqrt || op == Op::rsqrt;
        std::vector<double> x;
        if (d == DType::i32) x = needs_positive ? integers(n, 1, 9) : integers(n, -3, 3);
        else x = needs_positive ? away_from_zero(n, true) : normal(n);
        x = rounded(x, d);
        Device in(x, d), out(n, d);
        gpu().unary(op, d, in.get(), out.get(), static_cast<std::int64_t>(n));
        Host hx(x, d), want(n, d);
        cpu().unary(op, want.dtype, hx.data(), want.data(), static_cast<std::int64_t>(n));
        check_close(out.values(), want.values(), d, "unary op " + std::to_string(static_cast<int>(op)) + " n=" + std::to_string(n));
      }
}

TEST_CASE("cuda kernels: where", "[cuda]") {
  const std::vector<kn::Layout<4>> layouts{
      layout_of<4>({7}, {{1}, {1}, {1}, {1}}),
      layout_of<4>({65537}, {{1}, {1}, {1}, {1}}),
      layout_of<4>({37, 129}, {{0, 1}, {129, 1}, {1, 37}, {129, 1}}),  // cond broadcast, b transposed
      layout_of<4>({37, 129}, {{1, 0}, {0, 0}, {129, 1}, {1, 37}}),    // a scalar, out transposed
      layout_of<4>({0, 3}, {{3, 1}, {3, 1}, {3, 1}, {3, 1}}),
  };
  for (DType d : kAll)
    for (const auto& l : layouts) {
      const auto cond = integers(span(l, 0), 0, 1);
      const auto a = rounded(d == DType::i32 ? integers(span(l, 1), -100, 100) : normal(span(l, 1)), d);
      const auto b = rounded(d == DType::i32 ? integers(span(l, 2), -100, 100) : normal(span(l, 2)), d);
      Device dc(cond, d), da(a, d), db(b, d), out(span(l, 3), d);
      gpu().where(d, dc.get(), da.get(), db.get(), out.get(), l);
      Host hc(cond, d), ha(a, d), hb(b, d), want(span(l, 3), d);
      cpu().where(want.dtype, hc.data(), ha.data(), hb.data(), want.data(), l);
      check_equal(out.values(), want.values(), "where " + describe(l));
    }
}

namespace {

struct ReduceCase {
  kn::Layout<2> layout;
  std::int64_t out_count;
};

std::vector<ReduceCase> reduce_cases() {
  return {
      {layout_of<2>({37, 1001}, {{1001, 1}, {1, 0}}), 37},             // innermost reduced: a warp per output
      {layout_of<2>({3, 100003}, {{100003, 1}, {1, 0}}), 3},           // long rows: a block per output, split
      {layout_of<2>({1000003}, {{1}, {0}}), 1},                        // everything
      {layout_of<2>({5001, 7}, {{7, 1}, {0, 1}}), 7},                  // outermost reduced: a thread per output, split
      {layout_of<2>({13, 517, 9}, {{517 * 9, 9, 1}, {9, 0, 1}}), 13 * 9},
      {layout_of<2>({6, 5, 40}, {{200, 40, 1}, {0, 1, 0}}), 5},       // two reduced dimensions around a kept one
      {layout_of<2>({5, 6}, {{6, 1}, {1, 5}}), 30},                    // nothing reduced, output transposed
      {layout_of<2>({1, 1}, {{1, 1}, {0, 0}}), 1},
      {layout_of<2>({4, 0}, {{0, 1}, {1, 0}}), 4},                     // empty reduced range: the identity
  };
}

}  // namespace

TEST_CASE("cuda kernels: reduce sum, max and min", "[cuda]") {
  for (DType d : kAll)
    for (const auto& c : reduce_cases())
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
        const std::size_t n = span(c.layout, 0);
        const auto x = rounded(d == DType::i32 ? integers(n, -50, 50) : normal(n, 1.0, 0.5), d);
        Device in(x, d), out(static_cast<std::size_t>(c.out_count), d);
        gpu().reduce(op, d, in.get(), out.get(), c.out_count, c.layout, nax::SumTree{});
        Host hx(x, d), want(static_cast<std::size_t>(c.out_count), d);
        cpu().reduce(op, want.dtype, hx.data(), want.data(), c.out_count, c.layout, nax::SumTree{});
        const std::string what = "reduce op " + std::to_string(static_cast<int>(op)) + " " + describe(c.layout);
        if (op == ReduceOp::sum) {
          check_close(out.values(), want.values(), d, what);
        } else {
          auto expected = want.values();
          if (d == DType::i32 || n == 0) expected = rounded(expected, d);  // the identity as the dtype stores it
          check_equal(out.values(), expected, what);
        }
      }
}

TEST_CASE("cuda kernels: reduce propagates NaN through max and min", "[cuda]") {
  std::vector<double> x = normal(5000);
  x[4321] = std::nan("");
  Device in(x, DType::f32), out(1, DType::f32);
  gpu().reduce(ReduceOp::max, DType::f32, in.get(), out.get(), 1, layout_of<2>({5000}, {{1}, {0}}), nax::SumTree{});
  CHECK(std::isnan(out.values()[0]));
}

TEST_CASE("cuda kernels: accumulate", "[cuda]") {
  for (DType d : kAll)
    for (std::size_t n : {0, 1, 7, 65537})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
        const auto dst = rounded(d == DType::i32 ? integers(n, -50, 50) : normal(n), d);
        const auto src = rounded(d == DType::i32 ? integers(n, -50, 50) : normal(n), d);
        Device ddst(dst, d), dsrc(src, d);
        gpu().accumulate(op, d, ddst.get(), dsrc.get(), n);
        Host want(dst, d), hsrc(src, d);
        cpu().accumulate(op, want.dtype, want.data(), hsrc.data(), n);
        check_close(ddst.values(), want.values(), d, "accumulate op " + std::to_string(static_cast<int>(op)));
      }
}

namespace {

struct GemmCase {
  std::int64_t m, n, k;
  bool trans_a, trans_b;
  std::int64_t batch;
  std::int64_t pad;  // extra elements per row of every operand (ld > packed)
  double beta;
};

// The m x n entries of C (row stride ldc) of every matrix of the batch.
std::vector<double> matrices_of(const std::vector<double>& c, const kn::GemmShape& g) {
  std::vector<double> out;
  for (std::int64_t t = 0; t < g.batch; ++t)
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j) out.push_back(c[static_cast<std::size_t>(t * g.stride_c + i * g.ldc + j)]);
  return out;
}

void check_gemm(DType d, const GemmCase& c) {
  kn::GemmShape g;
  g.trans_a = c.trans_a, g.trans_b = c.trans_b, g.m = c.m, g.n = c.n, g.k = c.k, g.batch = c.batch, g.beta = c.beta;
  const std::int64_t rows_a = c.trans_a ? c.k : c.m, rows_b = c.trans_b ? c.n : c.k;
  g.lda = (c.trans_a ? c.m : c.k) + c.pad;
  g.ldb = (c.trans_b ? c.k : c.n) + c.pad;
  g.ldc = c.n + c.pad;
  g.stride_a = rows_a * g.lda + 3;  // matrices apart by more than their size
  g.stride_b = rows_b * g.ldb;
  g.stride_c = c.m * g.ldc + 5;
  const auto a = rounded(normal(static_cast<std::size_t>(g.stride_a * c.batch)), d);
  const auto b = rounded(normal(static_cast<std::size_t>(g.stride_b * c.batch)), d);
  const auto c0 = rounded(normal(static_cast<std::size_t>(g.stride_c * c.batch)), d);
  Device da(a, d), db(b, d), dc(c0.size(), d);
  if (c.beta != 0) dc.upload(encode(c0, d));  // beta 0: C stays poisoned, and must not be read
  gpu().gemm(d, g, da.get(), db.get(), dc.get());
  Host ha(a, d), hb(b, d), want(c.beta != 0 ? c0 : std::vector<double>(c0.size(), 0.0), d);
  cpu().gemm(DType::f64, g, ha.data(), hb.data(), want.data());
  INFO("m=" << c.m << " n=" << c.n << " k=" << c.k << " ta=" << c.trans_a << " tb=" << c.trans_b << " batch=" << c.batch
            << " pad=" << c.pad << " beta=" << c.beta);
  check_close(matrices_of(dc.values(), g), matrices_of(want.values(), g), d, "gemm");
}

}  // namespace

TEST_CASE("cuda kernels: gemm through cuBLASLt (transposes, row strides, batches, beta)", "[cuda]") {
  const std::vector<GemmCase> cases{
      {64, 48, 32, false, false, 1, 0, 0.0},   {129, 77, 65, false, false, 1, 3, 0.0}, {33, 40, 24, true, false, 4, 0, 0.0},
      {96, 64, 128, false, true, 1, 8, 0.5},   {40, 56, 72, true, true, 3, 1, 0.0},   {1, 1, 1, false, false, 1, 0, 0.0},
      {7, 9, 300, false, true, 2, 2, 1.0},     {256, 192, 320, false, false, 1, 0, 0.0},
      {5, 6, 0, false, false, 2, 1, 0.5},      {5, 6, 0, false, false, 1, 1, 0.0},  // k = 0: C = beta C
  };
  for (DType d : kFloating)
    for (const auto& c : cases) check_gemm(d, c);
  {  // empty outputs do nothing
    kn::GemmShape g;
    g.m = 0, g.n = 4, g.k = 3;
    gpu().gemm(DType::f32, g, nullptr, nullptr, nullptr);
  }
  kn::GemmShape g;
  g.m = g.n = g.k = 2, g.lda = g.ldb = g.ldc = 2;
  Device x(4, DType::i32);
  CHECK_THROWS_AS(gpu().gemm(DType::i32, g, x.get(), x.get(), x.get()), nax::Error);
}

TEST_CASE("cuda kernels: GELU forward and backward", "[cuda]") {
  for (DType d : kFloating)
    for (std::size_t n : {1, 7, 1000, 65537}) {
      const auto x = rounded(normal(n, 2.0), d), dy = rounded(normal(n), d);
      Device dx_in(x, d), ddy(dy, d), y(n, d), dx(n, d);
      gpu().gelu_forward(d, static_cast<std::int64_t>(n), dx_in.get(), y.get());
      gpu().gelu_backward(d, static_cast<std::int64_t>(n), dx_in.get(), ddy.get(), dx.get());
      Host hx(x, d), hdy(dy, d), want_y(n, d), want_dx(n, d);
      cpu().gelu_forward(DType::f64, static_cast<std::int64_t>(n), hx.data(), want_y.data());
      cpu().gelu_backward(DType::f64, static_cast<std::int64_t>(n), hx.data(), hdy.data(), want_dx.data());
      check_close(y.values(), want_y.values(), d, "gelu_forward");
      check_close(dx.values(), want_dx.values(), d, "gelu_backward");
    }
  Device x(4, DType::i32);
  CHECK_THROWS_AS(gpu().gelu_forward(DType::i32, 4, x.get(), x.get()), nax::Error);
}

namespace {

const std::vector<std::pair<std::int64_t, std::int64_t>> kRowShapes{{1, 1}, {3, 1}, {7, 33}, {64, 1000}, {1000, 64}, {5, 4099}, {2, 20000}};

}  // namespace

TEST_CASE("cuda kernels: layer_norm forward and backward", "[cuda]") {
  for (DType d : kFloating)
    for (const auto& [rows, n] : kRowShapes) {
      const auto count = static_cast<std::size_t>(rows * n);
      const auto x = rounded(normal(count, 1.0, 3.0), d);  // a mean large against the spread
      const auto scale = rounded(normal(static_cast<std::size_t>(n), 0.5, 1.0), d);
      const auto bias = rounded(normal(static_cast<std::size_t>(n)), d);
      const auto dy = rounded(normal(count), d);
      const double eps = 1e-5;
      const DType sd = d == DType::bf16 ? DType::f32 : d;  // the statistics' dtype
      Host hx(x, d), hscale(scale, d), hbias(bias, d), hdy(dy, d);
      Host y(count, d), mean(static_cast<std::size_t>(rows), d), rstd(static_cast<std::size_t>(rows), d);
      cpu().layer_norm_forward(DType::f64, rows, n, hx.data(), hscale.data(), hbias.data(), eps, y.data(), mean.data(), rstd.data());
      Device dx_in(x, d), dscale_in(scale, d), dbias_in(bias, d), dy_in(dy, d);
      Device gy(count, d), gmean(static_cast<std::size_t>(rows), sd), grstd(static_cast<std::size_t>(rows), sd);
      gpu().layer_norm_forward(d, rows, n, dx_in.get(), dscale_in.get(), dbias_in.get(), eps, gy.get(), gmean.get(), grstd.get());
      const std::string shape = " rows=" + std::to_string(rows) + " n=" + std::to_string(n);
      check_close(gy.values(), y.values(), d, "layer_norm_forward y" + shape);
      check_close(gmean.values(), mean.values(), sd, "layer_norm_forward mean" + shape);
      check_close(grstd.values(), rstd.values(), sd, "layer_norm_forward rstd" + shape);

      // The backward from the statistics as the dtype stores them, on both sides.
      const auto mean_d = rounded(mean.values(), sd), rstd_d = rounded(rstd.values(), sd);
      Host hmean(mean_d, sd), hrstd(rstd_d, sd), dx(count, d), dscale(static_cast<std::size_t>(n), d), dbias(static_cast<std::size_t>(n), d);
      cpu().layer_norm_backward(DType::f64, rows, n, hx.data(), hscale.data(), hmean.data(), hrstd.data(), hdy.data(), dx.data(),
                                dscale.data(), dbias.data(), nax::SumTree{});
      Device gmean_in(mean_d, sd), grstd_in(rstd_d, sd), gdx(count, d), gdscale(static_cast<std::size_t>(n), d),
          gdbias(static_cast<std::size_t>(n), d);
      gpu().layer_norm_backward(d, rows, n, dx_in.get(), dscale_in.get(), gmean_in.get(), grstd_in.get(), dy_in.get(), gdx.get(),
                                gdscale.get(), gdbias.get(), nax::SumTree{});
      check_close(gdx.values(), dx.values(), d, "layer_norm_backward dx" + shape);
      check_close(gdscale.values(), dscale.values(), d, "layer_norm_backward dscale" + shape);
      check_close(gdbias.values(), dbias.values(), d, "layer_norm_backward dbias" + shape);
    }
}

TEST_CASE("cuda kernels: layer_norm backward over no rows gives zero parameter gradients", "[cuda]") {
  Device dscale(5, DType::f32), dbias(5, DType::f32), none(1, DType::f32);
  gpu().layer_norm_backward(DType::f32, 0, 5, none.get(), none.get(), none.get(), none.get(), none.get(), none.get(), dscale.get(),
                            dbias.get(), nax::SumTree{});
  check_equal(dscale.values(), std::vector<double>(5, 0.0), "dscale");
  check_equal(dbias.values(), std::vector<double>(5, 0.0), "dbias");
}

TEST_CASE("cuda kernels: softmax and log_softmax forward and backward", "[cuda]") {
  for (DType d : kFloating)
    for (bool log : {false, true})
      for (const auto& [rows, n] : kRowShapes) {
        const auto count = static_cast<std::size_t>(rows * n);
        const auto x = rounded(normal(count, 3.0, 10.0), d);
        const auto dy = rounded(normal(count), d);
        Host hx(x, d), y(count, d);
        cpu().softmax_forward(DType::f64, rows, n, hx.data(), y.data(), log);
        Device gx(x, d), gy(count, d);
        gpu().softmax_forward(d, rows, n, gx.get(), gy.get(), log);
        const std::string what = std::string(log ? "log_softmax" : "softmax") + " rows=" + std::to_string(rows) + " n=" + std::to_string(n);
        check_close(gy.values(), y.values(), d, what + " forward");

        const auto y_d = rounded(y.values(), d);
        Host hy(y_d, d), hdy(dy, d), dx(count, d);
        cpu().softmax_backward(DType::f64, rows, n, hy.data(), hdy.data(), dx.data(), log);
        Device gy_in(y_d, d), gdy(dy, d), gdx(count, d);
        gpu().softmax_backward(d, rows, n, gy_in.get(), gdy.get(), gdx.get(), log);
        check_close(gdx.values(), dx.values(), d, what + " backward");
      }
}

TEST_CASE("cuda kernels: rotary embedding in place", "[cuda]") {
  // data [batch, seq, heads, head_dim]: the outer offsets run over (batch, heads).
  const std::int64_t batch = 2, seq = 37, heads = 3, head_dim = 16;
  for (DType d : kFloating)
    for (double direction : {1.0, -1.0})
      for (std::int64_t rotary_dims : {8, 16}) {
        kn::RotarySizes s;
        s.dtype = d;
        s.seq_len = seq, s.seq_stride = heads * head_dim, s.head_dim_stride = 1;
        s.rotary_dims = rotary_dims, s.position_offset = 1000, s.direction = direction;
        const auto count = static_cast<std::size_t>(batch * seq * heads * head_dim);
        const auto x = rounded(normal(count), d), x2 = rounded(normal(count), d);
        Device data(x, d), data2(x2, d);
        {
          // Two calls whose host offsets die at once: the second must not see the first's.
          std::vector<std::int64_t> offsets;
          for (std::int64_t b = 0; b < batch; ++b)
            for (std::int64_t h = 0; h < heads; ++h) offsets.push_back(b * seq * heads * head_dim + h * head_dim);
          gpu().rotary_in_place(s, data.get(), offsets.data(), static_cast<std::int64_t>(offsets.size()));
          std::vector<std::int64_t> first_batch(offsets.begin(), offsets.begin() + heads);
          offsets.assign(offsets.size(), -1);
          gpu().rotary_in_place(s, data2.get(), first_batch.data(), heads);
          first_batch.assign(first_batch.size(), -1);
        }
        std::vector<std::int64_t> offsets;
        for (std::int64_t b = 0; b < batch; ++b)
          for (std::int64_t h = 0; h < heads; ++h) offsets.push_back(b * seq * heads * head_dim + h * head_dim);
        kn::RotarySizes s64 = s;
        s64.dtype = DType::f64;
        Host want(x, d), want2(x2, d);
        cpu().rotary_in_place(s64, want.data(), offsets.data(), static_cast<std::int64_t>(offsets.size()));
        cpu().rotary_in_place(s64, want2.data(), offsets.data(), heads);
        check_close(data.values(), want.values(), d, "rotary rotary_dims=" + std::to_string(rotary_dims));
        check_close(data2.values(), want2.values(), d, "rotary, first batch only");
      }
}

namespace {

Bytes ids_bytes(const std::vector<double>& ids) { return encode(ids, DType::i32); }

}  // namespace

TEST_CASE("cuda kernels: gather_rows and scatter_add_rows over a vocab block", "[cuda]") {
  const kn::VocabRange range{100, 50};
  for (DType d : kFloating)
    for (std::int64_t row : {1, 7, 13, 64})
      for (std::int64_t count : {0, 1, 333}) {
        auto ids = integers(static_cast<std::size_t>(count), 80, 170);  // some outside the block, some repeated
        for (std::size_t i = 0; i < ids.size(); i += 3) ids[i] = 105;    // one id many times
        const Bytes id_bytes = ids_bytes(ids);
        Device dids(static_cast<std::size_t>(count), DType::i32);
        dids.upload(id_bytes);
        const auto* device_ids = static_cast<const std::int32_t*>(dids.get());
        const auto* host_ids = reinterpret_cast<const std::int32_t*>(id_bytes.data());
        const std::string what = " row=" + std::to_string(row) + " count=" + std::to_string(count);

        const auto table = rounded(normal(static_cast<std::size_t>(range.local * row)), d);
        const Bytes table_bytes = encode(table, d);
        Device dtable(table.size(), d), gathered(static_cast<std::size_t>(count * row), d);
        dtable.upload(table_bytes);
        const std::size_t row_bytes = static_cast<std::size_t>(row) * nax::dtype_size(d);
        gpu().gather_rows(device_ids, count, range, dtable.get(), row_bytes, gathered.get());
        Bytes want(static_cast<std::size_t>(count) * row_bytes);
        cpu().gather_rows(host_ids, count, range, table_bytes.data(), row_bytes, want.data());
        INFO("gather_rows" << what);
        CHECK(gathered.raw() == want);

        const auto grad = rounded(normal(static_cast<std::size_t>(count * row)), d);
        Device dgrad(grad, d), dtable_grad(table.size(), d);
        gpu().scatter_add_rows(d, device_ids, count, range, dgrad.get(), row, dtable_grad.get(), nax::SumTree{});
        Host hgrad(grad, d), want_grad(table.size(), d);
        cpu().scatter_add_rows(DType::f64, host_ids, count, range, hgrad.data(), row, want_grad.data(), nax::SumTree{});
        check_close(dtable_grad.values(), want_grad.values(), d, "scatter_add_rows" + what);
      }
}

TEST_CASE("cuda kernels: pick_forward and pick_backward", "[cuda]") {
  const kn::VocabRange range{40, 50};
  const std::int64_t batch = 3, seq = 37;
  // Logits [batch, seq, vocab] (vocab innermost), [vocab, batch, seq] (outermost), and one that
  // reads the same logits row for every batch index (stride 0: the backward adds up collisions).
  struct Case {
    kn::PickLayout where;
    std::size_t logits_count;
  };
  std::vector<Case> cases;
  cases.push_back({{layout_of<2>({batch, seq}, {{seq, 1}, {seq * range.local, range.local}}), 1}, std::size_t(batch * seq * range.local)});
  cases.push_back({{layout_of<2>({batch, seq}, {{seq, 1}, {seq, 1}}), batch * seq}, std::size_t(batch * seq * range.local)});
  cases.push_back({{layout_of<2>({batch, seq}, {{seq, 1}, {0, range.local}}), 1}, std::size_t(seq * range.local)});
  for (const auto& c : cases) {
    auto targets = integers(static_cast<std::size_t>(batch * seq), 30, 100);
    for (std::size_t i = 0; i < targets.size(); i += 4) targets[i] = 47;
    const Bytes target_bytes = ids_bytes(targets);
    Device dtargets(targets.size(), DType::i32);
    dtargets.upload(target_bytes);
    const auto* device_targets = static_cast<const std::int32_t*>(dtargets.get());
    const auto* host_targets = reinterpret_cast<const std::int32_t*>(target_bytes.data());
    const std::string what = " " + describe(c.where.layout) + " vocab_stride " + std::to_string(c.where.vocab_stride);

    for (DType d : kAll) {
      const auto logits = rounded(normal(c.logits_count), d);
      const Bytes logit_bytes = encode(logits, d);
      Device dlogits(logits.size(), d), picked(targets.size(), d);
      dlogits.upload(logit_bytes);
      gpu().pick_forward(device_targets, range, c.where, dlogits.get(), nax::dtype_size(d), picked.get());
      Bytes want(targets.size() * nax::dtype_size(d));
      cpu().pick_forward(host_targets, range, c.where, logit_bytes.data(), nax::dtype_size(d), want.data());
      INFO("pick_forward" << what << " [" << nax::dtype_name(d) << "]");
      CHECK(picked.raw() == want);
    }
    for (DType d : kFloating) {
      const auto grad = rounded(normal(targets.size()), d);
      Device dgrad(grad, d), dlogits_grad(c.logits_count, d);
      gpu().pick_backward(d, device_targets, range, c.where, dgrad.get(), dlogits_grad.get(), static_cast<std::int64_t>(c.logits_count));
      Host hgrad(grad, d), want(c.logits_count, d);
      cpu().pick_backward(DType::f64, host_targets, range, c.where, hgrad.data(), want.data(), static_cast<std::int64_t>(c.logits_count));
      check_close(dlogits_grad.values(), want.values(), d, "pick_backward" + what);
    }
  }
}

namespace {

// Matrices of one attention operand: batch b at b * rows * row_stride, rows row_stride apart.
struct Operand {
  std::vector<std::int64_t> offsets;
  std::int64_t row_stride;
  std::size_t elements;
};

Operand operand(std::int64_t batches, std::int64_t rows, std::int64_t row_stride) {
  Operand o{{}, row_stride, static_cast<std::size_t>(batches * rows * row_stride)};
  for (std::int64_t b = 0; b < batches; ++b) o.offsets.push_back(b * rows * row_stride);
  return o;
}

kn::InMatrices in(const void* data, const Operand& o) { return {data, o.offsets.data(), o.row_stride}; }
kn::OutMatrices out(void* data, const Operand& o) { return {data, o.offsets.data(), o.row_stride}; }

// The head_dim columns of every row of every matrix.
std::vector<double> rows_of(const std::vector<double>& all, const Operand& o, std::int64_t rows, std::int64_t head_dim) {
  std::vector<double> v;
  for (std::int64_t offset : o.offsets)
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < head_dim; ++j) v.push_back(all[static_cast<std::size_t>(offset + r * o.row_stride + j)]);
  return v;
}

void check_attention(DType d, std::int64_t batches, std::int64_t tq, std::int64_t tk, std::int64_t head_dim, std::int64_t pad,
                     bool deterministic = false) {
  kn::AttentionSizes s;
  s.dtype = d, s.batches = batches, s.tq = tq, s.tk = tk, s.head_dim = head_dim, s.scale = 1.0 / std::sqrt(double(head_dim));
  s.query_offset = tk - tq;
  if (deterministic) s.tree = nax::SumTree::canonical_for_block_of(1);
  const Operand oq = operand(batches, tq, head_dim + pad), okv = operand(batches, tk, head_dim + pad);
  const auto q = rounded(normal(oq.elements), d), k = rounded(normal(okv.elements), d), v = rounded(normal(okv.elements), d);
  const auto dout = rounded(normal(oq.elements), d);
  const DType lse_dtype = d == DType::bf16 ? DType::f32 : d;
  const auto lse_count = static_cast<std::size_t>(batches * tq);
  std::ostringstream what;
  what << (deterministic ? "deterministic " : "") << "attention batches=" << batches << " tq=" << tq << " tk=" << tk << " head_dim=" << head_dim << " pad=" << pad;

  kn::AttentionSizes s64 = s;
  s64.dtype = DType::f64;
  s64.tree = nax::SumTree{};  // the reference in the CPU's default order
  Host hq(q, d), hk(k, d), hv(v, d), hdout(dout, d), hout(oq.elements, d), hlse(lse_count, d);
  Host hscratch(static_cast<std::size_t>(std::max(cpu().attention_forward_scratch(s64), cpu().attention_backward_scratch(s64))), d);
  cpu().causal_attention_forward(s64, in(hq.data(), oq), in(hk.data(), okv), in(hv.data(), okv), out(hout.data(), oq), hlse.data(),
                                 hscratch.data());
  Device gq(q, d), gk(k, d), gv(v, d), gdout(dout, d), gout(oq.elements, d), glse(lse_count, lse_dtype);
  Device gscratch(static_cast<std::size_t>(std::max<std::int64_t>(gpu().attention_forward_scratch(s), 1)), d);
  gpu().causal_attention_forward(s, in(gq.get(), oq), in(gk.get(), okv), in(gv.get(), okv), out(gout.get(), oq), glse.get(),
                                 gscratch.get());
  check_close(rows_of(gout.values(), oq, tq, head_dim), rows_of(hout.values(), oq, tq, head_dim), d, what.str() + " out");
  check_close(glse.values(), hlse.values(), d, what.str() + " lse");

  // The backward from the forward's results as the device stores them, on both sides.
  const auto out_d = rounded(hout.values(), d);
  const auto lse_d = rounded(hlse.values(), lse_dtype);
  Host hout_d(out_d, d), hlse_d(lse_d, d), hdq(oq.elements, d), hdk(okv.elements, d), hdv(okv.elements, d);
  cpu().causal_attention_backward(s64, in(hq.data(), oq), in(hk.data(), okv), in(hv.data(), okv), in(hout_d.data(), oq),
                                  in(hdout.data(), oq), hlse_d.data(), nullptr, out(hdq.data(), oq), out(hdk.data(), okv), out(hdv.data(), okv),
                                  hscratch.data());
  Device gout_d(out_d, d), glse_d(lse_d, lse_dtype), gdq(oq.elements, d), gdk(okv.elements, d), gdv(okv.elements, d);
  Device gscratch_b(static_cast<std::size_t>(std::max<std::int64_t>(gpu().attention_backward_scratch(s), 1)), d);
  gpu().causal_attention_backward(s, in(gq.get(), oq), in(gk.get(), okv), in(gv.get(), okv), in(gout_d.get(), oq), in(gdout.get(), oq),
                                  glse_d.get(), nullptr, out(gdq.get(), oq), out(gdk.get(), okv), out(gdv.get(), okv), gscratch_b.get());
  check_close(rows_of(gdq.values(), oq, tq, head_dim), rows_of(hdq.values(), oq, tq, head_dim), d, what.str() + " dq");
  check_close(rows_of(gdk.values(), okv, tk, head_dim), rows_of(hdk.values(), okv, tk, head_dim), d, what.str() + " dk");
  check_close(rows_of(gdv.values(), okv, tk, head_dim), rows_of(hdv.values(), okv, tk, head_dim), d, what.str() + " dv");
}

}  // namespace

TEST_CASE("cuda kernels: causal attention forward and backward", "[cuda][attention]") {
  for (DType d : {DType::f32, DType::bf16})
    for (std::int64_t head_dim : {64, 128}) {
      check_attention(d, 3, 37, 53, head_dim, 0);     // queries at the end of the keys
      check_attention(d, 2, 100, 100, head_dim, 64);  // rows apart by more than head_dim (a fused qkv)
      check_attention(d, 1, 1, 1, head_dim, 0);
    }
}

// --- deterministic mode (nax::SumTree): bitwise against host references of the tree and against
// the CPU kernels in the same mode ---

namespace {

using nax::SumTree;

// The tree's value over terms [begin, begin + n): leaf(begin, length) for a leaf, left + right for
// a node, recursively (the GPU walks it with a stack instead).
template <typename T, typename Leaf>
T tree_apply(std::int64_t begin, std::int64_t n, SumTree tree, const Leaf& leaf) {
  if (tree.halves(n)) {
    const T left = tree_apply<T>(begin, n / 2, tree.half(), leaf);
    const T right = tree_apply<T>(begin + n / 2, n / 2, tree.half(), leaf);
    return left + right;
  }
  return leaf(begin, n);
}

// The values of `v` rounded to T, as T.
template <typename T>
std::vector<T> as(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <typename T>
Bytes bytes_of(const std::vector<T>& v) {
  Bytes b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <typename T>
std::vector<T> from_bytes(const Bytes& b) {
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// Same bytes element by element (so -0 differs from +0 and a NaN never matches a number).
void check_bits(const Bytes& got, const Bytes& want, std::size_t element_size, const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); i += element_size)
    if (std::memcmp(got.data() + i, want.data() + i, element_size) != 0) ++bad;
  INFO(what << ": " << bad << " of " << got.size() / element_size << " elements differ in their bits");
  CHECK(bad == 0);
}

template <typename T>
constexpr DType dtype_of() {
  return std::is_same_v<T, float> ? DType::f32 : DType::f64;
}

struct TreeGemmCase {
  std::int64_t m, n, k;
  bool ta, tb;
  std::int64_t batch;
  double beta;
};

// C of every batch, in T, by the host tree: leaves fma from +0 in k order, then + beta C_old.
template <typename T>
std::vector<T> host_tree_gemm(const kn::GemmShape& s, const std::vector<T>& a, const std::vector<T>& b, std::vector<T> c) {
  for (std::int64_t t = 0; t < s.batch; ++t)
    for (std::int64_t i = 0; i < s.m; ++i)
      for (std::int64_t j = 0; j < s.n; ++j) {
        auto at = [&](std::int64_t kk) { return a[t * s.stride_a + (s.trans_a ? kk * s.lda + i : i * s.lda + kk)]; };
        auto bt = [&](std::int64_t kk) { return b[t * s.stride_b + (s.trans_b ? j * s.ldb + kk : kk * s.ldb + j)]; };
        const T sum = tree_apply<T>(0, s.k, s.tree, [&](std::int64_t begin, std::int64_t len) {
          T acc = 0;
          for (std::int64_t kk = begin; kk < begin + len; ++kk) acc = std::fma(at(kk), bt(kk), acc);
          return acc;
        });
        T& out = c[t * s.stride_c + i * s.ldc + j];
        out = s.beta != 0.0 ? sum + static_cast<T>(s.beta) * out : sum;
      }
  return c;
}

kn::GemmShape gemm_shape(const TreeGemmCase& g, SumTree tree) {
  kn::GemmShape s;
  s.trans_a = g.ta, s.trans_b = g.tb, s.m = g.m, s.n = g.n, s.k = g.k;
  s.lda = (g.ta ? g.m : g.k) + 2, s.ldb = (g.tb ? g.k : g.n) + 1, s.ldc = g.n + 3;
  s.batch = g.batch;
  s.stride_a = (g.ta ? g.k : g.m) * s.lda + 5, s.stride_b = (g.tb ? g.n : g.k) * s.ldb, s.stride_c = g.m * s.ldc + 1;
  s.beta = g.beta;
  s.tree = tree;
  return s;
}

// The device's C (all of it, padding included) for inputs a, b and initial c.
template <typename T>
std::vector<T> device_gemm(const kn::GemmShape& s, const std::vector<T>& a, const std::vector<T>& b, const std::vector<T>& c) {
  const DType d = dtype_of<T>();
  Device da(a.size(), d), db(b.size(), d), dc(c.size(), d);
  da.upload(bytes_of(a)), db.upload(bytes_of(b)), dc.upload(bytes_of(c));
  gpu().gemm(d, s, da.get(), db.get(), dc.get());
  return from_bytes<T>(dc.raw());
}

template <typename T>
void check_tree_gemm(const TreeGemmCase& g, SumTree tree) {
  const kn::GemmShape s = gemm_shape(g, tree);
  const std::size_t a_size = static_cast<std::size_t>(s.batch * s.stride_a), b_size = static_cast<std::size_t>(s.batch * s.stride_b);
  const auto a = as<T>(normal(a_size)), b = as<T>(normal(b_size)), c = as<T>(normal(static_cast<std::size_t>(s.batch * s.stride_c)));
  std::ostringstream what;
  what << "tree gemm " << nax::dtype_name(dtype_of<T>()) << " m=" << g.m << " n=" << g.n << " k=" << g.k << " ta=" << g.ta
       << " tb=" << g.tb << " batch=" << g.batch << " beta=" << g.beta << " forced=" << tree.forced;
  const std::vector<T> got = device_gemm(s, a, b, c);
  check_bits(bytes_of(got), bytes_of(host_tree_gemm(s, a, b, c)), sizeof(T), what.str());
  std::vector<T> on_cpu = c;  // the CPU kernels' tree GEMM, the same bits
  cpu().gemm(dtype_of<T>(), s, a.data(), b.data(), on_cpu.data());
  check_bits(bytes_of(got), bytes_of(on_cpu), sizeof(T), what.str() + " vs the CPU");
}

// k cut into p blocks, each computed with canonical_for_block_of(p) and added pairwise, gives the
// whole computation's bits (canonical_for_block_of(1)).
template <typename T>
void check_tree_gemm_split(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t p) {
  TreeGemmCase whole_case{m, n, k, false, false, 1, 0.0};
  const kn::GemmShape whole = gemm_shape(whole_case, SumTree::canonical_for_block_of(1));
  const auto a = as<T>(normal(static_cast<std::size_t>(whole.stride_a)));
  const auto b = as<T>(normal(static_cast<std::size_t>(whole.stride_b)));
  const auto c = as<T>(normal(static_cast<std::size_t>(whole.stride_c)));
  const std::vector<T> want = device_gemm(whole, a, b, c);
  std::vector<std::vector<T>> blocks;
  const std::int64_t kb = k / p;
  for (std::int64_t j = 0; j < p; ++j) {
    kn::GemmShape part = whole;
    part.k = kb;
    part.tree = SumTree::canonical_for_block_of(p);
    // A's columns and B's rows [j kb, (j + 1) kb): the same matrices from an offset.
    std::vector<T> a_part(a.begin() + j * kb, a.end()), b_part(b.begin() + j * kb * whole.ldb, b.end());
    a_part.resize(a.size()), b_part.resize(b.size());
    blocks.push_back(device_gemm(part, a_part, b_part, c));
  }
  // The m x n elements (the padding between rows holds c, which the sum of blocks adds p times).
  auto elements = [&](const std::vector<T>& all) {
    std::vector<T> v;
    for (std::int64_t i = 0; i < m; ++i) v.insert(v.end(), all.begin() + i * whole.ldc, all.begin() + i * whole.ldc + n);
    return v;
  };
  std::ostringstream what;
  what << "tree gemm split " << nax::dtype_name(dtype_of<T>()) << " m=" << m << " n=" << n << " k=" << k << " p=" << p;
  check_bits(bytes_of(elements(nax::testing::add_pairwise(blocks))), bytes_of(elements(want)), sizeof(T), what.str());
}

// Each output's terms in row-major order over the reduced dimensions, tree-summed from the first.
template <typename T>
std::vector<T> host_tree_reduce(const std::vector<T>& x, const std::vector<std::int64_t>& sizes, const std::vector<std::int64_t>& strides,
                                const std::vector<bool>& reduced, SumTree tree) {
  std::vector<std::int64_t> kept_sizes, red_sizes, kept_strides, red_strides;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    (reduced[d] ? red_sizes : kept_sizes).push_back(sizes[d]);
    (reduced[d] ? red_strides : kept_strides).push_back(strides[d]);
  }
  auto offset = [](std::int64_t flat, const std::vector<std::int64_t>& sz, const std::vector<std::int64_t>& st) {
    std::int64_t off = 0;
    for (std::size_t d = sz.size(); d-- > 0;) {
      off += flat % sz[d] * st[d];
      flat /= sz[d];
    }
    return off;
  };
  std::int64_t outputs = 1, terms = 1;
  for (auto s : kept_sizes) outputs *= s;
  for (auto s : red_sizes) terms *= s;
  std::vector<T> out(static_cast<std::size_t>(outputs));
  for (std::int64_t o = 0; o < outputs; ++o) {
    const std::int64_t base = offset(o, kept_sizes, kept_strides);
    out[static_cast<std::size_t>(o)] = tree_apply<T>(0, terms, tree, [&](std::int64_t begin, std::int64_t len) {
      T acc = x[base + offset(begin, red_sizes, red_strides)];
      for (std::int64_t i = begin + 1; i < begin + len; ++i) acc += x[base + offset(i, red_sizes, red_strides)];
      return acc;
    });
  }
  return out;
}

// The device's reduce of x (sizes, input strides; outputs contiguous over the kept dimensions).
// The layout of a reduce over x (sizes, input strides; outputs contiguous over the kept
// dimensions) and its output count.
std::pair<kn::Layout<2>, std::int64_t> reduce_layout(const std::vector<std::int64_t>& sizes, const std::vector<std::int64_t>& strides,
                                                     const std::vector<bool>& reduced) {
  kn::Layout<2> l;
  l.rank = static_cast<int>(sizes.size());
  std::int64_t outputs = 1;
  for (int d = l.rank - 1; d >= 0; --d) {
    l.sizes[d] = sizes[d];
    l.strides[0][d] = strides[d];
    l.strides[1][d] = reduced[d] ? 0 : outputs;
    if (!reduced[d]) outputs *= sizes[d];
  }
  return {l, outputs};
}

template <typename T>
std::vector<T> device_tree_reduce(const std::vector<T>& x, const std::vector<std::int64_t>& sizes, const std::vector<std::int64_t>& strides,
                                  const std::vector<bool>& reduced, SumTree tree) {
  const auto [l, outputs] = reduce_layout(sizes, strides, reduced);
  const DType d = dtype_of<T>();
  Device dx(x.size(), d), dout(static_cast<std::size_t>(outputs), d);
  dx.upload(bytes_of(x));
  gpu().reduce(ReduceOp::sum, d, dx.get(), dout.get(), outputs, l, tree);
  return from_bytes<T>(dout.raw());
}

template <typename T>
std::vector<T> cpu_tree_reduce(const std::vector<T>& x, const std::vector<std::int64_t>& sizes, const std::vector<std::int64_t>& strides,
                               const std::vector<bool>& reduced, SumTree tree) {
  const auto [l, outputs] = reduce_layout(sizes, strides, reduced);
  std::vector<T> out(static_cast<std::size_t>(outputs));
  cpu().reduce(ReduceOp::sum, dtype_of<T>(), x.data(), out.data(), outputs, l, tree);
  return out;
}

template <typename T>
void check_tree_reduce() {
  struct Case {
    std::vector<std::int64_t> sizes, strides;
    std::vector<bool> reduced;
  };
  const std::vector<Case> cases{
      {{96, 33}, {33, 1}, {true, false}},            // over rows
      {{33, 100}, {100, 1}, {false, true}},          // over columns
      {{64, 37}, {37, 1}, {true, true}},             // everything
      {{8, 5, 12}, {1, 96, 8}, {true, false, true}},  // strided, two reduced axes
      {{2048}, {1}, {true}},                         // many leaves
      {{3, 1}, {1, 1}, {true, false}},
  };
  for (const Case& c : cases)
    for (SumTree tree : {SumTree::canonical_for_block_of(1), SumTree::canonical_for_block_of(4), SumTree{.on = true, .forced = 0}}) {
      std::int64_t span_size = 1;
      for (std::size_t d = 0; d < c.sizes.size(); ++d) span_size += (c.sizes[d] - 1) * c.strides[d];
      const auto x = as<T>(normal(static_cast<std::size_t>(span_size), 1.0, 0.5));
      std::ostringstream what;
      what << "tree reduce " << nax::dtype_name(dtype_of<T>()) << " case " << (&c - cases.data()) << " forced=" << tree.forced;
      const std::vector<T> got = device_tree_reduce(x, c.sizes, c.strides, c.reduced, tree);
      check_bits(bytes_of(got), bytes_of(host_tree_reduce(x, c.sizes, c.strides, c.reduced, tree)), sizeof(T), what.str());
      check_bits(bytes_of(got), bytes_of(cpu_tree_reduce(x, c.sizes, c.strides, c.reduced, tree)), sizeof(T), what.str() + " vs the CPU");
    }
  // The leading axis cut in p blocks, each reduced with canonical_for_block_of(p), added pairwise.
  for (std::int64_t p : {2, 4}) {
    const std::int64_t rows = 4 * 24, cols = 17;
    const auto x = as<T>(normal(static_cast<std::size_t>(rows * cols)));
    const auto want = device_tree_reduce(x, {rows, cols}, {cols, 1}, {true, false}, SumTree::canonical_for_block_of(1));
    std::vector<std::vector<T>> blocks;
    for (std::int64_t j = 0; j < p; ++j) {
      const std::vector<T> part(x.begin() + j * rows / p * cols, x.begin() + (j + 1) * rows / p * cols);
      blocks.push_back(device_tree_reduce(part, {rows / p, cols}, {cols, 1}, {true, false}, SumTree::canonical_for_block_of(p)));
    }
    check_bits(bytes_of(nax::testing::add_pairwise(blocks)), bytes_of(want), sizeof(T), "tree reduce split p=" + std::to_string(p));
  }
}

struct NormGrads {
  Bytes dx, dscale, dbias;
};

template <typename T>
NormGrads device_norm_backward(std::int64_t rows, std::int64_t n, const std::vector<T>& x, const std::vector<T>& scale,
                               const std::vector<T>& mean, const std::vector<T>& rstd, const std::vector<T>& dy, SumTree tree) {
  const DType d = dtype_of<T>();
  Device gx(x.size(), d), gscale(scale.size(), d), gmean(mean.size(), d), grstd(rstd.size(), d), gdy(dy.size(), d);
  gx.upload(bytes_of(x)), gscale.upload(bytes_of(scale)), gmean.upload(bytes_of(mean)), grstd.upload(bytes_of(rstd)), gdy.upload(bytes_of(dy));
  Device gdx(x.size(), d), gdscale(static_cast<std::size_t>(n), d), gdbias(static_cast<std::size_t>(n), d);
  gpu().layer_norm_backward(d, rows, n, gx.get(), gscale.get(), gmean.get(), grstd.get(), gdy.get(), gdx.get(), gdscale.get(),
                            gdbias.get(), tree);
  return {gdx.raw(), gdscale.raw(), gdbias.raw()};
}

template <typename T>
void check_tree_layer_norm() {
  for (std::int64_t rows : {1, 7, 96, 1000})
    for (std::int64_t n : {1, 33, 256}) {
      const auto x = as<T>(normal(static_cast<std::size_t>(rows * n), 1.0, 0.3)), dy = as<T>(normal(static_cast<std::size_t>(rows * n)));
      const auto scale = as<T>(normal(static_cast<std::size_t>(n), 0.5, 1.0));
      const auto mean = as<T>(normal(static_cast<std::size_t>(rows), 0.1));
      const auto rstd = as<T>(away_from_zero(static_cast<std::size_t>(rows), true));
      const SumTree tree = SumTree::canonical_for_block_of(1);
      const NormGrads got = device_norm_backward(rows, n, x, scale, mean, rstd, dy, tree);
      std::vector<T> dscale(static_cast<std::size_t>(n)), dbias(static_cast<std::size_t>(n));
      for (std::int64_t j = 0; j < n; ++j) {
        auto at = [&](std::int64_t r) { return static_cast<std::size_t>(r * n + j); };
        dscale[j] = tree_apply<T>(0, rows, tree, [&](std::int64_t begin, std::int64_t len) {
          auto term = [&](std::int64_t r) { return dy[at(r)] * ((x[at(r)] - mean[r]) * rstd[r]); };
          T acc = term(begin);
          for (std::int64_t r = begin + 1; r < begin + len; ++r) acc += term(r);
          return acc;
        });
        dbias[j] = tree_apply<T>(0, rows, tree, [&](std::int64_t begin, std::int64_t len) {
          T acc = dy[at(begin)];
          for (std::int64_t r = begin + 1; r < begin + len; ++r) acc += dy[at(r)];
          return acc;
        });
      }
      const std::string what = std::string("tree layer_norm_backward ") + std::string(nax::dtype_name(dtype_of<T>())) + " rows=" + std::to_string(rows) +
                               " n=" + std::to_string(n);
      check_bits(got.dscale, bytes_of(dscale), sizeof(T), what + " dscale");
      check_bits(got.dbias, bytes_of(dbias), sizeof(T), what + " dbias");
      std::vector<T> cpu_dx(x.size()), cpu_dscale(static_cast<std::size_t>(n)), cpu_dbias(static_cast<std::size_t>(n));
      cpu().layer_norm_backward(dtype_of<T>(), rows, n, x.data(), scale.data(), mean.data(), rstd.data(), dy.data(), cpu_dx.data(),
                                cpu_dscale.data(), cpu_dbias.data(), tree);
      check_bits(got.dscale, bytes_of(cpu_dscale), sizeof(T), what + " dscale vs the CPU");
      check_bits(got.dbias, bytes_of(cpu_dbias), sizeof(T), what + " dbias vs the CPU");
      // dx is per row: the tree changes nothing there.
      check_bits(got.dx, device_norm_backward(rows, n, x, scale, mean, rstd, dy, SumTree{}).dx, sizeof(T), what + " dx");
    }
  // Row blocks with canonical_for_block_of(p), added pairwise.
  for (std::int64_t p : {2, 4}) {
    const std::int64_t rows = 4 * 40, n = 19;
    const auto x = as<T>(normal(static_cast<std::size_t>(rows * n))), dy = as<T>(normal(static_cast<std::size_t>(rows * n)));
    const auto scale = as<T>(normal(static_cast<std::size_t>(n))), mean = as<T>(normal(static_cast<std::size_t>(rows)));
    const auto rstd = as<T>(away_from_zero(static_cast<std::size_t>(rows), true));
    const NormGrads whole = device_norm_backward(rows, n, x, scale, mean, rstd, dy, SumTree::canonical_for_block_of(1));
    std::vector<std::vector<T>> scales, biases;
    const std::int64_t rb = rows / p;
    for (std::int64_t j = 0; j < p; ++j) {
      auto slice = [&](const std::vector<T>& v, std::int64_t width) {
        return std::vector<T>(v.begin() + j * rb * width, v.begin() + (j + 1) * rb * width);
      };
      const NormGrads part = device_norm_backward(rb, n, slice(x, n), scale, slice(mean, 1), slice(rstd, 1), slice(dy, n),
                                                  SumTree::canonical_for_block_of(p));
      scales.push_back(from_bytes<T>(part.dscale));
      biases.push_back(from_bytes<T>(part.dbias));
    }
    check_bits(bytes_of(nax::testing::add_pairwise(scales)), whole.dscale, sizeof(T), "tree layer_norm split dscale p=" + std::to_string(p));
    check_bits(bytes_of(nax::testing::add_pairwise(biases)), whole.dbias, sizeof(T), "tree layer_norm split dbias p=" + std::to_string(p));
  }
}

template <typename T>
std::vector<T> device_tree_scatter(const std::vector<std::int32_t>& ids, kn::VocabRange range, const std::vector<T>& grad,
                                   std::int64_t row, SumTree tree) {
  const DType d = dtype_of<T>();
  Device dids(ids.size(), DType::i32), dgrad(grad.size(), d), dtable(static_cast<std::size_t>(range.local * row), d);
  dids.upload(bytes_of(ids)), dgrad.upload(bytes_of(grad));
  gpu().scatter_add_rows(d, static_cast<const std::int32_t*>(dids.get()), static_cast<std::int64_t>(ids.size()), range, dgrad.get(), row,
                         dtable.get(), tree);
  return from_bytes<T>(dtable.raw());
}

// Each table row: the dense tree over all positions, +0 where the id does not pick the row.
template <typename T>
std::vector<T> host_tree_scatter(const std::vector<std::int32_t>& ids, kn::VocabRange range, const std::vector<T>& grad,
                                 std::int64_t row, SumTree tree) {
  std::vector<T> table(static_cast<std::size_t>(range.local * row), T{0});
  const auto count = static_cast<std::int64_t>(ids.size());
  for (std::int64_t r = 0; r < range.local; ++r) {
    bool picked = false;
    for (std::int32_t id : ids) picked = picked || id == range.start + r;
    if (!picked) continue;
    for (std::int64_t c = 0; c < row; ++c) {
      auto term = [&](std::int64_t i) { return ids[i] == range.start + r ? grad[i * row + c] : T{0}; };
      table[r * row + c] = tree_apply<T>(0, count, tree, [&](std::int64_t begin, std::int64_t len) {
        T acc = term(begin);
        for (std::int64_t i = begin + 1; i < begin + len; ++i) acc += term(i);
        return acc;
      });
    }
  }
  return table;
}

template <typename T>
void check_tree_scatter() {
  const kn::VocabRange range{100, 50};
  for (std::int64_t row : {1, 7, 130})
    for (std::int64_t count : {1, 2, 5, 64, 333, 1024}) {
      std::vector<std::int32_t> ids(static_cast<std::size_t>(count));
      std::uniform_int_distribution<int> pick(80, 170);  // some outside the block, some repeated
      for (auto& id : ids) id = pick(rng());
      for (std::size_t i = 0; i < ids.size(); i += 3) ids[i] = 105;  // one id many times
      auto grad = as<T>(normal(static_cast<std::size_t>(count * row)));
      for (std::size_t i = 0; i < grad.size(); i += 7) grad[i] = -T{0};  // signed zeros: +0 subtrees turn them into +0
      for (SumTree tree : {SumTree::canonical_for_block_of(1), SumTree::canonical_for_block_of(2), SumTree{.on = true, .forced = 0}}) {
        std::ostringstream what;
        what << "tree scatter_add_rows " << nax::dtype_name(dtype_of<T>()) << " row=" << row << " count=" << count
             << " forced=" << tree.forced;
        const std::vector<T> got = device_tree_scatter(ids, range, grad, row, tree);
        check_bits(bytes_of(got), bytes_of(host_tree_scatter(ids, range, grad, row, tree)), sizeof(T), what.str());
        std::vector<T> on_cpu(static_cast<std::size_t>(range.local * row));
        cpu().scatter_add_rows(dtype_of<T>(), ids.data(), count, range, grad.data(), row, on_cpu.data(), tree);
        check_bits(bytes_of(got), bytes_of(on_cpu), sizeof(T), what.str() + " vs the CPU");
      }
    }
  // Id blocks with canonical_for_block_of(p), added pairwise; the first block picks nothing.
  for (std::int64_t p : {2, 4}) {
    const std::int64_t count = 4 * 48, row = 9;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(count));
    std::uniform_int_distribution<int> pick(95, 160);
    for (auto& id : ids) id = pick(rng());
    for (std::int64_t i = 0; i < count / p; ++i) ids[i] = 7;  // outside the range
    const auto grad = as<T>(normal(static_cast<std::size_t>(count * row)));
    const auto want = device_tree_scatter(ids, range, grad, row, SumTree::canonical_for_block_of(1));
    std::vector<std::vector<T>> blocks;
    const std::int64_t cb = count / p;
    for (std::int64_t j = 0; j < p; ++j) {
      const std::vector<std::int32_t> part_ids(ids.begin() + j * cb, ids.begin() + (j + 1) * cb);
      const std::vector<T> part_grad(grad.begin() + j * cb * row, grad.begin() + (j + 1) * cb * row);
      blocks.push_back(device_tree_scatter(part_ids, range, part_grad, row, SumTree::canonical_for_block_of(p)));
    }
    check_bits(bytes_of(nax::testing::add_pairwise(blocks)), bytes_of(want), sizeof(T), "tree scatter_add_rows split p=" + std::to_string(p));
  }
}

struct AttentionBits {
  Bytes out, lse, dq, dk, dv;
};

// Forward then backward of `heads` heads starting at head `first` of [4 x t x row_stride] operands.
AttentionBits device_attention(DType d, std::int64_t first, std::int64_t heads, std::int64_t t, std::int64_t head_dim,
                               std::int64_t row_stride, const std::vector<double>& q, const std::vector<double>& k,
                               const std::vector<double>& v, const std::vector<double>& dout) {
  kn::AttentionSizes s;
  s.dtype = d, s.batches = heads, s.tq = t, s.tk = t, s.head_dim = head_dim, s.scale = 1.0 / std::sqrt(double(head_dim));
  s.tree = SumTree::canonical_for_block_of(1);
  Operand o{{}, row_stride, q.size()};
  for (std::int64_t h = first; h < first + heads; ++h) o.offsets.push_back(h * t * row_stride);
  const DType lse_dtype = d == DType::bf16 ? DType::f32 : d;
  Device gq(q, d), gk(k, d), gv(v, d), gdout(dout, d), gout(q.size(), d), glse(static_cast<std::size_t>(heads * t), lse_dtype);
  Device fscratch(static_cast<std::size_t>(std::max<std::int64_t>(gpu().attention_forward_scratch(s), 1)), d);
  gpu().causal_attention_forward(s, in(gq.get(), o), in(gk.get(), o), in(gv.get(), o), out(gout.get(), o), glse.get(), fscratch.get());
  Device gdq(q.size(), d), gdk(q.size(), d), gdv(q.size(), d);
  Device bscratch(static_cast<std::size_t>(std::max<std::int64_t>(gpu().attention_backward_scratch(s), 1)), d);
  gpu().causal_attention_backward(s, in(gq.get(), o), in(gk.get(), o), in(gv.get(), o), in(gout.get(), o), in(gdout.get(), o), glse.get(),
                                  nullptr, out(gdq.get(), o), out(gdk.get(), o), out(gdv.get(), o), bscratch.get());
  // The heads' rows only (the rest of the buffers is the poison).
  auto rows = [&](const Device& g) {
    const Bytes all = g.raw();
    const std::size_t row_bytes = static_cast<std::size_t>(head_dim) * nax::dtype_size(d);
    Bytes picked;
    for (std::int64_t offset : o.offsets)
      for (std::int64_t r = 0; r < t; ++r) {
        const auto at = all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(offset + r * row_stride) * nax::dtype_size(d));
        picked.insert(picked.end(), at, at + static_cast<std::ptrdiff_t>(row_bytes));
      }
    return picked;
  };
  return {rows(gout), glse.raw(), rows(gdq), rows(gdk), rows(gdv)};
}

}  // namespace

TEST_CASE("cuda kernels: deterministic gemm is the host tree's bits", "[cuda][deterministic]") {
  const std::int64_t sizes[] = {1, 3, 8, 33, 100};
  for (std::int64_t m : sizes)
    for (std::int64_t n : sizes)
      for (std::int64_t k : sizes) {
        // Every transpose pair and both betas across the shapes, a batch on some.
        const bool ta = (m + k) % 2 == 1, tb = (n + k / 3) % 2 == 1;
        const std::int64_t batch = (m * n * k) % 3 == 0 ? 3 : 1;
        for (double beta : {0.0, 1.0}) {
          check_tree_gemm<float>({m, n, k, ta, tb, batch, beta}, SumTree::canonical_for_block_of(1));
          check_tree_gemm<double>({m, n, k, !ta, !tb, batch, beta}, SumTree::canonical_for_block_of(1));
        }
      }
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (SumTree tree : {SumTree::canonical_for_block_of(4), SumTree{.on = true, .forced = 0}}) {
        check_tree_gemm<float>({37, 45, 96, ta, tb, 2, 1.0}, tree);
        check_tree_gemm<double>({37, 45, 1000, ta, tb, 1, 0.0}, tree);
      }
}

TEST_CASE("cuda kernels: deterministic gemm over k blocks added pairwise is the whole gemm", "[cuda][deterministic]") {
  for (std::int64_t p : {2, 4}) {
    check_tree_gemm_split<float>(19, 23, 100, p);
    check_tree_gemm_split<float>(5, 70, 4 * 96, p);
    check_tree_gemm_split<double>(19, 23, 4 * 33, p);
  }
}

TEST_CASE("cuda kernels: deterministic reduce is the host tree's bits, split or whole", "[cuda][deterministic]") {
  check_tree_reduce<float>();
  check_tree_reduce<double>();
}

TEST_CASE("cuda kernels: deterministic layer_norm_backward parameter gradients", "[cuda][deterministic]") {
  check_tree_layer_norm<float>();
  check_tree_layer_norm<double>();
}

TEST_CASE("cuda kernels: deterministic scatter_add_rows is the dense tree's bits", "[cuda][deterministic]") {
  check_tree_scatter<float>();
  check_tree_scatter<double>();
}

TEST_CASE("cuda kernels: deterministic attention matches the CPU and gives a head the same bits in any batch", "[cuda][deterministic]") {
  for (DType d : {DType::f32, DType::bf16})
    for (std::int64_t head_dim : {64, 128, 256}) {
      const std::int64_t t = 150, row_stride = head_dim + 8, heads = 4;
      const auto n = static_cast<std::size_t>(heads * t * row_stride);
      const auto q = rounded(normal(n), d), k = rounded(normal(n), d), v = rounded(normal(n), d), dout = rounded(normal(n), d);
      const AttentionBits all = device_attention(d, 0, heads, t, head_dim, row_stride, q, k, v, dout);
      const AttentionBits again = device_attention(d, 0, heads, t, head_dim, row_stride, q, k, v, dout);
      const std::string what = std::string("deterministic attention ") + std::string(nax::dtype_name(d)) + " head_dim=" + std::to_string(head_dim);
      const std::size_t es = nax::dtype_size(d), lse_es = d == DType::bf16 ? 4 : es;
      check_bits(again.dq, all.dq, es, what + " dq run to run");
      check_bits(again.dk, all.dk, es, what + " dk run to run");
      AttentionBits one;
      for (std::int64_t h = 0; h < heads; ++h) {
        const AttentionBits part = device_attention(d, h, 1, t, head_dim, row_stride, q, k, v, dout);
        for (auto [to, from] : {std::pair{&one.out, &part.out}, std::pair{&one.lse, &part.lse}, std::pair{&one.dq, &part.dq},
                                std::pair{&one.dk, &part.dk}, std::pair{&one.dv, &part.dv}})
          to->insert(to->end(), from->begin(), from->end());
      }
      check_bits(one.out, all.out, es, what + " out, 1 head vs 4");
      check_bits(one.lse, all.lse, lse_es, what + " lse, 1 head vs 4");
      check_bits(one.dq, all.dq, es, what + " dq, 1 head vs 4");
      check_bits(one.dk, all.dk, es, what + " dk, 1 head vs 4");
      check_bits(one.dv, all.dv, es, what + " dv, 1 head vs 4");
    }
  // The deterministic dq path against the CPU reference (f64), as the default path is checked.
  for (DType d : {DType::f32, DType::bf16}) {
    check_attention(d, 3, 37, 53, 64, 0, true);
    check_attention(d, 2, 100, 100, 128, 64, true);
    check_attention(d, 1, 1, 1, 64, 0, true);
  }
}

TEST_CASE("cuda kernels: bad arguments are errors", "[cuda]") {
  Device x(8, DType::f32);
  CHECK_THROWS_AS(gpu().copy(3, x.get(), x.get(), layout_of<2>({2}, {{1}, {1}})), nax::Error);
  CHECK_THROWS_AS(gpu().layer_norm_forward(DType::i32, 1, 2, x.get(), x.get(), x.get(), 1e-5, x.get(), x.get(), x.get()), nax::Error);
  CHECK_THROWS_AS(gpu().softmax_forward(DType::i32, 1, 2, x.get(), x.get(), false), nax::Error);
}

int main(int argc, char** argv) {
  if (nax::cuda::cuda_device_count() == 0) {
    std::puts("no CUDA device: skipping the CudaKernels tests");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
