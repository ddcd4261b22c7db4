// The CUDA backend's kernel layer (src/kernels/cuda, src/comm/nccl): every kernel against a float64 reference
// on the host, on fresh random inputs with poisoned outputs; the caching device allocator; GEMM
// through cuBLASLt; the NCCL communicator over the GPUs present. Without a GPU the program prints
// one line and exits 77, which CTest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <exception>
#include <type_traits>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "comparison.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kernels.h"
#include "comm/nccl/nccl_communicator.h"
#include "nax/core/dtype.h"
#include "nax/core/error.h"

namespace {

using nax::bf16;
using nax::cuda::bf16_t;

static_assert(sizeof(bf16) == sizeof(bf16_t));

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n) { NAX_CUDA_CHECK(cudaMalloc(&ptr_, std::max<std::size_t>(n, 1) * sizeof(T))); }
  ~DeviceBuffer() { (void)cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return static_cast<T*>(ptr_); }
  // Every byte 0xff: NaN as f32 and as bf16, so an element no kernel wrote fails the comparison.
  void poison() { NAX_CUDA_CHECK(cudaMemset(ptr_, 0xff, n_ * sizeof(T))); }
  template <typename H>
  void upload(const std::vector<H>& host) {
    static_assert(sizeof(H) == sizeof(T));
    REQUIRE(host.size() == n_);
    NAX_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  template <typename H>
  std::vector<H> download() const {
    static_assert(sizeof(H) == sizeof(T));
    NAX_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<H> host(n_);
    NAX_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t n_;
};

std::mt19937_64& rng() {
  static std::mt19937_64 engine{std::random_device{}()};
  return engine;
}

std::vector<float> random_f32(std::size_t n, double scale = 1.0) {
  std::normal_distribution<float> dist(0.0f, static_cast<float>(scale));
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng());
  return v;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out;
  out.reserve(v.size());
  for (float x : v) out.emplace_back(x);
  return out;
}

double value(float x) { return x; }
double value(bf16 x) { return static_cast<float>(x); }
double value(double x) { return x; }

template <typename T>
std::vector<double> as_doubles(const std::vector<T>& v) {
  std::vector<double> out;
  out.reserve(v.size());
  for (const T& x : v) out.push_back(value(x));
  return out;
}


double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double gelu_grad_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

// Sizes: tiny, odd (the scalar tail) and large enough for many blocks.
const std::vector<std::size_t> kSizes{1, 7, 1000, 65537, 3'000'001};

}  // namespace

TEST_CASE("cuda: fill writes every element", "[cuda]") {
  for (std::size_t n : kSizes) {
    DeviceBuffer<float> f(n);
    DeviceBuffer<bf16_t> b(n);
    f.poison();
    b.poison();
    nax::cuda::fill(nullptr, f.get(), n, 1.5f);
    nax::cuda::fill(nullptr, b.get(), n, -2.25f);
    for (float x : f.download<float>()) REQUIRE(x == 1.5f);
    for (bf16 x : b.download<bf16>()) REQUIRE(static_cast<float>(x) == -2.25f);
  }
}

TEST_CASE("cuda: cast f32 <-> bf16 rounds to nearest even", "[cuda]") {
  for (std::size_t n : kSizes) {
    for (std::size_t offset : {0, 1}) {  // 1: misaligned pointers take the scalar path
      const auto host = random_f32(n + offset, 10.0);
      DeviceBuffer<float> in(n + offset), back(n + offset);
      DeviceBuffer<bf16_t> mid(n + offset);
      in.upload(host);
      mid.poison();
      back.poison();
      nax::cuda::cast(nullptr, in.get() + offset, mid.get() + offset, n);
      nax::cuda::cast(nullptr, mid.get() + offset, back.get() + offset, n);
      const auto b = mid.download<bf16>();
      const auto f = back.download<float>();
      for (std::size_t i = offset; i < n + offset; ++i) {
        REQUIRE(b[i].bits == bf16(host[i]).bits);
        REQUIRE(f[i] == static_cast<float>(b[i]));
      }
    }
  }
}

