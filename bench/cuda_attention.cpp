// bench_cuda_attention: the fused causal attention kernels (src/kernels/cuda/attention.h),
// forward and backward, bf16, batch*heads = 16*16 matrices of seq x head_dim (contiguous), on
// device 0. Each pass timed with CUDA events, median of --reps after --warmup runs.
//
// FLOP convention (causal: half of the dense score matrix): forward 0.5 * 4 * seq^2 * head_dim
// per matrix (QK^T and PV), backward 2.5x the forward (QK^T recomputed, dV, dP, dQ, dK). The
// exponentials and the softmax arithmetic are not counted.
//
//   build/bin/bench_cuda_attention [--seq 2048] [--batches 256] [--head-dims 64,128] [--reps 20] [--warmup 3]
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/check.h"
#include "nax/core/dtype.h"

namespace {

struct Options {
  std::int64_t seq = 2048, batches = 16 * 16;
  std::vector<std::int64_t> head_dims{64, 128};
  int reps = 20, warmup = 3;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--seq") o.seq = std::stoll(next());
    else if (arg == "--batches") o.batches = std::stoll(next());
    else if (arg == "--reps") o.reps = std::stoi(next());
    else if (arg == "--warmup") o.warmup = std::stoi(next());
    else if (arg == "--head-dims") o.head_dims = bench::parse_integer_list(next(), arg);
    else throw std::runtime_error("unknown argument " + arg + " (--seq, --batches, --head-dims, --reps, --warmup)");
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options options = parse(argc, argv);
  if (nax::cuda::cuda_device_count() == 0) {
    std::puts("no CUDA device: bench_cuda_attention needs a GPU");
    return 77;
  }
  cudaDeviceProp prop{};
  NAX_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream = nullptr;
  NAX_CUDA_CHECK(cudaStreamCreate(&stream));
  fmt::print("bench_cuda_attention on {}: bf16, causal, {} matrices of seq {}, median of {} after {} warm-up\n", prop.name,
             options.batches, options.seq, options.reps, options.warmup);
  fmt::print("FLOPs: forward 0.5 * 4 * seq^2 * head_dim per matrix (causal half), backward 2.5x forward\n");
  const double peak = bench::dense_bf16_peak_tflops();
  fmt::print("dense bf16 peak: {}\n", peak > 0 ? fmt::format("{:.0f} TFLOP/s", peak) : std::string("not known for this architecture"));

  for (std::int64_t head_dim : options.head_dims) {
    nax::kernels::AttentionSizes s;
    s.dtype = nax::DType::bf16;
    s.batches = options.batches;
    s.tq = s.tk = options.seq;
    s.head_dim = head_dim;
    s.scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    const std::size_t elements = static_cast<std::size_t>(s.batches * s.tq * head_dim);
    const std::size_t bytes = elements * sizeof(nax::bf16);
    bench::DeviceBuffer q(bytes), k(bytes), v(bytes), out(bytes), dout(bytes), dq(bytes), dk(bytes), dv(bytes);
    bench::DeviceBuffer lse(static_cast<std::size_t>(s.batches * s.tq) * sizeof(float));
    const std::int64_t scratch_elements = std::max(nax::cuda::attention_forward_scratch(s), nax::cuda::attention_backward_scratch(s));
    bench::DeviceBuffer scratch(static_cast<std::size_t>(scratch_elements) * sizeof(nax::bf16));
    bench::fill_random_bf16(q.get(), elements, 1);
    bench::fill_random_bf16(k.get(), elements, 2);
    bench::fill_random_bf16(v.get(), elements, 3);
    bench::fill_random_bf16(dout.get(), elements, 4);
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(s.batches));
    for (std::int64_t b = 0; b < s.batches; ++b) offsets[static_cast<std::size_t>(b)] = b * s.tq * head_dim;
    auto in = [&](const bench::DeviceBuffer& buffer) { return nax::kernels::InMatrices{buffer.get(), offsets.data(), head_dim}; };
    auto out_of = [&](bench::DeviceBuffer& buffer) { return nax::kernels::OutMatrices{buffer.get(), offsets.data(), head_dim}; };

    auto forward = [&] { nax::cuda::attention_forward(stream, s, in(q), in(k), in(v), out_of(out), lse.get(), scratch.get()); };
    auto backward = [&] {
      nax::cuda::attention_backward(stream, s, in(q), in(k), in(v), in(out), in(dout), lse.get(), nullptr, out_of(dq), out_of(dk), out_of(dv),
                                    scratch.get());
    };
    forward();  // out and lse for the backward
    const double fwd_ms = bench::median_ms(stream, options.warmup, options.reps, forward);
    const double bwd_ms = bench::median_ms(stream, options.warmup, options.reps, backward);
    const double fwd_flops = 0.5 * 4.0 * static_cast<double>(s.tq) * static_cast<double>(s.tk) * static_cast<double>(head_dim) *
                             static_cast<double>(s.batches);
    const double bwd_flops = 2.5 * fwd_flops;
    auto tflops = [](double flops, double ms) { return flops / (ms * 1e-3) / 1e12; };
    const double fwd = tflops(fwd_flops, fwd_ms), bwd = tflops(bwd_flops, bwd_ms), both = tflops(fwd_flops + bwd_flops, fwd_ms + bwd_ms);
    fmt::print("bf16 batches {} seq {} head_dim {:>3}: forward {:8.3f} ms {:6.1f} TFLOP/s ({}) | backward {:8.3f} ms {:6.1f} TFLOP/s ({}) | "
               "forward+backward {:6.1f} TFLOP/s ({} of peak)\n",
               s.batches, s.tq, head_dim, fwd_ms, fwd, bench::fraction_of_peak(fwd, peak), bwd_ms, bwd, bench::fraction_of_peak(bwd, peak),
               both, bench::fraction_of_peak(both, peak));
  }
  NAX_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_cuda_attention: %s\n", e.what());
  return 1;
}
