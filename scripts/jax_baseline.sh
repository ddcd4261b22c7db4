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
venv="$root/.venv-jax"

install=0
check=0
args=()
for a in "$@"; do
  case "$a" in
    --install) install=1 ;;
    --check) check=1 ;;
    *) args+=("$a") ;;
  esac
done

has_jax() { [ -x "$1" ] || command -v "$1" >/dev/null 2>&1 || return 1; "$1" -c 'import jax, numpy' >/dev/null 2>&1; }

find_python() {
  local candidates=()
  [ -n "${NAX_JAX_PYTHON:-}" ] && candidates+=("$NAX_JAX_PYTHON")
  candidates+=("$venv/bin/python" python3 /usr/bin/python3)
  for p in "${candidates[@]}"; do
    if has_jax "$p"; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

if ! python="$(find_python)"; then
  if [ "$install" -ne 1 ]; then
    echo "jax_baseline: no Python with jax and numpy (tried \$NAX_JAX_PYTHON, .venv-jax/, python3, /usr/bin/python3); run with --install to make .venv-jax/" >&2
    exit 77
  fi
  echo "jax_baseline: installing jax (CPU) and numpy into $venv" >&2
  start=$(date +%s)
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" || { echo "jax_baseline: 'python3 -m venv' failed (on Debian: apt-get install python3-venv)" >&2; exit 1; }
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2 || true
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "jax${NAX_JAX_VERSION:+==$NAX_JAX_VERSION}" numpy >&2 ||
    { echo "jax_baseline: pip install of jax and numpy into $venv failed" >&2; exit 1; }
  has_jax "$venv/bin/python" || { echo "jax_baseline: $venv/bin/python still cannot import jax" >&2; exit 1; }
  python="$venv/bin/python"
  echo "jax_baseline: installed jax $("$python" -c 'import jax; print(jax.__version__)') in $(($(date +%s) - start)) s" >&2
fi

if [ "$check" -eq 1 ]; then
  echo "jax_baseline: $python has jax $("$python" -c 'import jax; print(jax.__version__)')"
  exit 0
fi
exec "$python" "$root/bench/jax_baseline.py" ${args[@]+"${args[@]}"}
