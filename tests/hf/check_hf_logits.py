#!/usr/bin/env python3
"""Loads a nax GPT-J checkpoint with Hugging Face's GPTJForCausalLM and compares its logits with
the ones `gptj logits` prints. Exits 77 (skipped) when torch or transformers cannot be imported.

    check_hf_logits.py GPTJ_BINARY WORK_DIR
"""
import json
import shutil
import subprocess
import sys

try:
    import torch
    from transformers import GPTJForCausalLM
except Exception as error:  # the packages are optional: say why the check is skipped
    print(f"skipped: torch and transformers are needed ({error}); "
          "Debian's python3-torch and a transformers release that works with it", file=sys.stderr)
    sys.exit(77)

gptj, work = sys.argv[1], sys.argv[2]
ckpt = f"{work}/ckpt"
shutil.rmtree(ckpt, ignore_errors=True)  # a new run needs an empty folder
text = "the quick brown fox jumps over the lazy dog\n" * 50
with open(f"{work}/corpus.txt", "w") as f:
    f.write(text)
subprocess.run([gptj, "train", "--config", "tiny", "--mesh", "dp=1,mp=2", "--data", f"{work}/corpus.txt", "--steps", "3",
                "--batch", "4", "--seq", "16", "--eval-every", "0", "--ckpt-dir", ckpt, "--quiet"], check=True)
prompt = "the quick brown"
ours = json.loads(subprocess.run([gptj, "logits", "--ckpt", ckpt, "--prompt", prompt, "--mesh", "dp=1,mp=2"],
                                 check=True, capture_output=True, text=True).stdout)

# A committed step folder is itself a Hugging Face model folder.
model = GPTJForCausalLM.from_pretrained(f"{ckpt}/step_000003", torch_dtype=torch.float32)
model.eval()
ids = torch.tensor([list(prompt.encode())])
with torch.no_grad():
    theirs = model(ids).logits[0].double()
ours = torch.tensor(ours, dtype=torch.float64)
diff = (theirs - ours).abs().max().item()
scale = theirs.abs().max().item()
print(f"max |HF - nax| logit difference: {diff:.3e} (logits up to {scale:.3f})")
sys.exit(0 if diff <= 1e-4 * max(1.0, scale) else 1)