TEMPLATE_TEST_CASE("cuda: add, mul and GELU match float64", "[cuda]", float, bf16) {
  constexpr bool is_bf16 = std::is_same_v<TestType, bf16>;
  using Device = std::conditional_t<is_bf16, bf16_t, float>;
  const nax::DType dtype = is_bf16 ? nax::DType::bf16 : nax::DType::f32;
  const double exact = nax::testing::accumulated_tolerance(dtype, 1), composed = nax::testing::accumulated_tolerance(dtype, 16);
  for (std::size_t n : kSizes) {
    std::vector<TestType> a, b;
    if constexpr (is_bf16) {
      a = to_bf16(random_f32(n, 2.0));
      b = to_bf16(random_f32(n, 2.0));
    } else {
      a = random_f32(n, 2.0);
      b = random_f32(n, 2.0);
    }
    DeviceBuffer<Device> da(n), db(n), out(n);
    da.upload(a);
    db.upload(b);
    std::vector<double> ref(n);

    out.poison();
    nax::cuda::add(nullptr, da.get(), db.get(), out.get(), n);
    for (std::size_t i = 0; i < n; ++i) ref[i] = value(a[i]) + value(b[i]);
    nax::testing::check_close(as_doubles(out.template download<TestType>()), ref, exact, "add");

    out.poison();
    nax::cuda::mul(nullptr, da.get(), db.get(), out.get(), n);
    for (std::size_t i = 0; i < n; ++i) ref[i] = value(a[i]) * value(b[i]);
    nax::testing::check_close(as_doubles(out.template download<TestType>()), ref, exact, "mul");

    out.poison();
    nax::cuda::gelu_forward(nullptr, da.get(), out.get(), n);
    for (std::size_t i = 0; i < n; ++i) ref[i] = gelu_ref(value(a[i]));
    nax::testing::check_close(as_doubles(out.template download<TestType>()), ref, composed, "gelu forward");

    out.poison();
    nax::cuda::gelu_backward(nullptr, da.get(), db.get(), out.get(), n);
    for (std::size_t i = 0; i < n; ++i) ref[i] = value(b[i]) * gelu_grad_ref(value(a[i]));
    nax::testing::check_close(as_doubles(out.template download<TestType>()), ref, composed, "gelu backward");
  }
}

TEST_CASE("cuda: fused AdamW matches the optimizer's formula", "[cuda]") {
  nax::cuda::AdamWConfig config;
  config.lr = 1e-2;
  config.weight_decay = 0.1;
  for (std::size_t n : {std::size_t{5}, std::size_t{100003}}) {
    auto p = random_f32(n), m = random_f32(n, 0.1), v = random_f32(n, 0.1);
    for (auto& x : v) x = x * x;
    std::vector<double> rp(p.begin(), p.end()), rm(m.begin(), m.end()), rv(v.begin(), v.end());
    DeviceBuffer<float> dp(n), dm(n), dv(n), dg(n);
    DeviceBuffer<bf16_t> copy(n);
    dp.upload(p);
    dm.upload(m);
    dv.upload(v);
    for (std::int64_t step = 1; step <= 3; ++step) {
      const auto g = random_f32(n);
      dg.upload(g);
      copy.poison();
      config.step = step;
      nax::cuda::adamw_step(nullptr, dp.get(), dm.get(), dv.get(), dg.get(), step == 2 ? nullptr : copy.get(), n, config);
      const double c1 = 1 - std::pow(config.beta1, step), c2 = 1 - std::pow(config.beta2, step);
      for (std::size_t i = 0; i < n; ++i) {
        rm[i] = rm[i] * config.beta1 + g[i] * (1 - config.beta1);
        rv[i] = rv[i] * config.beta2 + double(g[i]) * g[i] * (1 - config.beta2);
        const double direction = (rm[i] / c1) / (std::sqrt(rv[i] / c2) + config.eps) + rp[i] * config.weight_decay;
        rp[i] -= direction * config.lr;
      }
      const double f32 = nax::testing::accumulated_tolerance(nax::DType::f32, 16);
      nax::testing::check_close(as_doubles(dp.download<float>()), rp, f32, "parameters");
      nax::testing::check_close(as_doubles(dm.download<float>()), rm, f32, "first moment");
      nax::testing::check_close(as_doubles(dv.download<float>()), rv, f32, "second moment");
      if (step != 2) nax::testing::check_close(as_doubles(copy.download<bf16>()), rp, nax::testing::accumulated_tolerance(nax::DType::bf16, 16), "bf16 copy");
    }
  }
}

