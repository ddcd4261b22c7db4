#!/usr/bin/env bash
# The main job: installs what is missing, builds nax, trains the `small` GPT-J-style model on the
# text of Debian's fortunes package on a simulated dp=2,mp=2 mesh for a few minutes, prints the
# held-out loss and a sample, then compares the hand-coded model with the automatically sharded
# one (and JAX's jit/NamedSharding, installed from PyPI into .venv-jax/ unless JAX=0) on the same
# mesh, and draws the loss curves, the comparison and the per-step breakdown of each device's time
# (from the comparison's trace) into out/demo/plots/.
#   STEPS=300 MESH=dp=2,mp=2 COMPARE_STEPS=20 JAX=1 scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
missing=()
for p in fortunes python3-matplotlib; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=(); [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target gptj

corpus=()
for f in /usr/share/games/fortunes/*; do
  case "$f" in *.dat|*.u8) ;; *) [ -f "$f" ] && corpus+=("--data" "$f") ;; esac
done
out=out/demo
mkdir -p "$out"
mesh="${MESH:-dp=2,mp=2}"
rm -rf "$out/ckpt"  # a new run; gptj train refuses a folder holding another run's checkpoints
build/bin/gptj train --config small --mesh "$mesh" "${corpus[@]}" --steps "${STEPS:-300}" --batch 8 --seq 128 \
  --lr 2e-3 --warmup 30 --eval-every 100 --ckpt-dir "$out/ckpt" --metrics "$out/metrics.jsonl"
echo
echo "sample (mesh dp=1,mp=2, from the checkpoint trained on $mesh):"
build/bin/gptj sample --ckpt "$out/ckpt" --mesh dp=1,mp=2 --prompt "The meaning of life is" --tokens 200 --temperature 0.7

echo
jax=()
[ "${JAX:-1}" = "1" ] && jax=(--with-jax --install-jax)
build/bin/gptj compare --config small --mesh "$mesh" "${corpus[@]}" --steps "${COMPARE_STEPS:-20}" --batch 8 --seq 128 \
  --lr 2e-3 --warmup 30 --json "$out/compare.json" --trace "$out/compare_trace.json" "${jax[@]}"
/usr/bin/python3 scripts/plot.py --metrics "$out/metrics.jsonl" --label "train (hand, $mesh)" --compare "$out/compare.json" --out "$out/plots"
# Where each device's time goes per step, hand-coded vs automatic (open the trace in ui.perfetto.dev).
trace_files=("$out"/compare_trace.json)
[ -f "$out/compare_trace.json" ] || trace_files=("$out"/compare_trace.rank*.json)
/usr/bin/python3 scripts/trace_breakdown.py "${trace_files[@]}" --plot "$out/plots/breakdown.png" --fit
