#!/usr/bin/env python3
"""Plots of nax training runs and of sharding comparisons (matplotlib, headless).

    scripts/plot.py --metrics RUN.jsonl [--metrics RUN2.jsonl ...] [--label NAME ...]
                    [--compare compare.json] --out DIR

--metrics  the JSON lines `gptj train --metrics` writes: lines with "step" and "loss" (one per
           step) and lines with "step" and "heldout_loss" (every --eval-every steps). Draws every
           run's training loss, and its held-out losses as points, into DIR/loss.png.
--label    a name per --metrics file, in the same order (default: the file's name, or its folder's
           when the file is called metrics.jsonl).
--compare  a JSON list of rows (or {"rows": [...]}), one per sharding: "sharding" ("hand", "auto",
           "jax"), "tokens_per_s", "bytes_per_step" (bytes per step per device),
           "bytes_per_step_by_axes" ({mesh-axis group: bytes}, null for jax),
           "collectives_per_step", "peak_bytes", "final_loss", "losses" (one per step), and
           optionally "mesh" and "config". Draws tokens/s and the bytes communicated per step by
           mesh axis group into DIR/compare.png and the rows' loss curves into DIR/compare_loss.png.

Runs with Debian's python3 and python3-matplotlib (apt-get install python3-matplotlib).
Exit status: 0 done, 2 bad arguments, unreadable input or an unwritable output.
"""

import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

SHARDING_COLORS = {"hand": "tab:blue", "auto": "tab:orange", "jax": "tab:green"}
AXIS_COLORS = ["tab:purple", "tab:cyan", "tab:olive", "tab:brown", "tab:pink", "tab:gray", "tab:red"]


def fail(message):
    print(f"plot: {message}", file=sys.stderr)
    sys.exit(2)


def save(fig, path):
    try:
        fig.savefig(path, dpi=120)
    except OSError as e:
        fail(f"cannot write {path}: {e.strerror}")
    finally:
        plt.close(fig)


def read_metrics(path):
    """(train, heldout): {step: loss} of a metrics file; later lines win (a resumed run appends)."""
    train, heldout = {}, {}
    try:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError) as e:  # RecursionError: nested too deep for a metrics line
                    fail(f"{path}:{number}: not a metrics line ({type(e).__name__}: {str(e)[:200]})")
                if not isinstance(row, dict) or "step" not in row:
                    continue
                try:
                    if row.get("loss") is not None:
                        train[int(row["step"])] = float(row["loss"])
                    if row.get("heldout_loss") is not None:
                        heldout[int(row["step"])] = float(row["heldout_loss"])
                except (TypeError, ValueError, OverflowError) as e:
                    fail(f"{path}:{number}: \"step\", \"loss\" or \"heldout_loss\" is not a number ({e})")
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    if not train and not heldout:
        fail(f"{path} has no lines with \"step\" and \"loss\" or \"heldout_loss\"")
    return train, heldout


def default_label(path):
    name = os.path.basename(path)
    stem = name[: -len(".jsonl")] if name.endswith(".jsonl") else name
    if stem == "metrics":
        parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
        return parent or stem
    return stem