TEST_CASE("cuda: the caching device allocator reuses blocks and counts", "[cuda]") {
  auto allocator = nax::cuda::make_caching_device_allocator(0);
  void* a = allocator->allocate(1000);
  void* b = allocator->allocate(3 << 20);
  auto s = allocator->stats();
  CHECK(s.allocations == 2);
  CHECK(s.cache_hits == 0);
  CHECK(s.bytes_in_use == 1000 + (3 << 20));
  CHECK(s.bytes_reserved == nax::cuda::device_size_class(1000) + nax::cuda::device_size_class(3 << 20));
  NAX_CUDA_CHECK(cudaMemset(b, 1, 3 << 20));  // the memory is real device memory
  allocator->deallocate(a, 1000);
  void* c = allocator->allocate(900);  // same class: the cached block comes back
  CHECK(c == a);
  s = allocator->stats();
  CHECK(s.cache_hits == 1);
  CHECK(s.bytes_in_use == 900 + (3 << 20));
  CHECK(s.peak_bytes_in_use == 1000 + (3 << 20));
  allocator->reset_peak();
  CHECK(allocator->stats().peak_bytes_in_use == 900 + (3 << 20));
  allocator->deallocate(b, 3 << 20);
  allocator->deallocate(c, 900);
  CHECK(allocator->stats().bytes_in_use == 0);
  allocator->empty_cache();
  CHECK(allocator->stats().bytes_reserved == 0);
  CHECK_THROWS_AS(nax::cuda::make_caching_device_allocator(nax::cuda::cuda_device_count()), nax::Error);
}

namespace {

struct GemmCase {
  std::int64_t m, n, k;
  bool trans_a, trans_b;
  int batch;
  nax::cuda::GemmEpilogue epilogue;
};

// Row-major reference; a and b as stored (k x m when trans_a, n x k when trans_b).
std::vector<double> gemm_ref(const GemmCase& g, const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& bias) {
  std::vector<double> c(static_cast<std::size_t>(g.batch * g.m * g.n));
  for (int q = 0; q < g.batch; ++q)
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j) {
        double sum = 0;
        for (std::int64_t l = 0; l < g.k; ++l) {
          const double x = a[q * g.m * g.k + (g.trans_a ? l * g.m + i : i * g.k + l)];
          const double y = b[q * g.k * g.n + (g.trans_b ? j * g.k + l : l * g.n + j)];
          sum += x * y;
        }
        using E = nax::cuda::GemmEpilogue;
        if (g.epilogue == E::bias || g.epilogue == E::bias_gelu) sum += bias[j];
        if (g.epilogue == E::gelu || g.epilogue == E::bias_gelu) sum = gelu_ref(sum);
        c[q * g.m * g.n + i * g.n + j] = sum;
      }
  return c;
}

