#!/usr/bin/env bash
# Runs bench/jax_baseline.py (the GPT-J baseline in JAX on CPU devices) with a Python that has JAX.
#
#   scripts/jax_baseline.sh [--install] --export DIR --mesh SPEC [--steps K] [--json FILE] [--expect-loss X] [...]
#   scripts/jax_baseline.sh [--install] --check      (only finds, or installs, the Python: prints it)
#
# The Python is the first of: $NAX_JAX_PYTHON; the repository's venv .venv-jax/; python3 on PATH;
# /usr/bin/python3 — the first that can import jax and numpy. With --install, when none can, the
# venv .venv-jax/ is made with `python3 -m venv` and jax (CPU) and numpy are installed into it from
# PyPI (set NAX_JAX_VERSION to pin jax, e.g. 0.4.38). All other arguments go to the script
# (bench/jax_baseline.py --help lists them).
#
# Exit status: 0 done; 77 no Python with JAX and no --install (one line says why); 3 the first-step
# loss differs from --expect-loss; 2 bad arguments; 1 any other failure (including the install).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/python_with.sh
source "$root/scripts/python_with.sh"
run_baseline jax_baseline "$root/.venv-jax" "${NAX_JAX_PYTHON:-}" "jax, numpy" "jax${NAX_JAX_VERSION:+==$NAX_JAX_VERSION} numpy" jax \
  "$root/bench/jax_baseline.py" "$@"
