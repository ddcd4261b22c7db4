#!/usr/bin/env bash
# Deterministic mode's promise (docs/determinism.md): the same training on every mesh gives the
# same bits. Trains CONFIG for STEPS steps with --deterministic on each mesh (hand sharding, auto
# sharding, and under mpirun when LAUNCH_MPI=1) and requires every step's loss and gradient norm,
# and the checkpoint's model and optimizer files, to be identical to the 1x1 run's, byte for byte;
# then gptj logits and sample --deterministic on that checkpoint give the same output on any mp.
#   tests/determinism/meshes.sh GPTJ CONFIG STEPS SHARDINGS [LAUNCHER...]
# Batch 8 of 24 tokens: a device's token count (48 on dp=4) is not a power of two, as in real runs.
# SHARDINGS: hand, auto or hand,auto. With a LAUNCHER (e.g. mpirun -np 4): each sharding also
# under it on the 4-device meshes, one process per device, against the threads' 1x1 run
# (DETERMINISM_LAUNCHED_MESHES: others).
set -euo pipefail
gptj=$1 config=$2 steps=$3
IFS=, read -r -a shardings <<< "$4"
shift 4
launcher=("$@")
read -r -a flags <<< "${DETERMINISM_FLAGS:-}"  # more gptj train flags for every run (e.g. --remat --zero)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus="$work/corpus.txt"
for i in $(seq 1 40); do echo "line $i: the quick brown fox jumps over the lazy dog, $((i * 7919 % 1000)) times."; done > "$corpus"
# the meshes, the first one the reference (DETERMINISM_MESHES: others, e.g. with fsdp)
read -r -a meshes <<< "${DETERMINISM_MESHES:-dp=1,mp=1 dp=1,mp=2 dp=2,mp=1 dp=2,mp=2 dp=1,mp=4 dp=4,mp=1}"

run() {  # name mesh sharding [launcher...]
  local name=$1 mesh=$2 sharding=$3
  shift 3
  "$@" "$gptj" train --config "$config" --mesh "$mesh" --sharding "$sharding" --data "$corpus" --steps "$steps" --batch 8 --seq 24 \
    --deterministic --quiet --metrics "$work/$name.jsonl" --ckpt-dir "$work/$name" --save-every "$steps" "${flags[@]}" > "$work/$name.log" 2>&1 ||
    { echo "FAILED: $name"; cat "$work/$name.log"; exit 1; }
  # the values each step printed, to the last digit (JSON writes doubles round-trip exact)
  grep -o '"grad_norm":[^,]*\|"loss":[^,]*\|"step":[^,]*' "$work/$name.jsonl" > "$work/$name.values"
}

same() {  # reference name
  local ref=$1 name=$2 f
  if ! cmp -s "$work/$ref.values" "$work/$name.values"; then
    echo "DIFFERENT losses or gradient norms: $name vs $ref"; paste "$work/$ref.values" "$work/$name.values" | head -20; exit 1
  fi
  for f in model.safetensors optimizer.safetensors; do
    local a b
    a=$(ls -d "$work/$ref"/step_* | tail -1)/$f b=$(ls -d "$work/$name"/step_* | tail -1)/$f
    cmp "$a" "$b" || { echo "DIFFERENT checkpoint bytes: $name vs $ref ($f)"; exit 1; }
  done
  echo "same bits: $name = $ref ($(wc -l < "$work/$name.values") values, checkpoint files identical)"
}

# Each sharding against its own 1x1 run: hand and auto are different programs (the automatic
# plan may sum in other places), each the same on every mesh.
for sharding in "${shardings[@]}"; do
  ref=""
  for mesh in "${meshes[@]}"; do
    name="$sharding-${mesh//[=,]/_}"
    run "$name" "$mesh" "$sharding"
    if [ -z "$ref" ]; then ref=$name; else same "$ref" "$name"; fi
  done
done
ref="${shardings[0]}-${meshes[0]//[=,]/_}"

# gptj logits and gptj sample --deterministic on the 1x1 run's checkpoint: the same text on any mp.
for mesh in dp=1,mp=1 dp=1,mp=2 dp=1,mp=4; do
  tag=${mesh//[=,]/_}
  "$gptj" logits --ckpt "$work/$ref" --prompt "the quick brown fox" --mesh "$mesh" --deterministic > "$work/logits-$tag.json"
  "$gptj" sample --ckpt "$work/$ref" --prompt "the quick" --tokens 16 --mesh "$mesh" --deterministic > "$work/sample-$tag.txt"
  if [ "$mesh" != dp=1,mp=1 ]; then
    cmp "$work/logits-dp_1_mp_1.json" "$work/logits-$tag.json" || { echo "DIFFERENT logits: $mesh vs dp=1,mp=1"; exit 1; }
    cmp "$work/sample-dp_1_mp_1.txt" "$work/sample-$tag.txt" || { echo "DIFFERENT samples: $mesh vs dp=1,mp=1"; exit 1; }
  fi
done
echo "same bits: gptj logits and gptj sample on mp=1, 2, 4"
if [ ${#launcher[@]} -gt 0 ]; then
  for sharding in "${shardings[@]}"; do
    read -r -a launched <<< "${DETERMINISM_LAUNCHED_MESHES:-dp=2,mp=2 dp=1,mp=4 dp=4,mp=1}"
    for mesh in "${launched[@]}"; do
      name="launched-$sharding-${mesh//[=,]/_}"
      run "$name" "$mesh" "$sharding" "${launcher[@]}"
      same "$sharding-dp_1_mp_1" "$name"
    done
  done
fi