template <typename In, typename Out>
void check_gemm(nax::cuda::GemmContext& context, const GemmCase& g) {
  constexpr bool in_bf16 = std::is_same_v<In, bf16>, out_bf16 = std::is_same_v<Out, bf16>;
  using DIn = std::conditional_t<in_bf16, bf16_t, float>;
  using DOut = std::conditional_t<out_bf16, bf16_t, float>;
  const std::size_t sa = g.m * g.k, sb = g.k * g.n, sc = g.m * g.n;
  auto fa = random_f32(sa * g.batch), fb = random_f32(sb * g.batch), fbias = random_f32(g.n);
  std::vector<In> a, b;
  std::vector<Out> bias;
  if constexpr (in_bf16) a = to_bf16(fa), b = to_bf16(fb);
  else a = fa, b = fb;
  if constexpr (out_bf16) bias = to_bf16(fbias);
  else bias = fbias;
  std::vector<double> ra, rb, rbias;
  for (auto x : a) ra.push_back(value(x));
  for (auto x : b) rb.push_back(value(x));
  for (auto x : bias) rbias.push_back(value(x));

  DeviceBuffer<DIn> da(a.size()), db(b.size());
  DeviceBuffer<DOut> dc(sc * g.batch), dbias(g.n);
  da.upload(a);
  db.upload(b);
  dbias.upload(bias);
  dc.poison();
  nax::cuda::GemmArgs args;
  args.m = g.m, args.n = g.n, args.k = g.k, args.trans_a = g.trans_a, args.trans_b = g.trans_b;
  args.input = in_bf16 ? nax::DType::bf16 : nax::DType::f32;
  args.output = out_bf16 ? nax::DType::bf16 : nax::DType::f32;
  args.batch = g.batch, args.stride_a = sa, args.stride_b = sb, args.stride_c = sc;
  args.epilogue = g.epilogue, args.bias = dbias.get();
  nax::cuda::gemm_lt(context, nullptr, args, da.get(), db.get(), dc.get());
  INFO("m=" << g.m << " n=" << g.n << " k=" << g.k << " ta=" << g.trans_a << " tb=" << g.trans_b << " batch=" << g.batch
            << " epilogue=" << static_cast<int>(g.epilogue) << " in_bf16=" << in_bf16 << " out_bf16=" << out_bf16);
  // Element-wise against the result's scale: f32 accumulation over k, one rounding to the output
  // dtype; cuBLASLt's GELU epilogue is an approximation of unstated accuracy, given 1e-3 more.
  using E = nax::cuda::GemmEpilogue;
  const bool gelu = g.epilogue == E::gelu || g.epilogue == E::bias_gelu;
  const double tol = nax::testing::accumulated_tolerance(out_bf16 ? nax::DType::bf16 : nax::DType::f32, g.k) + (gelu ? 1e-3 : 0.0);
  nax::testing::check_close_scaled(as_doubles(dc.template download<Out>()), gemm_ref(g, ra, rb, rbias), tol, "gemm_lt");
}

}  // namespace

TEST_CASE("cuda: gemm_lt matches float64 (shapes, transposes, batches, epilogues)", "[cuda]") {
  nax::cuda::GemmContext context(0);
  using E = nax::cuda::GemmEpilogue;
  const std::vector<GemmCase> cases{
      {64, 48, 32, false, false, 1, E::none},   {129, 77, 65, false, false, 1, E::none}, {128, 256, 96, true, false, 1, E::none},
      {96, 64, 128, false, true, 1, E::none},   {40, 56, 72, true, true, 1, E::none},    {64, 32, 48, false, false, 3, E::none},
      {33, 40, 24, true, false, 4, E::none},    {128, 64, 64, false, false, 1, E::bias}, {128, 64, 64, false, false, 1, E::gelu},
      {128, 64, 64, false, false, 2, E::bias_gelu}, {512, 512, 512, false, false, 1, E::none}};
  for (const auto& g : cases) {
    check_gemm<float, float>(context, g);
    check_gemm<bf16, bf16>(context, g);
    check_gemm<bf16, float>(context, g);
  }
  nax::cuda::GemmArgs bad;
  CHECK_THROWS_AS(nax::cuda::gemm_lt(context, nullptr, bad, nullptr, nullptr, nullptr), nax::Error);
}

