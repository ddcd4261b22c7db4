"""What the baselines (jax_baseline.py, torch_baseline.py) share about a `gptj export` run: the
flags every baseline takes, the learning rates (nax::nn::warmup_cosine, checked against the ones
export.json lists), the timed steps, the result row's file and the first-step loss check."""

import json
import math
import statistics
import sys
import time


def warmup_cosine(step, warmup, total, peak, final_ratio):
    """nax::nn::warmup_cosine: linear warmup to peak, cosine decay to peak * final_ratio at total."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if step >= total:
        return peak * final_ratio
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (final_ratio + (1 - final_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def add_export_args(p):
    """The flags of every baseline: the export, the steps, the result row, the first-loss check."""
    p.add_argument("--export", required=True, metavar="DIR", help="a folder written by `gptj export`")
    p.add_argument("--steps", type=int, help="training steps to run (default: all the export's batches)")
    p.add_argument("--json", metavar="FILE", help="write the result row (one JSON object) there")
    p.add_argument("--expect-loss", type=float, metavar="X", help="exit 3 unless the first-step loss is X to --loss-rtol")
    p.add_argument("--loss-rtol", type=float, default=1e-4, help="relative tolerance of --expect-loss (default 1e-4)")
    p.add_argument("--quiet", action="store_true", help="print only the summary")


def learning_rates(info, steps):
    """The first `steps` learning rates of the export's optimizer, as nax computes them."""
    opt = info["optimizer"]
    final_ratio = opt.get("final_lr_ratio", 0.1)
    lrs = [warmup_cosine(k, opt["warmup"], opt["total_steps"], opt["lr"], final_ratio) for k in range(steps)]
    for k, (ours, theirs) in enumerate(zip(lrs, info.get("lr_per_step", lrs))):
        if not math.isclose(ours, theirs, rel_tol=1e-12):
            raise ValueError(f"learning rate of step {k}: {ours} here, {theirs} in export.json")
    return lrs


def timed_steps(steps, tokens_per_step, lrs, run_step, say):
    """Runs run_step(k, lr) -> (loss, grad norm), returning once step k is done, for every step;
    returns the losses and the median tokens/s over the steps after the first (the first
    compiles or warms caches)."""
    losses, rates = [], []
    for k in range(steps):
        t = time.perf_counter()
        loss, norm = run_step(k, lrs[k])
        elapsed = time.perf_counter() - t
        losses.append(loss)
        if k > 0 or steps == 1:
            rates.append(tokens_per_step / elapsed)
        say(f"step {k + 1}/{steps} | loss {loss:.6f} | grad norm {norm:.4f} | lr {lrs[k]:.3e} | {tokens_per_step / elapsed:.0f} tok/s")
    return losses, statistics.median(rates)


def write_row(path, row):
    if path:
        with open(path, "w") as f:
            json.dump(row, f, indent=2)
            f.write("\n")


def check_first_loss(name, first, args, say):
    """0, or 3 (with a message) when --expect-loss is given and the first-step loss is not it."""
    if args.expect_loss is None:
        return 0
    rel = abs(first - args.expect_loss) / max(abs(args.expect_loss), 1e-30)
    if rel > args.loss_rtol:
        print(f"{name}: first-step loss {first:.8f} differs from the expected {args.expect_loss:.8f} "
              f"by {rel:.2e} relative (more than {args.loss_rtol:g})", file=sys.stderr)
        return 3
    say(f"first-step loss matches the expected {args.expect_loss:.8f} ({rel:.2e} relative)")
    return 0
