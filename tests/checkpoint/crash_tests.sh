#!/usr/bin/env bash
# Checkpoints under crashes, a full disk and two writers (docs/checkpoints.md), on the tiny GPT-J:
#   crash_tests.sh GPTJ WORK kill|disk_full|two_writers
# kill: a trainer saving every step is killed (SIGKILL) at many points inside its saves
#   (NAX_CHECKPOINT_KILL_AT) and at random times; each time the newest committed checkpoint
#   verifies and loads, and resuming from it ends with weights and optimizer state bit-identical
#   to an uninterrupted run's.
# disk_full: a save that hits a file size limit (RLIMIT_FSIZE, ulimit -f) fails with the file
#   named, leaves the committed checkpoints as they were and no temporary, and the run resumes.
# two_writers: a second trainer on a run folder in use is refused, naming the first one's pid.
set -uo pipefail
gptj=$1 work=$2 what=$3
rm -rf "$work" && mkdir -p "$work"
for i in $(seq 1 200); do echo "line $i: the quick brown fox jumps over the lazy dog"; done > "$work/corpus.txt"
steps=6
args=(--config tiny --mesh dp=1,mp=2 --data "$work/corpus.txt" --steps $steps --batch 4 --seq 16 --eval-every 0 --save-every 1 --quiet)
fail() { echo "FAIL: $*" >&2; exit 1; }

reference() {
  "$gptj" train "${args[@]}" --ckpt-dir "$work/ref" > /dev/null || fail "the reference run failed"
}

# Same final state as the reference: model and optimizer files byte for byte.
same_as_reference() {
  local final
  final=$(printf "step_%06d" $steps)
  for f in model.safetensors optimizer.safetensors trainer.json; do
    cmp -s "$work/ref/$final/$f" "$1/$final/$f" || fail "$1/$final/$f differs from the uninterrupted run's ($2)"
  done
}

# After a crash: the newest committed step loads (sample verifies it against its manifest), then
# the run resumes to the end (or starts afresh when nothing was committed).
recover() {
  local run=$1 label=$2 final
  final=$(printf "step_%06d" $steps)
  if [ -d "$run/$final" ]; then
    # The kill came after the last save was committed: nothing is left to resume.
    "$gptj" train "${args[@]}" --ckpt-dir "$run" --resume > /dev/null 2> "$work/resume.err" &&
      fail "resuming a finished run succeeded ($label)"
    grep -q "nothing left to run" "$work/resume.err" || { cat "$work/resume.err" >&2; fail "resuming a finished run: unexpected error ($label)"; }
  elif ls "$run" | grep -qE '^step_[0-9]+$'; then
    "$gptj" sample --ckpt "$run" --mesh dp=1,mp=1 --prompt "line" --tokens 2 --temperature 0 > /dev/null ||
      fail "the newest committed checkpoint of $run does not load ($label)"
    "$gptj" train "${args[@]}" --ckpt-dir "$run" --resume > /dev/null 2> "$work/resume.err" ||
      { cat "$work/resume.err" >&2; fail "resume failed ($label)"; }
  else
    "$gptj" train "${args[@]}" --ckpt-dir "$run" > /dev/null 2> "$work/resume.err" ||
      { cat "$work/resume.err" >&2; fail "a fresh run over the leftovers failed ($label)"; }
  fi
  ls "$run" | grep -q '\.tmp\.' && fail "temporaries left in $run after the recovery ($label)"
  same_as_reference "$run" "$label"
}

case "$what" in
  kill)
    reference
    killed=0
    # Points inside the saves: every tensor written, every file flushed and renamed, every step
    # folder renamed (a save of tiny has about 90; 6 saves).
    for point in 1 2 5 9 17 26 38 51 64 77 88 97 150 181 230 270 383 470; do
      run="$work/kill_$point"
      NAX_CHECKPOINT_KILL_AT=$point "$gptj" train "${args[@]}" --ckpt-dir "$run" > /dev/null 2>&1
      rc=$?
      [ $rc -eq 0 ] && continue  # the point lies past the run's last save
      [ $rc -eq 137 ] || fail "kill point $point: exit $rc, not a SIGKILL"
      killed=$((killed + 1))
      recover "$run" "kill point $point"
      rm -rf "$run"
    done
    # At random times (the OS's choice of instruction, not ours).
    for i in 1 2 3 4; do
      run="$work/random_$i"
      "$gptj" train "${args[@]}" --ckpt-dir "$run" > /dev/null 2>&1 &
      pid=$!
      sleep "0.$((RANDOM % 9 + 1))"
      kill -9 $pid 2> /dev/null
      wait $pid 2> /dev/null
      # A run that had already finished (a fast machine) is not counted as killed.
      [ $? -eq 137 ] && killed=$((killed + 1))
      recover "$run" "random kill $i"
      rm -rf "$run"
    done
    [ $killed -ge 18 ] || fail "only $killed runs were killed (18 kill points lie inside the saves)"
    echo "kill test: $killed kills, each resumed bit-exactly"
    ;;
  disk_full)
    reference
    run="$work/full"
    "$gptj" train "${args[@]}" --ckpt-dir "$run" --stop-after 2 > /dev/null || fail "the first part failed"
    # 300 kB: the model file (about 170 kB) fits, the optimizer's (about 340 kB) does not.
    (ulimit -f 300 && "$gptj" train "${args[@]}" --ckpt-dir "$run" --resume > /dev/null 2> "$work/full.err")
    rc=$?
    [ $rc -ne 0 ] || fail "the save under a 300 kB file size limit succeeded"
    grep -q "optimizer.safetensors" "$work/full.err" && grep -qi "too large" "$work/full.err" ||
      { cat "$work/full.err" >&2; fail "the error does not name the file and the cause"; }
    [ "$(ls "$run" | grep -c '^step_[0-9]*$')" -eq 2 ] || fail "the committed steps changed: $(ls "$run")"
    ls "$run" | grep -q '\.tmp\.' && fail "temporaries left: $(ls "$run")"
    recover "$run" "disk full"
    echo "disk-full test: refused with '$(cat "$work/full.err")'; resumed bit-exactly"
    ;;
  two_writers)
    run="$work/shared"
    "$gptj" train "${args[@]}" --steps 100000 --save-every 0 --ckpt-dir "$run" > /dev/null 2>&1 &
    first=$!
    for _ in $(seq 1 200); do [ "$(cat "$run/.lock" 2> /dev/null)" = "$first" ] && break; sleep 0.05; done
    [ "$(cat "$run/.lock" 2> /dev/null)" = "$first" ] || { kill -9 $first; fail "the first writer never took the lock"; }
    for extra in "" "--resume"; do
      "$gptj" train "${args[@]}" --ckpt-dir "$run" $extra > /dev/null 2> "$work/second.err"
      rc=$?
      [ $rc -ne 0 ] || { kill -9 $first; fail "a second writer ($extra) was let in"; }
      grep -q "in use by another writer (pid $first)" "$work/second.err" || { kill -9 $first; cat "$work/second.err" >&2; fail "the refusal does not name pid $first"; }
    done
    kill -9 $first; wait $first 2> /dev/null
    echo "two-writer test: refused with '$(cat "$work/second.err")'"
    ;;
  *) fail "unknown test '$what'" ;;
esac
rm -rf "$work"