TEST_CASE("cuda: check macros name the call and the library's message", "[cuda]") {
  try {
    NAX_CUDA_CHECK(cudaSetDevice(1 << 20));
    FAIL("no error");
  } catch (const nax::Error& e) {
    const std::string message = e.what();
    CHECK(message.find("cudaSetDevice(1 << 20)") != std::string::npos);
    CHECK(message.find("test_cuda.cpp") != std::string::npos);
    CHECK(message.find("invalid device") != std::string::npos);
  }
  (void)cudaGetLastError();
}

namespace {

// Runs fn(rank, communicator) on one thread per GPU of the group, then synchronises each stream.
template <typename F>
void on_group(int n, F fn) {
  std::vector<int> devices(n);
  for (int i = 0; i < n; ++i) devices[i] = i;
  auto group = nax::cuda::make_nccl_group(devices);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(n);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        NAX_CUDA_CHECK(cudaSetDevice(r));
        fn(r, *group[r]);
        NAX_CUDA_CHECK(cudaStreamSynchronize(group[r]->stream()));
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Rank r's input element i: distinct per rank and element, exact in f32.
float input(int r, std::size_t i) { return static_cast<float>(r * 1000 + static_cast<int>(i % 997)) * 0.5f; }

}  // namespace

TEST_CASE("cuda: NCCL collectives over the GPUs present", "[cuda][nccl]") {
  const int n = nax::cuda::cuda_device_count();
  const std::size_t count = 4099;
  std::vector<std::vector<float>> results(n);
  std::vector<nax::CommStats> stats(n);
  auto run = [&](auto body) {
    on_group(n, [&](int r, nax::cuda::NcclCommunicator& comm) {
      std::vector<float> host(count * n);
      for (std::size_t i = 0; i < host.size(); ++i) host[i] = input(r, i);
      DeviceBuffer<float> send(count * n), recv(count * n);
      send.upload(host);
      recv.poison();
      body(r, comm, send.get(), recv.get());
      results[r] = recv.download<float>();
      stats[r] = comm.stats();
    });
  };

  SECTION("all_reduce") {
    run([&](int, auto& comm, float* s, float* d) { comm.all_reduce(s, d, count, nax::DType::f32, nax::ReduceOp::sum); });
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < count; ++i) {
        float sum = 0;
        for (int q = 0; q < n; ++q) sum += input(q, i);
        REQUIRE(results[r][i] == sum);
      }
      CHECK(stats[r].bytes[static_cast<int>(nax::CollectiveKind::all_reduce)] == count * 4);
    }
  }
  SECTION("all_gather") {
    run([&](int, auto& comm, float* s, float* d) { comm.all_gather(s, d, count, nax::DType::f32); });
    for (int r = 0; r < n; ++r)
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count; ++i) REQUIRE(results[r][q * count + i] == input(q, i));
  }
  SECTION("reduce_scatter") {
    run([&](int, auto& comm, float* s, float* d) { comm.reduce_scatter(s, d, count, nax::DType::f32, nax::ReduceOp::max); });
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < count; ++i) {
        float best = input(0, r * count + i);
        for (int q = 1; q < n; ++q) best = std::max(best, input(q, r * count + i));
        REQUIRE(results[r][i] == best);
      }
      CHECK(stats[r].bytes[static_cast<int>(nax::CollectiveKind::reduce_scatter)] == count * n * 4);
    }
  }
  SECTION("all_to_all") {
    run([&](int, auto& comm, float* s, float* d) { comm.all_to_all(s, d, count, nax::DType::f32); });
    for (int r = 0; r < n; ++r)
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count; ++i) REQUIRE(results[r][q * count + i] == input(q, r * count + i));
  }
  SECTION("permute: a shift, and a rank that receives nothing gets zeros") {
    std::vector<std::pair<int, int>> pairs;
    for (int r = 0; r + 1 < n; ++r) pairs.emplace_back(r, r + 1);  // rank 0 receives nothing
    if (n == 1) pairs.clear();
    run([&](int, auto& comm, float* s, float* d) { comm.permute(s, d, count, nax::DType::f32, pairs); });
    for (std::size_t i = 0; i < count; ++i) REQUIRE(results[0][i] == 0.0f);
    for (int r = 1; r < n; ++r)
      for (std::size_t i = 0; i < count; ++i) REQUIRE(results[r][i] == input(r - 1, i));
  }
  SECTION("permute: the identity is a copy on every rank") {
    std::vector<std::pair<int, int>> pairs;
    for (int r = 0; r < n; ++r) pairs.emplace_back(r, r);
    run([&](int, auto& comm, float* s, float* d) { comm.permute(s, d, count, nax::DType::f32, pairs); });
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < count; ++i) REQUIRE(results[r][i] == input(r, i));
  }
  SECTION("a bad permutation is an error") {
    CHECK_THROWS_AS(run([&](int, auto& comm, float* s, float* d) { comm.permute(s, d, count, nax::DType::f32, {{0, n}}); }), nax::Error);
  }
  SECTION("started collectives: two in flight, waited out of order, then a blocking one follows them") {
    std::vector<std::vector<float>> sums(n);
    run([&](int r, auto& comm, float* s, float* d) {
      DeviceBuffer<float> sum(count);
      sum.poison();
      auto summing = comm.start_all_reduce(s, sum.get(), count, nax::DType::f32, nax::ReduceOp::sum);
      auto gathering = comm.start_all_gather(s, d, count, nax::DType::f32);
      gathering->wait();
      summing->wait();
      comm.all_reduce(sum.get(), sum.get(), count, nax::DType::f32, nax::ReduceOp::max);  // equal sums: unchanged
      sums[r] = sum.download<float>();
    });
    for (int r = 0; r < n; ++r) {
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count; ++i) REQUIRE(results[r][q * count + i] == input(q, i));
      for (std::size_t i = 0; i < count; ++i) {
        float sum = 0;
        for (int q = 0; q < n; ++q) sum += input(q, i);
        REQUIRE(sums[r][i] == sum);
      }
    }
  }
  SECTION("broadcast and barrier") {
    run([&](int, auto& comm, float* s, float* d) {
      comm.broadcast(s, d, count, nax::DType::f32, n - 1);
      comm.barrier();
    });
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < count; ++i) REQUIRE(results[r][i] == input(n - 1, i));
      CHECK(stats[r].calls[static_cast<int>(nax::CollectiveKind::barrier)] == 1);
    }
  }
}

TEST_CASE("cuda: NCCL bf16 all_reduce across two GPUs", "[cuda][nccl]") {
  const int n = nax::cuda::cuda_device_count();
  if (n < 2) {
    WARN("fewer than 2 GPUs: skipping the 2-GPU NCCL checks");
    return;
  }
  const std::size_t count = 1 << 16;
  std::vector<std::vector<bf16>> out(n);
  on_group(n, [&](int r, nax::cuda::NcclCommunicator& comm) {
    std::vector<bf16> host(count);
    for (std::size_t i = 0; i < count; ++i) host[i] = bf16(static_cast<float>(r + 1));
    DeviceBuffer<bf16_t> buffer(count);
    buffer.upload(host);
    comm.all_reduce(buffer.get(), buffer.get(), count, nax::DType::bf16, nax::ReduceOp::sum);  // in place
    out[r] = buffer.download<bf16>();
  });
  const float expected = static_cast<float>(n * (n + 1) / 2);
  for (int r = 0; r < n; ++r)
    for (bf16 x : out[r]) REQUIRE(static_cast<float>(x) == expected);
}

int main(int argc, char** argv) {
  if (nax::cuda::cuda_device_count() == 0) {
    std::puts("no CUDA device: skipping the cuda tests");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
