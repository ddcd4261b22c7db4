// bench_gemm_bf16: nax::dot in bf16 (the CPU's bf16 GEMM through oneDNN where it has one: bf16
// operands, f32 sums) against nax::dot in f32 (OpenBLAS's sgemm, or oneDNN's f32 kernel under
// NAX_F32_GEMM=onednn) on the same square problems, one thread, in one run: GFLOP/s as the
// median of repetitions, the two interleaved, and the ratio.
//
//   build/bin/bench_gemm_bf16 [--sizes 1024,4096] [--json FILE]
#include <nax/kernels/kernels.h>
#include <nax/nax.h>

#include <fmt/format.h>

#include "bench_util.h"

int main(int argc, char** argv) {
  std::vector<std::int64_t> sizes{1024, 4096};
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--sizes") sizes = bench::parse_integer_list(bench::flag_value(argc, argv, i), "--sizes");
    else if (arg == "--json") json_path = bench::flag_value(argc, argv, i);
    else nax::fail("bench_gemm_bf16", "unknown flag '{}' (flags: --sizes, --json)", arg);
  }
  nax::Runtime rt = nax::Runtime::local(nax::Mesh::parse("x=1"), {.blas_threads = 1});
  std::vector<bench::JsonObject> rows;
  rt.run([&](nax::Shard& s) {
    const bool direct = s.device_ptr()->kernels().gemm_computes(nax::DType::bf16);
    fmt::print("bf16 GEMM: {}\n", direct ? "the CPU's bf16 instructions (oneDNN)" : "widened to f32 (no bf16 GEMM here)");
    fmt::print("{:>6} {:>14} {:>14} {:>8}\n", "size", "f32 GFLOP/s", "bf16 GFLOP/s", "ratio");
    for (const std::int64_t n : sizes) {
      const nax::Tensor a = nax::random_normal(nax::Shape{{"m", n}, {"k", n}}, 1, "a"), b = nax::random_normal(nax::Shape{{"k", n}, {"n", n}}, 1, "b");
      const nax::Tensor a16 = nax::cast(a, nax::DType::bf16), b16 = nax::cast(b, nax::DType::bf16);
      const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
      const int reps = std::clamp(static_cast<int>(2e11 / flops), 3, 30);
      std::vector<double> f32, bf16;
      nax::dot(a, b, "k"), nax::dot(a16, b16, "k");  // warm up (the bf16 GEMM makes its kernel once per shape)
      for (int r = 0; r < reps; ++r) {
        f32.push_back(bench::seconds_of([&] { nax::dot(a, b, "k"); }));
        bf16.push_back(bench::seconds_of([&] { nax::dot(a16, b16, "k"); }));
      }
      const double g32 = flops / bench::median(f32) * 1e-9, g16 = flops / bench::median(bf16) * 1e-9;
      fmt::print("{:>6} {:>14.1f} {:>14.1f} {:>8.2f}\n", n, g32, g16, g16 / g32);
      rows.push_back(bench::JsonObject().add("size", n).add("f32_gflops", g32).add("bf16_gflops", g16).add("ratio", g16 / g32).add(
          "bf16_direct", direct));
    }
  });
  if (!json_path.empty()) bench::write_text_file(json_path, fmt::format("{{\n  \"rows\": {}\n}}\n", bench::json_array(rows)));
  return 0;
}
