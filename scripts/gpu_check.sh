#!/usr/bin/env bash
# gpu_check.sh: the CUDA backend's checks on one H200 in a single short call (docs/gpu-check.md).
# The lease is 15 minutes in all and 10 per command, and only 8 files of $OUT come back, so:
#   - preflight first: stop at once, saying what is missing (GPU, nvcc, cmake, cuBLASLt, nccl.h);
#   - then the most important facts first, each stage under its own time limit and all under a hard
#     budget (<= 420 s, leaving time for a rerun); optional stages run only while their limit fits;
#   - each stage's result line is printed (and appended to $OUT/summary.txt) as the stage ends, so a
#     killed run still reports what it finished;
#   - logs and JSON are packed into one archive after every stage: $OUT holds 3 files.
#
#   scripts/gpu_check.sh            run (from the repository root, on the GPU machine)
#   scripts/gpu_check.sh --plan     print the stages, limits and output files; run nothing
#   scripts/gpu_check.sh --prepare  here: build the GPU binaries (-DNAX_NATIVE=OFF) and pack them,
#                                   with the libraries the GPU image lacks, into gpu-carry/ (carry it)
# Environment: GPU_CHECK_BUDGET (seconds, default 420).
set -uo pipefail
cd "$(dirname "$0")/.."

readonly max_budget=420 max_out_files=8
budget=${GPU_CHECK_BUDGET:-$max_budget}
# name:limit_s:kind:what. Order is priority; "optional" stages run only if their limit still fits.
stages=(
  "preflight:10:required:nvidia-smi, nvcc, cmake, cuBLASLt and nccl.h present"
  "build:120:required:carried binaries checked (ldd); what is missing is built here"
  "tests:120:required:cuda test binaries (ctest -L cuda's), 120 s each at most, NAX_COLLECTIVE_TIMEOUT_S=60"
  "gemm:30:required:8192^3 bf16 nax dot vs direct cuBLASLt (fraction of peak)"
  "attention:25:required:fused causal attention fwd+bwd bf16 vs the plain reference"
  "train_1_3b:100:required:gptj 1.3b bf16 seq 2048: tokens/s, MFU, loss falling, peak memory, fwd/bwd/opt split"
  "train_350m:45:optional:gptj 350m bf16 seq 2048"
  "optimizer:20:optional:fused AdamW over 64M parameters"
  "jax:60:optional:350m f32 under JAX jit vs nax (if JAX sees the GPU)"
)
out_files=(summary.txt results.json logs.tar.gz)
targets=(test_cuda test_cuda_kernels test_cuda_attention test_cuda_gptj bench_cuda_gemm bench_cuda_attention bench_optimizer
         bench_train gptj)
carry_dir=gpu-carry
bin_archive=$carry_dir/nax-gpu-bin.tar.gz

field() { echo "$1" | cut -d: -f$(($2 + 1))$([ "$2" = 3 ] && echo -); }  # field 3 (what) may hold colons

plan() {
  local required=0 all=0 s
  echo "gpu_check plan: hard budget ${budget} s (at most ${max_budget}); files in \$OUT: ${#out_files[@]} (${out_files[*]}; at most ${max_out_files})"
  for s in "${stages[@]}"; do
    printf '  %-11s %4s s  %-8s  %s\n' "$(field "$s" 0)" "$(field "$s" 1)" "$(field "$s" 2)" "$(field "$s" 3)"
    all=$((all + $(field "$s" 1)))
    [ "$(field "$s" 2)" = required ] && required=$((required + $(field "$s" 1)))
  done
  echo "required stages: ${required} s of the ${budget} s budget; all stages: ${all} s (optional ones only while they fit)"
  local ok=1
  [ "$budget" -le "$max_budget" ] || { echo "plan error: budget ${budget} s exceeds ${max_budget} s"; ok=0; }
  [ "$required" -le "$budget" ] || { echo "plan error: required stages need ${required} s, over the budget"; ok=0; }
  [ "${#out_files[@]}" -le "$max_out_files" ] || { echo "plan error: ${#out_files[@]} output files"; ok=0; }
  [ $ok = 1 ] && echo "plan ok"
  [ $ok = 1 ]
}

