#!/usr/bin/env python3
"""Where each device's time goes, from nax traces (`gptj train|compare|sample --trace FILE`).

    scripts/trace_breakdown.py TRACE.json [TRACE.rank1.json ...] [--skip K] [--json OUT]
                               [--plot PNG] [--merge OUT] [--fit] [--fit-json OUT] [--check N]

Per device and per step (the "step" slices), the step's time splits into
  communication  time inside collective slices, less the waits inside them (data moving);
  waiting        "wait" slices: time a device spent waiting for its peers to arrive;
  compute        the rest of the step (ops, and the host work between them).
Steps carry the sharding they ran ("hand" or "auto": `gptj compare --trace` records both), and the
report puts the shardings side by side: the median over steps after the first K (default 1).

--merge OUT   writes the given files (one per rank under mpirun, same clock) as one trace.
--plot PNG    draws per device the median step as compute / communication / waiting, a panel per
              sharding (matplotlib; Debian's python3-matplotlib).
--fit         fits the alpha-beta model (include/nax/global/cost_model.h) to the measured collective
              slices (their transfer time, waits excluded): t = a_k(n) * alpha + b_k(n) * bytes / beta
              with the ring coefficients of each kind; prints alpha, beta, and the model's prediction
              against the measurement per kind, with the fitted and the default constants.
--fit-json OUT  writes the fitted link as a cost model (`gptj compare --cost-model OUT`).
--check N     exits 1 unless there are N device tracks, every collective ran on every device as
              often, every wait lies inside a collective, and every device has as many steps, with
              forward, backward and optimizer phases (the tests use it).

Exit status: 0 done, 1 a --check failed, 2 bad arguments or unreadable input.
"""

import argparse
import collections
import json
import math
import os
import statistics
import sys

HOST_TID = 1000  # tids from here on are host threads (nax/trace/trace.h)
REDUCE = {"psum", "pmean", "pmax", "pmin"}
KIND_OF = {"all_gather": "all_gather", "all_gather_invariant": "all_gather", "psum_scatter": "reduce_scatter",
           "ppermute": "permute", "all_to_all": "all_to_all"}
DEFAULT_LINK = (5e-6, 150e9)  # CostModel's default "intra" link: 5 us, 150 GB/s


def fail(message, code=2):
    print(f"trace_breakdown: {message}", file=sys.stderr)
    sys.exit(code)


def load(paths):
    events = []
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError, RecursionError) as e:
            fail(f"cannot read '{path}': {type(e).__name__}: {str(e)[:200]}")
        if not isinstance(data, dict) or "traceEvents" not in data:
            fail(f"'{path}' is not a trace-event JSON object (no traceEvents)")
        events.extend(data["traceEvents"])
    return events


def device_slices(events):
    """{(pid, tid): [slice, ...] sorted by start} for the device tracks."""
    tracks = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("tid", HOST_TID) < HOST_TID:
            tracks[(e["pid"], e["tid"])].append(e)
    for slices in tracks.values():
        slices.sort(key=lambda e: (e["ts"], -e["dur"]))
    return dict(sorted(tracks.items()))


def inside(inner, outer, eps=1e-3):
    return inner["ts"] >= outer["ts"] - eps and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + eps


def label(key):
    return f"device {key[1]}"


def step_breakdowns(tracks):
    """{sharding: {device key: [(compute, comm, wait, step) seconds per step]}}."""
    out = collections.defaultdict(lambda: collections.defaultdict(list))
    for key, slices in tracks.items():
        for step in (e for e in slices if e.get("cat") == "step"):
            within = [e for e in slices if e is not step and inside(e, step)]
            collective = sum(e["dur"] for e in within if e.get("cat") == "collective")
            wait = sum(e["dur"] for e in within if e.get("cat") == "wait")
            total = step["dur"]
            sharding = step.get("args", {}).get("sharding", "run")
            out[sharding][key].append(((total - collective) * 1e-6, (collective - wait) * 1e-6, wait * 1e-6, total * 1e-6))
    return out


def summarize(breakdowns, skip):
    rows = []
    for sharding, devices in breakdowns.items():
        for key, steps in devices.items():
            timed = steps[skip:] if len(steps) > skip else steps
            compute, comm, wait, total = (statistics.median(s[i] for s in timed) for i in range(4))
            rows.append({"sharding": sharding, "device": label(key), "pid": key[0], "tid": key[1], "steps": len(steps),
                         "step_ms": 1e3 * total, "compute_ms": 1e3 * compute, "comm_ms": 1e3 * comm, "wait_ms": 1e3 * wait,
                         "compute_share": compute / total if total > 0 else 0.0,
                         "comm_share": comm / total if total > 0 else 0.0,
                         "wait_share": wait / total if total > 0 else 0.0})
    return rows


