#!/usr/bin/env bash
# gpu_check.sh: the CUDA backend's checks and benchmarks on a machine with one H200 (sm_90), in one
# call that fits a 15-minute lease (each stage has a time limit; later stages are skipped, and say
# so, when the budget runs out):
#   1. configure build-gpu/ with CUDA (Release) and build the cuda tests, the benches and gptj;
#      where the image lacks fmt/OpenBLAS/Catch2/nlohmann-json, use build-gpu-deps/ (made here by
#      scripts/gpu_deps.sh and carried along);
#   2. ctest -L cuda: the first-stage checks (test_cuda), every CudaKernels method against the CPU
#      in f64 (test_cuda_kernels), the flash attention kernels (test_cuda_attention), GPT-J on CUDA
#      against the CPU, on virtual devices, hand = auto, bf16 (test_cuda_gptj);
#   3. bench_cuda_gemm: 8192^3 bf16 through nax `dot` against direct cuBLASLt (goal >= 95%);
#   4. bench_cuda_attention: fused causal attention forward+backward TFLOP/s; bench_optimizer: the
#      fused AdamW step against tensor ops over 268M parameters;
#   5. bench_train --backend cuda --dtype bf16: tokens/s and MFU of 350m and 1.3b at seq 2048 on
#      one GPU (goal for 1.3b: MFU >= 40% of 989 TFLOP/s);
#   6. where JAX with a GPU is present: the same 350m model (f32) under JAX jit against nax f32;
#   7. a short table last.
# Logs and JSON go to $OUT (the device tool's output folder) when set, else build-gpu/gpu_check/.
#
#   scripts/gpu_check.sh [budget seconds, default 780]      (from the repository root)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-gpu/gpu_check}
mkdir -p "$out"
budget=${1:-780}
start=$(date +%s)
jobs=$(nproc)
declare -A status
for key in configure build ctest gemm attention optimizer train_350m train_1_3b jax; do status[$key]="not run"; done

left() { echo $((budget - ($(date +%s) - start))); }
# run_stage KEY LIMIT LOG COMMAND...: runs COMMAND under min(LIMIT, time left), logs it, records ok/FAIL/TIMEOUT.
run_stage() {
  local key=$1 limit=$2 log=$3
  shift 3
  local remaining
  remaining=$(left)
  if [ "$remaining" -lt 20 ]; then
    status[$key]="skipped (budget)"
    return 1
  fi
  [ "$limit" -gt "$remaining" ] && limit=$remaining
  local t0 rc
  t0=$(date +%s)
  timeout "$limit" "$@" > "$out/$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then status[$key]="ok ($(($(date +%s) - t0)) s)"
  elif [ $rc -eq 124 ]; then status[$key]="TIMEOUT after ${limit} s"
  else status[$key]="FAIL rc=$rc ($(($(date +%s) - t0)) s)"
  fi
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  > "$out/nvidia_smi.txt" 2>&1 || true
cat "$out/nvidia_smi.txt"

# --- dependencies: the system's, else the carried build-gpu-deps/ ---
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DNAX_WITH_CUDA=ON -DNAX_WITH_MPI=OFF -DNAX_BUILD_EXAMPLES=ON -DNAX_BUILD_BENCH=ON)
missing=0
for header in fmt/format.h catch2/catch.hpp nlohmann/json.hpp; do
  ls /usr/include/$header /usr/local/include/$header > /dev/null 2>&1 || missing=1
done
ls /usr/include/*/openblas*/cblas.h /usr/include/cblas.h /usr/include/openblas/cblas.h > /dev/null 2>&1 || missing=1
if [ $missing = 1 ]; then
  if [ -d build-gpu-deps ]; then
    echo "pre-flight: the image lacks the CPU side's dependencies: using the carried build-gpu-deps/"
    cmake_args+=(-DCMAKE_PREFIX_PATH="$PWD/build-gpu-deps")
    export LD_LIBRARY_PATH="$PWD/build-gpu-deps/lib/$(gcc -dumpmachine):${LD_LIBRARY_PATH:-}"
  else
    echo "pre-flight: fmt/OpenBLAS/Catch2/nlohmann-json missing and no build-gpu-deps/ (run scripts/gpu_deps.sh here and carry it)"
  fi
fi
if ! ls /usr/local/cuda/include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h > /dev/null 2>&1; then
  # The NCCL wheel of the image's Python (nvidia-nccl-cu13): headers and libnccl.so.2.
  nccl_dir=$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0])' 2>/dev/null || true)
  if [ -n "$nccl_dir" ] && [ -f "$nccl_dir/include/nccl.h" ]; then
    cmake_args+=(-DNAX_NCCL_INCLUDE_DIR="$nccl_dir/include" -DNAX_NCCL_LIBRARY="$(ls "$nccl_dir"/lib/libnccl.so* | head -1)")
    export LD_LIBRARY_PATH="$nccl_dir/lib:${LD_LIBRARY_PATH:-}"
    echo "pre-flight: NCCL from the Python wheel: $nccl_dir"
  else
    echo "pre-flight: nccl.h MISSING"
  fi
fi

# --- build ---
targets=(test_cuda test_cuda_kernels test_cuda_attention test_cuda_gptj bench_cuda_gemm bench_cuda_attention bench_optimizer bench_train gptj)
if run_stage configure 120 configure.log cmake -S . -B build-gpu -G Ninja "${cmake_args[@]}"; then
  grep "nax:" "$out/configure.log"
  run_stage build 420 build.log cmake --build build-gpu -j "$jobs" --target "${targets[@]}" || tail -30 "$out/build.log"