prepare() {
  set -e
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DNAX_NATIVE=OFF -DNAX_WITH_CUDA=ON -DNAX_WITH_MPI=OFF \
    -DNAX_BUILD_EXAMPLES=ON -DNAX_BUILD_BENCH=ON -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache
  cmake --build build-gpu -j "${GPU_CHECK_JOBS:-2}" --target "${targets[@]}"
  local stage=build-gpu/carry
  rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/lib" "$carry_dir"
  for t in "${targets[@]}"; do cp "build-gpu/bin/$t" "$stage/bin/"; done
  # The libraries the GPU image lacks (Debian's fmt, OpenBLAS and its Fortran runtime); the CUDA
  # ones (cudart, cuBLASLt, NCCL) come from the image's toolkit and wheels.
  ldd "$stage"/bin/* | awk '/=> \// {print $3}' | sort -u | grep -E 'libfmt|libopenblas|libgfortran|libquadmath|libblas|liblapack' |
    while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  tar -C "$stage" -czf "$bin_archive" bin lib
  echo "packed $(du -h "$bin_archive" | cut -f1) into $bin_archive: carry '$carry_dir' (and build-gpu-deps for a device-side build)"
}

case "${1:-}" in
  --plan) plan; exit $? ;;
  --prepare) prepare; exit $? ;;
  "") ;;
  *) echo "usage: scripts/gpu_check.sh [--plan | --prepare]" >&2; exit 2 ;;
esac
[ "$budget" -le "$max_budget" ] || { echo "GPU_CHECK_BUDGET=${budget} exceeds ${max_budget} s"; exit 2; }

out=${OUT:-build-gpu/gpu_check/out}
work=build-gpu/gpu_check/work
rm -rf "$work" && mkdir -p "$out" "$work"
: > "$out/summary.txt"
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
left() { echo $((budget - $(elapsed))); }
limit_of() { local s; for s in "${stages[@]}"; do [ "$(field "$s" 0)" = "$1" ] && field "$s" 1; done; }
kind_of() { local s; for s in "${stages[@]}"; do [ "$(field "$s" 0)" = "$1" ] && field "$s" 2; done; }
report() {  # one result line, printed and kept, then the archive refreshed
  printf '%-11s %s\n' "$1" "$2" | tee -a "$out/summary.txt"
  tar -C "$work" -czf "$out/logs.tar.gz" . 2> /dev/null
}
declare -A result
# stage NAME FUNCTION: runs FUNCTION under the stage's limit (cut to what the budget leaves).
stage() {
  local name=$1 fn=$2 limit remaining rc t0
  limit=$(limit_of "$name")
  remaining=$(left)
  if [ "$(kind_of "$name")" = optional ] && [ "$limit" -gt "$remaining" ]; then
    result[$name]="skipped (needs ${limit} s, ${remaining} s left)"
  elif [ "$remaining" -lt 5 ]; then
    result[$name]="skipped (budget spent)"
  else
    [ "$limit" -gt "$remaining" ] && limit=$remaining
    t0=$(date +%s)
    export -f "$fn"
    timeout -k 5 "$limit" bash -c "$fn" > "$work/$name.log" 2>&1
    rc=$?
    local took=$(($(date +%s) - t0))
    if [ $rc -eq 0 ]; then result[$name]="ok (${took} s) $(tail -1 "$work/$name.log")"
    elif [ $rc -eq 77 ]; then result[$name]="SKIP $(tail -1 "$work/$name.log")"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then result[$name]="TIMEOUT after ${limit} s"
    else result[$name]="FAIL rc=$rc (${took} s): $(tail -1 "$work/$name.log")"
    fi
  fi
  report "$name" "${result[$name]}"
  [[ ${result[$name]} == ok* ]]
}
export work out bin_archive carry_dir
export NAX_COLLECTIVE_TIMEOUT_S=60
bin=build-gpu/bin
export bin

# --- stages, as functions run under timeout (they see only exported names) ---
run_preflight() {
  local missing=()
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || missing+=(nvidia-smi/GPU)
  command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ] || missing+=(nvcc)
  command -v cmake > /dev/null || missing+=(cmake)
  ldconfig -p | grep -q libcublasLt || ls /usr/local/cuda/lib64/libcublasLt.so* > /dev/null 2>&1 ||
    python3 -c 'import nvidia.cublas' 2> /dev/null || missing+=(cuBLASLt)
  ls /usr/include/nccl.h /usr/local/cuda/include/nccl.h > /dev/null 2>&1 ||
    python3 -c 'import nvidia.nccl, os, sys; sys.exit(not os.path.exists(nvidia.nccl.__path__[0] + "/include/nccl.h"))' 2> /dev/null ||
    missing+=(nccl.h)
  [ ${#missing[@]} -eq 0 ] || { echo "missing: ${missing[*]}"; return 1; }
  echo "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
}
run_build() {
  # Carried binaries first (scripts/gpu_check.sh --prepare); then build whatever does not run.
  if [ -f "$bin_archive" ]; then
    mkdir -p build-gpu/carried && tar -C build-gpu/carried -xzf "$bin_archive"
    mkdir -p "$bin" && cp -n build-gpu/carried/bin/* "$bin/" 2> /dev/null
  fi
  local missing=() t
  for t in test_cuda test_cuda_kernels test_cuda_attention test_cuda_gptj bench_cuda_gemm bench_cuda_attention bench_optimizer bench_train gptj; do
    [ -x "$bin/$t" ] && ! ldd "$bin/$t" | grep -q "not found" || missing+=("$t")
  done
  [ ${#missing[@]} -eq 0 ] && { echo "carried binaries run here"; return 0; }
  echo "building on the device: ${missing[*]}"
  rm -f "${missing[@]/#/$bin/}"
  local args=(-DCMAKE_BUILD_TYPE=Release -DNAX_WITH_CUDA=ON -DNAX_WITH_MPI=OFF -DNAX_BUILD_EXAMPLES=ON -DNAX_BUILD_BENCH=ON)
  [ -d build-gpu-deps ] && args+=(-DCMAKE_PREFIX_PATH="$PWD/build-gpu-deps")
  cmake -S . -B build-gpu -G Ninja "${args[@]}" && cmake --build build-gpu -j "$(nproc)" --target "${missing[@]}" &&
    echo "built ${#missing[@]} targets"
}
run_tests() {
  local t rc failed=0 skipped=0
  for t in test_cuda test_cuda_kernels test_cuda_attention test_cuda_gptj; do
    timeout 120 "$bin/$t"
    rc=$?
    echo "$t: rc=$rc"
    [ $rc -eq 77 ] && skipped=$((skipped + 1))
    [ $rc -ne 0 ] && [ $rc -ne 77 ] && failed=$((failed + 1))
  done
  [ $skipped -gt 0 ] && { echo "$skipped test binaries skipped (no GPU seen)"; return 77; }
  [ $failed -eq 0 ] && echo "4 cuda test binaries passed" || { echo "$failed of 4 cuda test binaries failed"; return 1; }
}
run_gemm() { "$bin/bench_cuda_gemm" --sizes 8192 --reps 20 --warmup 5 --json "$work/gemm.json"; }
run_attention() { "$bin/bench_cuda_attention"; }
run_train_1_3b() {
  "$bin/bench_train" --backend cuda --dtype bf16 --config 1.3b --meshes "dp=1,mp=1" --batch 8 --seq 2048 --steps 6 \
    --json "$work/train_1_3b.json"
}
run_train_350m() {
  "$bin/bench_train" --backend cuda --dtype bf16 --config 350m --meshes "dp=1,mp=1" --batch 8 --seq 2048 --steps 6 \
    --json "$work/train_350m.json"
}
run_optimizer() { "$bin/bench_optimizer" --backend cuda --elements 67108864 --json "$work/optimizer.json"; }
run_jax() {
  python3 -c 'import jax, sys; sys.exit(0 if jax.default_backend() == "gpu" else 77)' > /dev/null 2>&1 || { echo "no JAX with a GPU"; return 77; }
  local text="$work/corpus.txt"
  cat README.md src/*/*.cpp > "$text"
  # The export (about 1.6 GB) stays out of $OUT.
  "$bin/gptj" export --config 350m --mesh dp=1,mp=1 --data "$text" --steps 6 --batch 4 --seq 2048 --out build-gpu/gpu_check/export350m &&
    JAX_PLATFORMS=cuda python3 bench/jax_baseline.py --export build-gpu/gpu_check/export350m --json "$work/jax_350m.json" --quiet &&
    "$bin/bench_train" --backend cuda --dtype f32 --config 350m --meshes "dp=1,mp=1" --batch 4 --seq 2048 --steps 6 \
      --json "$work/nax_350m_f32.json"
}

echo "gpu_check: budget ${budget} s, results in $out (${out_files[*]})"
stage preflight run_preflight || { echo "preflight failed: nothing else can run"; exit 1; }
stage build run_build || echo "build incomplete: stages whose binaries are missing will fail"
stage tests run_tests
stage gemm run_gemm
stage attention run_attention
stage train_1_3b run_train_1_3b
stage train_350m run_train_350m
stage optimizer run_optimizer
stage jax run_jax

# One JSON with every stage's result and the benches' JSON.
python3 - "$work" "$out/results.json" "$out/summary.txt" << 'EOF'
import json, pathlib, sys
work, dest, summary = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
doc = {"stages": open(summary).read().splitlines()}
for f in sorted(work.glob("*.json")):
    try:
        doc[f.stem] = json.loads(f.read_text())
    except ValueError as e:
        doc[f.stem] = f"unreadable: {e}"
json.dump(doc, open(dest, "w"), indent=1)
EOF
report total "$(elapsed) s of ${budget} s"
[[ ${result[tests]} == ok* ]] && [[ ${result[gemm]} == ok* ]]