def print_rows(rows, skip):
    print(f"per-step breakdown (median over steps after the first {skip}):")
    print(f"{'sharding':<8} {'device':<10} {'steps':>5} {'step ms':>9} {'compute':>14} {'communication':>16} {'waiting':>14}")
    for r in rows:
        print(f"{r['sharding']:<8} {r['device']:<10} {r['steps']:>5} {r['step_ms']:>9.2f} "
              f"{r['compute_ms']:>8.2f} {100 * r['compute_share']:>4.0f}% {r['comm_ms']:>10.2f} {100 * r['comm_share']:>4.0f}% "
              f"{r['wait_ms']:>8.2f} {100 * r['wait_share']:>4.0f}%")


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shardings = list(dict.fromkeys(r["sharding"] for r in rows))
    fig, axes = plt.subplots(1, len(shardings), figsize=(5 * len(shardings), 3.2), sharey=True, squeeze=False)
    top = max(r["step_ms"] for r in rows) * 1.05
    for ax, sharding in zip(axes[0], shardings):
        mine = [r for r in rows if r["sharding"] == sharding]
        names = [r["device"] for r in mine]
        left = [0.0] * len(mine)
        for part, color in (("compute", "tab:blue"), ("comm", "tab:orange"), ("wait", "tab:red")):
            widths = [r[f"{part}_ms"] for r in mine]
            ax.barh(names, widths, left=left, color=color,
                    label={"compute": "compute", "comm": "communication", "wait": "waiting for peers"}[part])
            left = [a + b for a, b in zip(left, widths)]
        ax.set_title(f"{sharding}: median step")
        ax.set_xlabel("ms per step")
        ax.set_xlim(0, top)
        ax.invert_yaxis()
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def kind_of(name):
    return "all_reduce" if name in REDUCE else KIND_OF.get(name)


def coefficients(kind, n):
    """(latency steps, wire fraction of the bytes): CostModel::seconds' ring formulas."""
    steps = n - 1
    return {"all_reduce": (2 * steps, 2 * steps / n), "all_gather": (steps, steps), "reduce_scatter": (steps, steps / n),
            "all_to_all": (steps, steps / n), "permute": (1, 1)}[kind]


def collective_samples(tracks):
    samples = []
    for slices in tracks.values():
        for c in (e for e in slices if e.get("cat") == "collective"):
            args = c.get("args", {})
            kind, n = kind_of(c["name"]), args.get("group_size", 1)
            if kind is None or n <= 1:
                continue
            nbytes = args.get("bytes", 0)
            if kind == "all_reduce" and str(args.get("operand", "")).startswith("bf16"):
                nbytes *= 2  # sums of bf16 travel as f32
            wait = sum(e["dur"] for e in slices if e.get("cat") == "wait" and inside(e, c))
            a, b = coefficients(kind, n)
            samples.append({"kind": kind, "n": n, "bytes": nbytes, "seconds": max(0.0, c["dur"] - wait) * 1e-6, "a": a, "b": b * nbytes})
    return samples


def points(samples):
    """One point per (kind, group size, bytes): the median time of its calls (robust to a thread
    descheduled in the middle of a collective)."""
    groups = collections.defaultdict(list)
    for s in samples:
        groups[(s["kind"], s["n"], s["bytes"])].append(s)
    return [dict(g[0], seconds=statistics.median(x["seconds"] for x in g), calls=len(g)) for g in groups.values()]


def fit(samples):
    """Least squares for t = a * alpha + b * (1 / beta) over the points; None when the sizes do not
    tell latency from bandwidth (then alpha alone is fitted, beta None)."""
    pts = points(samples)
    saa = sum(p["a"] ** 2 for p in pts)
    sab = sum(p["a"] * p["b"] for p in pts)
    sbb = sum(p["b"] ** 2 for p in pts)
    sat = sum(p["a"] * p["seconds"] for p in pts)
    sbt = sum(p["b"] * p["seconds"] for p in pts)
    det = saa * sbb - sab * sab
    alpha, inv_beta = sat / saa, 0.0
    if len(pts) >= 2 and det > 1e-9 * saa * sbb:
        alpha = (sat * sbb - sbt * sab) / det
        inv_beta = (saa * sbt - sab * sat) / det
        if alpha < 0:  # latency below resolution: bandwidth alone
            alpha, inv_beta = 0.0, sbt / sbb
        elif inv_beta < 0:  # bandwidth beyond resolution: latency alone
            alpha, inv_beta = sat / saa, 0.0
    mean = statistics.fmean(p["seconds"] for p in pts)
    ss_tot = sum((p["seconds"] - mean) ** 2 for p in pts)
    ss_res = sum((p["seconds"] - p["a"] * alpha - p["b"] * inv_beta) ** 2 for p in pts)
    return alpha, (1.0 / inv_beta if inv_beta > 0 else None), (1 - ss_res / ss_tot) if ss_tot > 0 else 1.0, len(pts)


