#!/usr/bin/env python3
"""PyTorch eager on the run `gptj export` describes: the other baseline nax is compared with.

Hugging Face's GPTJForCausalLM is loaded from the export folder (config.json, model.safetensors:
the same initial parameters as nax's `gptj train`) and trained on the same batches
(batches.safetensors) with the same optimizer (export.json): next-token cross-entropy on the
export's targets, global-norm clipping, AdamW with decoupled weight decay on parameters of rank
>= 2 only, warmup + cosine learning rate. On one process (no mesh): --threads sets PyTorch's
intra-op threads, as nax's simulated devices each run one BLAS thread.

--dtype bf16 runs the forward under torch.autocast("cpu", dtype=torch.bfloat16) (bf16 matmuls on
the processor's bf16 instructions, f32 master weights and optimizer), the mixed precision that
nax's `--dtype bf16` is compared with.

Usage:
    scripts/torch_baseline.sh [--install] --export DIR [--dtype f32|bf16] [--threads N] [--steps K]
                              [--json FILE] [--expect-loss X] [--quiet]
Exit status: 0 done, 2 bad arguments or export, 3 the first-step loss differs from --expect-loss
by more than --loss-rtol (1e-4) relative.
"""

import argparse
import json
import os
import sys

from baseline_common import add_export_args, check_first_loss, learning_rates, timed_steps, write_row


def parse_args(argv):
    p = argparse.ArgumentParser(description="GPT-J baseline in PyTorch eager (Hugging Face GPTJForCausalLM) on a `gptj export` folder.")
    add_export_args(p)
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32", help="f32, or bf16 autocast (default f32)")
    p.add_argument("--threads", type=int, default=1, help="PyTorch intra-op threads (default 1)")
    return p.parse_args(argv)


def main():
    args = parse_args(sys.argv[1:])
    try:
        with open(os.path.join(args.export, "export.json")) as f:
            info = json.load(f)
        steps = info["steps"] if args.steps is None else args.steps
        if not 1 <= steps <= info["steps"]:
            raise ValueError(f"--steps {steps}: the export has batches for 1 to {info['steps']} steps")
        if args.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {args.threads}")
    except (OSError, ValueError, KeyError) as e:
        print(f"torch_baseline: {e}", file=sys.stderr)
        return 2

    import torch
    import transformers
    from safetensors.torch import load_file

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    opt = info["optimizer"]
    batch, seq = info["batch"], info["seq"]

    model = transformers.GPTJForCausalLM.from_pretrained(args.export, torch_dtype=torch.float32)
    model.train()
    batches = load_file(os.path.join(args.export, "batches.safetensors"))
    min_rank = opt.get("weight_decay_min_rank", 2)
    decayed = [p for p in model.parameters() if p.dim() >= min_rank]
    plain = [p for p in model.parameters() if p.dim() < min_rank]
    optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": opt["weight_decay"]}, {"params": plain, "weight_decay": 0.0}],
                                  lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
    lrs = learning_rates(info, steps)

    def step(ids, targets, lr):
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), opt["clip"])
        optimizer.step()
        return float(loss.detach()), float(norm)

    say(f"torch_baseline: torch {torch.__version__}, transformers {transformers.__version__}, config {info['config']}, "
        f"{args.dtype}, {args.threads} thread(s), batch {batch} x seq {seq}, {steps} steps")
    def run_step(k, lr):
        return step(batches[f"ids.{k}"].long(), batches[f"targets.{k}"].long(), lr)

    losses, tokens_per_s = timed_steps(steps, batch * seq, lrs, run_step, say)
    print(f"torch: config {info['config']}, {args.dtype}, {args.threads} thread(s): first loss {losses[0]:.6f}, final loss "
          f"{losses[-1]:.6f}, {tokens_per_s:.0f} tokens/s (median over steps after the first), torch {torch.__version__}")
    row = {"sharding": "torch", "config": info["config"], "dtype": args.dtype, "threads": args.threads, "tokens_per_s": tokens_per_s,
           "first_loss": losses[0], "final_loss": losses[-1], "losses": losses, "batch": batch, "seq": seq, "steps": steps,
           "torch_version": torch.__version__, "transformers_version": transformers.__version__}
    write_row(args.json, row)
    return check_first_loss("torch_baseline", losses[0], args, say)


if __name__ == "__main__":
    sys.exit(main())
