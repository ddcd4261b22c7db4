#!/usr/bin/env bash
# CTest gptj.jax_baseline: the JAX baseline (bench/jax_baseline.py) trains the run `gptj export`
# describes to the same first-step loss as `gptj train` (1e-4 relative), on the tiny config, on
# each mesh given (default dp=1,mp=1 dp=1,mp=2 dp=2,mp=2). Exits 77 (skipped) without a Python
# that has JAX (scripts/jax_baseline.sh --install makes one).
#   bench/check_jax_baseline.sh PATH/TO/gptj [MESH...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
gptj="$1"
shift
meshes=("$@")
[ ${#meshes[@]} -eq 0 ] && meshes=("dp=1,mp=1" "dp=1,mp=2" "dp=2,mp=2")

"$root/scripts/jax_baseline.sh" --check || exit $?
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
run=(--config tiny --steps 3 --batch 8 --seq 64 --seed 0 --data "$root/README.md")
for mesh in "${meshes[@]}"; do
  dir="$work/$mesh"
  "$gptj" export "${run[@]}" --mesh "$mesh" --out "$dir" >/dev/null
  "$gptj" train "${run[@]}" --mesh "$mesh" --quiet --eval-every 0 --metrics "$dir/nax.jsonl" >/dev/null
  first="$(grep -o '"loss":[^,}]*' "$dir/nax.jsonl" | head -n 1 | cut -d: -f2)"
  echo "mesh $mesh: gptj train first-step loss $first"
  "$root/scripts/jax_baseline.sh" --export "$dir" --mesh "$mesh" --expect-loss "$first" --json "$dir/jax.json" --quiet
done
