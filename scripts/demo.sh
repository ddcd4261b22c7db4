#!/usr/bin/env bash
# The main job: installs what is missing, builds nax, and runs the collectives tour on a simulated
# dp=2,mp=2 mesh (the GPT-J training example takes this place once it exists).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target collectives_tour
build/bin/collectives_tour --mesh "${MESH:-dp=2,mp=2}"