def report_fit(samples, out_json):
    if not samples:
        print("no collectives over more than one device to fit")
        return None
    alpha, beta, r2, npoints = fit(samples)
    beta_text = f"{beta * 1e-9:.3f} GB/s" if beta else "not determined (too few distinct sizes)"
    print(f"\nalpha-beta fit over {len(samples)} collective slices, {npoints} sizes (median transfer time per size, waits "
          f"excluded): alpha {alpha * 1e6:.2f} us, beta {beta_text}, R^2 {r2:.3f}")
    print(f"{'kind':<15} {'n':>3} {'calls':>6} {'median KB':>10} {'measured us':>12} {'fitted us':>10} {'default us':>11}")
    groups = collections.defaultdict(list)
    for s in samples:
        groups[(s["kind"], s["n"])].append(s)
    for (kind, n), group in sorted(groups.items()):
        measured = statistics.median(s["seconds"] for s in group)
        nbytes = statistics.median(s["bytes"] for s in group)
        a, b = coefficients(kind, n)
        fitted = a * alpha + (b * nbytes / beta if beta else 0.0)
        default = a * DEFAULT_LINK[0] + b * nbytes / DEFAULT_LINK[1]
        print(f"{kind:<15} {n:>3} {len(group):>6} {nbytes / 1e3:>10.1f} {measured * 1e6:>12.1f} {fitted * 1e6:>10.1f} {default * 1e6:>11.1f}")
    if out_json and beta:
        model = {"links": {"measured": {"latency_us": alpha * 1e6, "bandwidth_GBps": beta * 1e-9}}, "default": "measured"}
        with open(out_json, "w") as f:
            json.dump(model, f, indent=2)
        print(f"wrote {out_json} (gptj compare --cost-model {out_json})")
    return {"alpha_s": alpha, "beta_Bps": beta, "r2": r2, "samples": len(samples), "sizes": npoints}


def check(tracks, devices):
    problems = []
    if len(tracks) != devices:
        problems.append(f"{len(tracks)} device tracks, expected {devices}")
    counts = collections.defaultdict(collections.Counter)  # (name, mesh axes, group size) -> per device
    for key, slices in tracks.items():
        collectives = [e for e in slices if e.get("cat") == "collective"]
        for c in collectives:
            args = c.get("args", {})
            counts[(c["name"], tuple(args.get("mesh_axes", [])), args.get("group_size"))][key] += 1
        for w in (e for e in slices if e.get("cat") == "wait"):
            if not any(inside(w, c) for c in collectives):
                problems.append(f"{label(key)}: a wait at {w['ts']} us lies outside every collective")
                break
        if not any(e.get("cat") == "wait" for e in slices):
            problems.append(f"{label(key)}: no wait slices")
    steps = {key: sum(1 for e in slices if e.get("cat") == "step") for key, slices in tracks.items()}
    if len(set(steps.values())) > 1:
        problems.append(f"steps per device differ: {dict((label(k), v) for k, v in steps.items())}")
    for key, slices in tracks.items():
        phases = {e["name"] for e in slices if e.get("cat") == "phase"}
        if steps[key] and not {"forward", "backward", "optimizer"} <= phases:
            problems.append(f"{label(key)}: phases {sorted(phases)}, expected forward, backward and optimizer")
    if not any(name == "psum" for name, _, _ in counts):
        problems.append("no psum in the trace")
    for (name, axes, n), per_device in counts.items():
        # Every device runs the same program: each collective appears equally often on all of them.
        if len(per_device) != len(tracks) or len(set(per_device.values())) != 1:
            problems.append(f"{name} over {axes}: calls per device {dict((label(k), v) for k, v in per_device.items())}")
    for p in problems:
        print(f"check: {p}", file=sys.stderr)
    if not problems:
        print(f"check: {len(tracks)} device tracks; every collective on every device "
              f"({sum(sum(c.values()) for c in counts.values())} slices); waits inside collectives")
    return not problems


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--skip", type=int, default=1, help="warm-up steps left out of the medians (default 1)")
    p.add_argument("--json")
    p.add_argument("--plot")
    p.add_argument("--merge")
    p.add_argument("--fit", action="store_true")
    p.add_argument("--fit-json")
    p.add_argument("--check", type=int, metavar="DEVICES")
    a = p.parse_args()
    if a.skip < 0:
        fail("--skip must be at least 0")
    events = load(a.traces)
    if a.merge:
        with open(a.merge, "w") as f:
            json.dump({"displayTimeUnit": "ms", "traceEvents": events}, f)
        print(f"merged {len(a.traces)} files into {a.merge}")
    tracks = device_slices(events)
    if not tracks:
        fail("no device tracks in the trace (was it written inside Runtime::run?)")
    ok = check(tracks, a.check) if a.check is not None else True
    breakdowns = step_breakdowns(tracks)
    rows = summarize(breakdowns, a.skip) if breakdowns else []
    if rows:
        print_rows(rows, a.skip)
    else:
        print("no step slices: no per-step breakdown (the trace has ops and collectives only)")
    fitted = report_fit(collective_samples(tracks), a.fit_json) if (a.fit or a.fit_json) else None
    if a.plot and rows:
        plot(rows, a.plot)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": rows, "fit": fitted}, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        code = main()
    except OSError as e:  # an output (--json, --plot, --merge, --fit-json) that cannot be written
        fail(f"cannot write '{e.filename}': {e.strerror}")
    sys.exit(code)
