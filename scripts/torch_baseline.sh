#!/usr/bin/env bash
# Runs bench/torch_baseline.py (GPT-J in PyTorch eager, Hugging Face's GPTJForCausalLM, f32 or bf16
# autocast on the CPU) with a Python that has torch, transformers and safetensors.
#
#   scripts/torch_baseline.sh [--install] --export DIR [--dtype f32|bf16] [--threads N] [--steps K] [--json FILE] [...]
#   scripts/torch_baseline.sh [--install] --check      (only finds, or installs, the Python: prints it)
#
# The Python is the first of: $NAX_TORCH_PYTHON; the repository's venv .venv-torch/; python3 on
# PATH; /usr/bin/python3 — the first that can import torch, transformers and safetensors. With
# --install, when none can, .venv-torch/ is made and they are installed from PyPI (PyPI's default
# torch wheel, a few GB: never in CI). All other arguments go to the script (--help lists them).
#
# Exit status: 0 done; 77 no Python with torch and no --install; 3 the first-step loss differs from
# --expect-loss; 2 bad arguments; 1 any other failure (including the install).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/python_with.sh
source "$root/scripts/python_with.sh"
run_baseline torch_baseline "$root/.venv-torch" "${NAX_TORCH_PYTHON:-}" "torch, transformers, safetensors" \
  "torch transformers safetensors numpy" torch "$root/bench/torch_baseline.py" "$@"
