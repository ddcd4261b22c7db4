#!/usr/bin/env bash
# The test command: installs what is missing, builds nax (Release, into build/), runs every test.
#   scripts/test.sh [extra ctest arguments, e.g. -L mesh]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs" "$@"
