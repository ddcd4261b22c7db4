#!/usr/bin/env bash
# A traced GPT-J run checked end to end: `gptj train|compare --trace` on the mesh given, then
# scripts/trace_breakdown.py --check (device tracks, every collective on every device, waits inside
# collectives, phases) and its breakdown and alpha-beta fit; under mpirun the per-rank files are
# merged first, and each rank's file says its clock offset to process 0 (none applied on one host,
# where the processes share a clock; the measured estimate under 1 ms). For compare, the progress
# written to a file has no line over 300 characters.
#   check_gptj_trace.sh PYTHON SOURCE_DIR OUT_DIR DEVICES train|compare MESH [LAUNCHER...] -- GPTJ
set -euo pipefail
python=$1 source=$2 out=$3 devices=$4 command=$5 mesh=$6
shift 6
launcher=()
while [ "$1" != "--" ]; do launcher+=("$1"); shift; done
gptj=$2
rm -rf "$out" && mkdir -p "$out"
args=(--config tiny --mesh "$mesh" --data "$source/CMakeLists.txt" --steps 3 --batch 4 --seq 16 --trace "$out/run.json")
[ "$command" = train ] && args+=(--eval-every 0)
"${launcher[@]}" "$gptj" "$command" "${args[@]}" >"$out/log.txt" 2>&1 || { cat "$out/log.txt"; exit 1; }
files=()
for f in "$out"/run.json "$out"/run.rank*.json; do [ -f "$f" ] && files+=("$f"); done
[ ${#files[@]} -gt 0 ] || { echo "no trace written"; cat "$out/log.txt"; exit 1; }
echo "trace files: ${files[*]}"
"$python" "$source/scripts/trace_breakdown.py" "${files[@]}" --merge "$out/merged.json" --check "$devices" --fit --json "$out/breakdown.json"
"$python" - "$out" "$devices" "$command" "${files[@]}" <<'PY'
import json, sys
out, devices, command = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for path in sys.argv[4:]:
    names = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "M" and e["name"] == "process_name"]
    assert len(names) == 1, f"{path}: {len(names)} process_name records"
    args = names[0]["args"]
    assert args["clock_offset_us"] == 0, f"{path}: a clock offset applied on one host: {args}"
    assert abs(args["measured_clock_offset_us"]) < 1000, f"{path}: measured clock offset {args['measured_clock_offset_us']} us on one host"
merged = json.load(open(f"{out}/merged.json"))["traceEvents"]
rows = json.load(open(f"{out}/breakdown.json"))["steps"]
shardings = {r["sharding"] for r in rows}
want = {"hand", "auto"} if command == "compare" else {"hand"}
assert shardings == want, f"breakdown shardings {shardings}, expected {want}"
assert len(rows) == devices * len(want), rows
for r in rows:
    total = r["compute_ms"] + r["comm_ms"] + r["wait_ms"]
    assert abs(total - r["step_ms"]) <= 1e-6 * max(1.0, r["step_ms"]), r
    assert min(r["compute_ms"], r["comm_ms"], r["wait_ms"]) >= 0, r
log = open(f"{out}/log.txt").read().splitlines()
longest = max(len(line) for line in log)
assert longest <= 300, f"a progress line of {longest} characters"
assert not any("\r" in line for line in log), "a terminal's live line in a log file"
print(f"ok: {len(merged)} events, shardings {sorted(shardings)}, longest log line {longest}")
PY
