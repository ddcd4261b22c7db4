#!/usr/bin/env bash
# Runs the tests under sanitizers: ASan+UBSan on every test but the install and Hugging Face ones
# (build-asan/), TSan on the runtime, communicator, error, gradient, nn, global-view, device, async and trace
# tests (build-tsan/). OpenBLAS runs one thread so that TSan sees only our own threads. The CUDA
# backend is left out (its code cannot run without a GPU; compute-sanitizer is its tool).
#   scripts/sanitize.sh [asan|tsan]   (both when no argument)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
which="${1:-all}"
export OPENBLAS_NUM_THREADS=1
if [ "$which" = all ] || [ "$which" = asan ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DNAX_SANITIZE=address,undefined -DNAX_BUILD_BENCH=OFF -DNAX_BUILD_EXAMPLES=ON -DNAX_WITH_CUDA=OFF
  cmake --build build-asan -j "$(nproc)"
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
    ctest --test-dir build-asan --output-on-failure -j "$(nproc)" -L "unit|mesh|grad|e2e" -E "^hf\."
fi
if [ "$which" = all ] || [ "$which" = tsan ]; then
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DNAX_SANITIZE=thread -DNAX_BUILD_BENCH=OFF -DNAX_BUILD_EXAMPLES=ON -DNAX_WITH_CUDA=OFF
  cmake --build build-tsan -j "$(nproc)" --target test_mesh test_errors test_grad test_nn test_global test_devices test_async test_trace
  for t in test_mesh test_errors test_grad test_nn test_global test_devices test_async test_trace; do
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 "build-tsan/bin/$t"
  done
fi
