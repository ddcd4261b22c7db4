#!/usr/bin/env python3
"""Fine-tunes the Hugging Face fixture (tests/fixtures/hf_gptj) with `gptj train --init-from`, writes
the result back with `gptj convert` (F16 in shards with the index, and BF16 in one file), loads
each folder with transformers' GPTJForCausalLM and compares its logits with `gptj logits` on the
same folder. Exits 77 (skipped) when torch or transformers cannot be imported.

    check_hf_convert.py GPTJ_BINARY SOURCE_DIR WORK_DIR
"""
import json
import os
import shutil
import subprocess
import sys

try:
    import torch
    from transformers import GPTJForCausalLM
except Exception as error:  # the packages are optional: say why the check is skipped
    print(f"skipped: torch and transformers are needed ({error})", file=sys.stderr)
    sys.exit(77)

gptj, source, work = sys.argv[1], sys.argv[2], sys.argv[3]
fixture = f"{source}/tests/fixtures/hf_gptj"
tokenizer = f"{source}/tests/fixtures/tokenizer/tokenizer.json"
os.makedirs(work, exist_ok=True)
for name in ("ft", "ft-f16", "ft-bf16"):
    shutil.rmtree(f"{work}/{name}", ignore_errors=True)
with open(f"{work}/ft.txt", "w") as f:
    f.write("The quick brown fox jumps over the lazy dog. It's 42 o'clock.\n" * 60)
subprocess.run([gptj, "train", "--init-from", fixture, "--tokenizer", tokenizer, "--data", f"{work}/ft.txt", "--token-cache", work,
                "--mesh", "dp=1,mp=2", "--steps", "5", "--batch", "4", "--seq", "32", "--eval-every", "0", "--ckpt-dir", f"{work}/ft",
                "--quiet"], check=True)
worst = 0.0
for dtype, size in (("f16", "0.06"), ("bf16", "100")):
    out = f"{work}/ft-{dtype}"
    subprocess.run([gptj, "convert", "--ckpt", f"{work}/ft", "--out", out, "--dtype", dtype, "--max-file-mb", size], check=True)
    sharded = os.path.exists(f"{out}/model.safetensors.index.json")
    prompt = "The quick brown fox"
    ours = json.loads(subprocess.run([gptj, "logits", "--ckpt", out, "--tokenizer", tokenizer, "--prompt", prompt, "--mesh", "dp=1,mp=4"],
                                     check=True, capture_output=True, text=True).stdout)
    ids = json.loads(subprocess.run([gptj, "tokenize", "--tokenizer", tokenizer, "--text", prompt],
                                    check=True, capture_output=True, text=True).stdout)
    model = GPTJForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0].double()
    diff = (theirs - torch.tensor(ours, dtype=torch.float64)).abs().max().item() / theirs.abs().max().item()
    print(f"{dtype} ({'sharded with an index' if sharded else 'one file'}): max |HF - nax| = {diff:.2e} of the largest logit")
    worst = max(worst, diff)
sys.exit(0 if worst <= 1e-3 else 1)
