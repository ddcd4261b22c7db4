#!/usr/bin/env bash
# The main job: installs what is missing, builds nax, trains the `small` GPT-J-style model on the
# text of Debian's fortunes package on a simulated dp=2,mp=2 mesh for a few minutes, then prints
# the held-out loss and a sample.
#   STEPS=300 MESH=dp=2,mp=2 scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! dpkg-query -W -f='${Status}' fortunes 2>/dev/null | grep -q "install ok installed"; then
  sudo_cmd=(); [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends fortunes
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
build/bin/gptj train --config small --mesh "$mesh" "${corpus[@]}" --steps "${STEPS:-300}" --batch 8 --seq 128 \
  --lr 2e-3 --warmup 30 --eval-every 100 --ckpt-dir "$out/ckpt" --metrics "$out/metrics.jsonl"
echo
echo "sample (mesh dp=1,mp=2, from the checkpoint trained on $mesh):"
build/bin/gptj sample --ckpt "$out/ckpt" --mesh dp=1,mp=2 --prompt "The meaning of life is" --tokens 200 --temperature 0.7
