#!/usr/bin/env bash
# gpu_check.sh: the CUDA backend's checks on a machine with a GPU (written for one H200, sm_90).
#   1. configures build-gpu/ with -DNAX_WITH_CUDA=ON (Release) and builds the cuda targets;
#   2. ctest -L cuda --output-on-failure (tests/test_cuda.cpp: every kernel against float64, the
#      caching device allocator, gemm_lt shapes/transposes/batches/epilogues, NCCL collectives
#      over the GPUs present; the 2-GPU checks skip on one GPU);
#   3. build-gpu/bin/bench_cuda_gemm: nax gemm_lt against cuBLASLt direct, bf16 4096^3 and 8192^3;
#   4. a short table last.
# Logs and JSON go to $OUT (the device tool's output folder) when set, else build-gpu/gpu_check/.
#
# Covered so far (issue 7, stage 1): src/kernels/cuda and src/comm/nccl only: kernels on raw pointers (fill, cast,
# add, mul, GELU fwd/bwd, fused AdamW, gemm_lt), the caching device allocator, the NCCL
# communicator. NOT yet covered: the tensor ops on CUDA (Tensor/src/ops are still CPU only), no
# attention, layer_norm, softmax/cross-entropy, embedding or reductions kernels, no device
# placement in the runtime, and the trainer's --backend cuda does not exist yet.
#
#   scripts/gpu_check.sh            (from the repository root)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-gpu/gpu_check}
mkdir -p "$out"
jobs=$(nproc)
status_configure=FAIL status_build=FAIL status_test=FAIL status_bench=FAIL

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  > "$out/nvidia_smi.txt" 2>&1 || true
cat "$out/nvidia_smi.txt"

# Pre-flight: the device image is not known to carry the CPU side's dependencies (fmt, OpenBLAS,
# Catch2 v2, nlohmann-json, from Debian on the development machine) or NCCL in the toolkit; say
# what is there, so that a failed configure is quick to read.
for header in fmt/format.h cblas.h catch2/catch.hpp nlohmann/json.hpp; do
  found=$(ls /usr/include/$header /usr/local/include/$header /usr/include/*/$header 2>/dev/null | head -1)
  printf 'pre-flight %-20s %s\n' "$header" "${found:-MISSING}"
done
nccl_args=()
if ! ls /usr/local/cuda/include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h > /dev/null 2>&1; then
  # PyTorch's wheel of NCCL (nvidia-nccl-cu13) as a fallback: headers and libnccl.so.2.
  nccl_dir=$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0])' 2>/dev/null || true)
  if [ -n "$nccl_dir" ] && [ -f "$nccl_dir/include/nccl.h" ]; then
    nccl_lib=$(ls "$nccl_dir"/lib/libnccl.so* 2>/dev/null | head -1)
    nccl_args=(-DNAX_NCCL_INCLUDE_DIR="$nccl_dir/include" -DNAX_NCCL_LIBRARY="$nccl_lib")
    echo "pre-flight nccl from the Python wheel: $nccl_dir"
  else
    echo "pre-flight nccl.h MISSING"
  fi
fi

t0=$(date +%s)
if cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DNAX_WITH_CUDA=ON -DNAX_BUILD_EXAMPLES=OFF "${nccl_args[@]}" \
     > "$out/configure.log" 2>&1; then
  status_configure=ok
  grep "nax:" "$out/configure.log"
  if cmake --build build-gpu -j "$jobs" --target test_cuda bench_cuda_gemm > "$out/build.log" 2>&1; then
    status_build=ok
  else
    tail -40 "$out/build.log"
  fi
else
  tail -40 "$out/configure.log"
fi
t1=$(date +%s)

if [ "$status_build" = ok ]; then
  if (cd build-gpu && ctest -L cuda --output-on-failure --timeout 600) > "$out/ctest.log" 2>&1; then
    status_test=ok
    grep -q "Skipped\|Not Run" "$out/ctest.log" && status_test="SKIPPED (no GPU seen?)"
  fi
  tail -30 "$out/ctest.log"
  if build-gpu/bin/bench_cuda_gemm --sizes 4096,8192 --reps 30 --warmup 5 --json "$out/bench_cuda_gemm.json" \
       > "$out/bench.log" 2>&1; then
    status_bench=ok
  fi
fi
t2=$(date +%s)

echo
echo "=== gpu_check summary ==="
printf '%-22s %s\n' configure "$status_configure" build "$status_build ($((t1 - t0)) s)" "ctest -L cuda" "$status_test" \
  bench_cuda_gemm "$status_bench ($((t2 - t1)) s with tests)"
[ -f "$out/bench.log" ] && cat "$out/bench.log"
[ "$status_test" = ok ] && [ "$status_bench" = ok ]
