#!/usr/bin/env bash
# Planned against measured peak memory per device: `gptj plan` next to bench_train's
# peak_device_bytes (device 0's allocator high-water mark over 2 steps, so that the AdamW moments
# exist during the second step's backward), for each case given, or the cases of docs/memory.md.
#
#   bench/memory_plan.sh [BUILD_DIR] ["CONFIG SEQ BATCH MESH [--remat] [--zero] [--dtype bf16]"]...
#
# A case of 125m at seq 1024 takes about a minute on 2 cores, 350m a few.
set -euo pipefail
build=${1:-build}
shift || true
cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
  cases=("125m 1024 1 dp=1,mp=1" "125m 1024 1 dp=1,mp=1 --remat" "350m 1024 1 dp=1,mp=1" "350m 1024 1 dp=1,mp=1 --remat")
fi
json=$(mktemp)
trap 'rm -f "$json"' EXIT
printf "%-44s %12s %12s %8s\n" "case" "planned GB" "measured GB" "error"
for c in "${cases[@]}"; do
  read -r config seq batch mesh flags <<<"$c"
  # shellcheck disable=SC2086
  planned=$("$build/bin/gptj" plan --config "$config" --seq "$seq" --batch "$batch" --mesh "$mesh" ${flags:-} | awk '$1 == "peak" && $2 != "in" {print ($3 == "MB" ? $2 / 1000 : $2)}')
  # shellcheck disable=SC2086
  "$build/bin/bench_train" --config "$config" --seq "$seq" --batch "$batch" --meshes "$mesh" --steps 2 ${flags:-} --json "$json" >/dev/null
  measured=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))[0]['peak_device_bytes'] / 1e9)" "$json")
  python3 -c "import sys; c, p, m = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]); print(f'{c:<44} {p:12.4f} {m:12.4f} {100 * (p - m) / m:+7.1f}%')" \
    "$c" "$planned" "$measured"
done
