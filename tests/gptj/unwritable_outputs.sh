#!/usr/bin/env bash
# Every command with every output it writes made unwritable, three ways: a path under a regular
# file (no folder can be made there, even by root), a link to /dev/full (the open succeeds, the
# writes fail) and, for files, an existing folder. Each run must exit non-zero with an "error:"
# line naming the path; no run may print "error:" and exit 0. Standard output to /dev/full too.
#
# usage: unwritable_outputs.sh GPTJ REPO SCRATCH [PYTHON]
set -u
gptj=$1 repo=$2 scratch=$3 python=${4:-}
rm -rf "$scratch" && mkdir -p "$scratch" || exit 1
cd "$scratch" || exit 1
data=$repo/README.md
tokenizer=$repo/tests/fixtures/tokenizer/tokenizer.json
hf=$repo/tests/fixtures/hf_gptj
tiny=(--config tiny --mesh dp=1,mp=1 --batch 2 --seq 8 --data "$data")
echo "a file" > blocker
mkdir -p folder/inside && ln -s /dev/full full
runs=0 failures=0

# expect_refused NAME PATH COMMAND...: non-zero exit, an error line naming PATH, no "error:" with exit 0.
expect_refused() {
  local name=$1 path=$2
  shift 2
  runs=$((runs + 1))
  "$@" > out.txt 2> err.txt
  local code=$?
  if [ $code -eq 0 ] || ! grep -q "error:.*$(basename "$path")" err.txt; then
    echo "FAIL $name: exit $code, stderr: $(tail -c 400 err.txt)"
    failures=$((failures + 1))
  fi
}

for how in under_file dev_full folder; do
  case $how in
    under_file) file() { echo "$scratch/blocker/$1"; } ;;
    dev_full) file() { rm -f "$scratch/g_$1"; ln -s /dev/full "$scratch/g_$1"; echo "$scratch/g_$1"; } ;;
    folder) file() { mkdir -p "$scratch/d_$1/x"; echo "$scratch/d_$1"; } ;;
  esac
  p=$(file t.json); expect_refused "$how.train --trace" "$p" "$gptj" train "${tiny[@]}" --steps 1 --quiet --trace "$p"
  p=$(file m.jsonl); expect_refused "$how.train --metrics" "$p" "$gptj" train "${tiny[@]}" --steps 1 --quiet --metrics "$p"
  p=$(file s.json); expect_refused "$how.sample --trace" "$p" "$gptj" sample --ckpt "$hf" --tokens 2 --trace "$p"
  p=$(file ct.json); expect_refused "$how.compare --trace" "$p" "$gptj" compare "${tiny[@]}" --steps 2 --warmup-steps 1 --quiet --trace "$p"
  p=$(file c.json); expect_refused "$how.compare --json" "$p" "$gptj" compare "${tiny[@]}" --steps 2 --warmup-steps 1 --quiet --json "$p"
  p=$(file x.tokens); expect_refused "$how.tokenize --out" "$p" "$gptj" tokenize --tokenizer "$tokenizer" --data "$data" --out "$p" --quiet
  if [ $how != folder ]; then  # these write folders: an existing folder is theirs to fill (or refuse when not empty, below)
    p=$(file cv); expect_refused "$how.convert --out" "$p" "$gptj" convert --ckpt "$hf" --out "$p"
    p=$(file ex); expect_refused "$how.export --out" "$p" "$gptj" export "${tiny[@]}" --steps 1 --out "$p"
    p=$(file ck); expect_refused "$how.train --ckpt-dir" "$p" "$gptj" train "${tiny[@]}" --steps 1 --quiet --ckpt-dir "$p"
    p=$(file tc); expect_refused "$how.train --token-cache" "$p" "$gptj" train "${tiny[@]}" --steps 1 --quiet --tokenizer "$tokenizer" --token-cache "$p"
  fi
done
expect_refused "convert into a folder in use" folder "$gptj" convert --ckpt "$hf" --out "$scratch/folder"

# The printed results themselves: standard output that cannot be written.
for command in "tokenize --tokenizer $tokenizer --text hello" "logits --ckpt $hf --prompt hi" "sample --ckpt $hf --tokens 2" \
               "plan --config tiny"; do
  runs=$((runs + 1))
  # shellcheck disable=SC2086
  "$gptj" $command > /dev/full 2> err.txt
  code=$?
  if [ $code -eq 0 ] || ! grep -q "error:.*standard output" err.txt; then
    echo "FAIL gptj $command > /dev/full: exit $code, stderr: $(tail -c 300 err.txt)"
    failures=$((failures + 1))
  fi
done

# The scripts that read what gptj writes and write plots and JSON (where matplotlib is installed).
if [ -n "$python" ] && "$python" -c "import matplotlib" 2> /dev/null; then
  "$gptj" train "${tiny[@]}" --steps 2 --quiet --eval-every 1 --metrics metrics.jsonl --trace trace.json > /dev/null 2>&1
  for p in "$scratch/blocker/plots" "$scratch/full"; do
    runs=$((runs + 1))
    if "$python" "$repo/scripts/plot.py" --metrics metrics.jsonl --out "$p" > /dev/null 2> err.txt || ! grep -q "plot:" err.txt; then
      echo "FAIL plot.py --out $p: $(tail -c 300 err.txt)"
      failures=$((failures + 1))
    fi
  done
  for flag in --json --plot; do
    runs=$((runs + 1))
    if "$python" "$repo/scripts/trace_breakdown.py" trace.json "$flag" "$scratch/blocker/x" > /dev/null 2> err.txt; then
      echo "FAIL trace_breakdown.py $flag under a file: exit 0"
      failures=$((failures + 1))
    fi
  done
else
  echo "(scripts/plot.py and trace_breakdown.py skipped: no python3 with matplotlib)"
fi

echo "unwritable outputs: $runs runs, $failures failed"
[ $failures -eq 0 ]