def plot_loss(runs, path):
    """runs: [(label, train {step: loss}, heldout {step: loss})]. Steps are drawn 1-based, as the
    trainer's progress line counts them (a held-out loss is measured after its step's update)."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (label, train, heldout) in enumerate(runs):
        color = f"C{i % 10}"
        if train:
            steps = sorted(train)
            ax.plot([s + 1 for s in steps], [train[s] for s in steps], color=color, linewidth=1.5, label=f"{label}: train")
        if heldout:
            steps = sorted(heldout)
            ax.plot([s + 1 for s in steps], [heldout[s] for s in steps], color=color, linestyle="--", marker="o", markersize=5,
                    label=f"{label}: held-out")
    ax.set_xlabel("optimizer step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("cross-entropy loss (nats per token)")
    ax.set_title("Training loss" + (" (dashed: held-out)" if any(h for _, _, h in runs) else ""))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path)


def read_compare(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    except (ValueError, RecursionError) as e:
        fail(f"{path} is not a comparison's JSON ({type(e).__name__}: {str(e)[:200]})")
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and "sharding" in r for r in rows):
        fail(f"{path}: expected a non-empty list of rows, each with a \"sharding\"")
    return rows


def number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def row_labels(rows):
    """'hand', or 'hand\\ndp=2,mp=2' when the rows span several meshes or configs."""
    meshes = {r.get("mesh") for r in rows}
    configs = {r.get("config") for r in rows}
    labels = []
    for r in rows:
        extra = []
        if len(configs) > 1 and r.get("config"):
            extra.append(str(r["config"]))
        if len(meshes) > 1 and r.get("mesh"):
            extra.append(str(r["mesh"]))
        labels.append("\n".join([str(r["sharding"])] + extra))
    return labels


def human_bytes(b):
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


def plot_compare(rows, path):
    labels = row_labels(rows)
    colors = [SHARDING_COLORS.get(r["sharding"], "tab:gray") for r in rows]
    positions = list(range(len(rows)))
    subtitle = ", ".join(sorted({f"{r.get('config', '?')} on {r.get('mesh', '?')}" for r in rows}))
    fig, (speed, comm) = plt.subplots(1, 2, figsize=(12, 5))

    # Throughput.
    rates = [r.get("tokens_per_s") if number(r.get("tokens_per_s")) else 0 for r in rows]
    bars = speed.bar(positions, rates, color=colors)
    for bar, r in zip(bars, rows):
        value = r.get("tokens_per_s")
        speed.annotate(f"{value:,.0f}" if number(value) else "n/a", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                       ha="center", va="bottom", fontsize=9, xytext=(0, 2), textcoords="offset points")
    speed.set_xticks(positions, labels)
    speed.set_ylabel("tokens / s (median step, higher is better)")
    speed.set_title("Training throughput")
    speed.grid(True, axis="y", alpha=0.3)
    speed.margins(y=0.12)

    # Bytes communicated per step and device, stacked by mesh axis group.
    groups = sorted({g for r in rows for g in (r.get("bytes_per_step_by_axes") or {})})
    bottoms = [0.0] * len(rows)
    for i, group in enumerate(groups):
        heights = [float((r.get("bytes_per_step_by_axes") or {}).get(group) or 0) / 1e6 for r in rows]
        comm.bar(positions, heights, bottom=bottoms, color=AXIS_COLORS[i % len(AXIS_COLORS)], label=f"over {group}")
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for i, r in enumerate(rows):
        by_axes = r.get("bytes_per_step_by_axes")
        total = r.get("bytes_per_step")
        if not by_axes and number(total) and total > 0:  # a total without its split: one grey bar
            comm.bar([i], [total / 1e6], bottom=[bottoms[i]], color="lightgray", hatch="//", label="total (not split by axis)")
            bottoms[i] += total / 1e6
        if not by_axes and not number(total):
            text = "not measured"
        else:
            shown = total if number(total) else bottoms[i] * 1e6
            text = human_bytes(shown)
            if number(r.get("collectives_per_step")):
                text += f"\n{r['collectives_per_step']:.0f} collectives"
        comm.annotate(text, (i, bottoms[i]), ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    comm.set_xticks(positions, labels)
    comm.set_ylabel("MB sent per step per device")
    comm.set_title("Communication per step, by mesh axis group")
    comm.grid(True, axis="y", alpha=0.3)
    comm.margins(y=0.18)
    handles, names = comm.get_legend_handles_labels()
    unique = dict(zip(names, handles))
    if unique:
        comm.legend(unique.values(), unique.keys(), fontsize=8, loc="upper right")

    fig.suptitle(f"Sharding comparison: {subtitle}")
    fig.tight_layout()
    save(fig, path)


def plot_compare_losses(rows, path):
    """The rows' loss curves and, below, each curve's difference from the first row's."""
    labels = [label.replace("\n", " ") for label in row_labels(rows)]
    curves = [(r, label, r.get("losses") or []) for r, label in zip(rows, labels)]
    curves = [(r, label, losses) for r, label, losses in curves if losses]
    fig, (ax, diff) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    styles = {"hand": "-", "auto": "--", "jax": ":"}
    # Colour and line style tell the sharding, the marker the (config, mesh) when there are several.
    groups = list(dict.fromkeys((r.get("config"), r.get("mesh")) for r in rows))
    markers = {g: "osD^vP*X"[i % 8] for i, g in enumerate(groups)}

    def marker(r, n):
        return markers[(r.get("config"), r.get("mesh"))] if n <= 40 else None

    for r, label, losses in curves:
        ax.plot(range(1, len(losses) + 1), losses, styles.get(r["sharding"], "-."), color=SHARDING_COLORS.get(r["sharding"]),
                linewidth=1.8, marker=marker(r, len(losses)), markersize=4, label=label)
    ax.set_ylabel("cross-entropy loss (nats per token)")
    ax.set_title("Training loss per sharding (same init and data: the curves should coincide)")
    ax.grid(True, alpha=0.3)
    if curves:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no losses in the compare rows", ha="center", va="center", transform=ax.transAxes)
    if len(curves) >= 2:
        _, reference_label, reference = curves[0]
        for r, label, losses in curves[1:]:
            n = min(len(losses), len(reference))
            diff.plot(range(1, n + 1), [losses[i] - reference[i] for i in range(n)], styles.get(r["sharding"], "-."),
                      color=SHARDING_COLORS.get(r["sharding"]), marker=marker(r, n), markersize=4, label=label)
        diff.axhline(0, color="black", linewidth=0.8)
        diff.set_ylabel(f"loss minus {reference_label}'s")
        diff.legend(fontsize=8)
    else:
        diff.text(0.5, 0.5, "one curve: nothing to compare", ha="center", va="center", transform=diff.transAxes)
    diff.set_xlabel("optimizer step")
    diff.grid(True, alpha=0.3)
    diff.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    save(fig, path)


def main(argv):
    p = argparse.ArgumentParser(description="Plots of nax training metrics and sharding comparisons.")
    p.add_argument("--metrics", action="append", default=[], metavar="RUN.jsonl", help="a trainer metrics file (repeatable)")
    p.add_argument("--label", action="append", default=[], metavar="NAME", help="a name per --metrics, in order")
    p.add_argument("--compare", metavar="FILE", help="a compare JSON (list of rows)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for loss.png, compare.png, compare_loss.png")
    args = p.parse_args(argv)
    if not args.metrics and not args.compare:
        fail("nothing to plot: give --metrics and/or --compare")
    if len(args.label) > len(args.metrics):
        fail(f"{len(args.label)} --label for {len(args.metrics)} --metrics")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        fail(f"--out: cannot create {args.out}: {e.strerror}")
    written = []
    if args.metrics:
        runs = []
        for i, path in enumerate(args.metrics):
            train, heldout = read_metrics(path)
            runs.append((args.label[i] if i < len(args.label) else default_label(path), train, heldout))
        plot_loss(runs, os.path.join(args.out, "loss.png"))
        written.append("loss.png")
    if args.compare:
        rows = read_compare(args.compare)
        plot_compare(rows, os.path.join(args.out, "compare.png"))
        plot_compare_losses(rows, os.path.join(args.out, "compare_loss.png"))
        written += ["compare.png", "compare_loss.png"]
    print(f"plot: wrote {', '.join(os.path.join(args.out, w) for w in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