else
  tail -30 "$out/configure.log"
fi
built() { [[ ${status[build]} == ok* ]]; }

# --- tests, then benchmarks ---
if built; then
  run_stage ctest 240 ctest.log ctest --test-dir build-gpu -L cuda --output-on-failure --timeout 200
  grep -E "Test +#|tests passed|tests failed" "$out/ctest.log"
  grep -q "Skipped" "$out/ctest.log" && status[ctest]="SKIPPED (no GPU seen?)"
  run_stage gemm 90 gemm.log build-gpu/bin/bench_cuda_gemm --sizes 8192 --reps 20 --warmup 5 --json "$out/gemm.json"
  run_stage attention 60 attention.log build-gpu/bin/bench_cuda_attention
  run_stage optimizer 40 optimizer.log build-gpu/bin/bench_optimizer --backend cuda --elements 268435456 --json "$out/optimizer.json"
  run_stage train_350m 150 train_350m.log build-gpu/bin/bench_train --backend cuda --dtype bf16 --config 350m \
    --meshes "dp=1,mp=1" --batch 8 --seq 2048 --steps 6 --json "$out/train_350m.json"
  run_stage train_1_3b 200 train_1_3b.log build-gpu/bin/bench_train --backend cuda --dtype bf16 --config 1.3b \
    --meshes "dp=1,mp=1" --batch 8 --seq 2048 --steps 6 --json "$out/train_1_3b.json"
  if python3 -c 'import jax, sys; sys.exit(0 if jax.default_backend() == "gpu" else 1)' > /dev/null 2>&1; then
    # The same 350m run (f32: the JAX script trains in f32) exported, then trained by JAX jit and by nax.
    text="$out/corpus.txt"
    cat README.md ../shared/DESIGN.md src/*/*.cpp > "$text" 2> /dev/null || cat README.md > "$text"
    jax_run() {
      build-gpu/bin/gptj export --config 350m --mesh dp=1,mp=1 --data "$text" --steps 6 --batch 4 --seq 2048 --out "$out/export350m" &&
        JAX_PLATFORMS=cuda python3 bench/jax_baseline.py --export "$out/export350m" --json "$out/jax_350m.json" --quiet &&
        build-gpu/bin/bench_train --backend cuda --dtype f32 --config 350m --meshes "dp=1,mp=1" --batch 4 --seq 2048 --steps 6 \
          --json "$out/nax_350m_f32.json"
    }
    export -f jax_run
    export out text
    run_stage jax 200 jax.log bash -c jax_run
  else
    status[jax]="skipped (no JAX with a GPU)"
  fi
fi

# --- the table ---
field() {  # field FILE KEY: the first numeric KEY in a JSON file
  [ -f "$1" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d=d[0] if isinstance(d,list) else d; d=d.get('results',[d])[0] if 'results' in d else d; print(d.get(sys.argv[2],''))" "$1" "$2" 2> /dev/null
}
fmt_num() { [ -n "$1" ] && python3 -c "import sys; print(f'{float(sys.argv[1]):.{sys.argv[2]}f}')" "$1" "$2" 2> /dev/null || echo "-"; }
echo
echo "=== gpu_check summary ($(($(date +%s) - start)) s of ${budget}) ==="
for key in configure build ctest gemm attention optimizer train_350m train_1_3b jax; do printf '%-12s %s\n' "$key" "${status[$key]}"; done
echo
printf '%-44s %s\n' "GEMM 8192^3 bf16: nax dot TFLOP/s" "$(fmt_num "$(field "$out/gemm.json" dot_tflops)" 1)"
printf '%-44s %s\n' "           direct cuBLASLt (same timing)" "$(fmt_num "$(field "$out/gemm.json" direct_host_timed_tflops)" 1)"
printf '%-44s %s\n' "           dot / direct (goal >= 0.95)" "$(fmt_num "$(field "$out/gemm.json" dot_ratio)" 3)"
printf '%-44s %s\n' "           gemm_lt / direct (events)" "$(fmt_num "$(field "$out/gemm.json" ratio)" 3)"
[ -f "$out/attention.log" ] && grep -E "^bf16" "$out/attention.log" | sed 's/^/attention  /'
[ -f "$out/optimizer.log" ] && grep -E "fused|speed-up" "$out/optimizer.log" | sed 's/^/AdamW 268M /'
for config in 350m 1_3b; do
  json="$out/train_$config.json"
  printf '%-44s %s tokens/s, MFU %s%% (goal 1.3b >= 40%%)\n' "gptj train ${config/_/.} bf16 seq 2048, 1 GPU" \
    "$(fmt_num "$(field "$json" tokens_per_s)" 0)" "$(fmt_num "$(python3 -c "print(100*float('$(field "$json" mfu)'))" 2> /dev/null)" 1)"
done
if [ -f "$out/jax_350m.json" ]; then
  printf '%-44s nax %s vs JAX jit %s tokens/s\n' "350m f32 seq 2048, 1 GPU" "$(fmt_num "$(field "$out/nax_350m_f32.json" tokens_per_s)" 0)" \
    "$(fmt_num "$(field "$out/jax_350m.json" tokens_per_s)" 0)"
fi
[[ ${status[ctest]} == ok* ]] && [[ ${status[gemm]} == ok* ]]
