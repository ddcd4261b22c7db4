# shellcheck shell=bash
# Sourced by the baseline scripts: finds, or installs into a venv of the repository, a Python that
# can import what a baseline needs.
#
#   python_with NAME VENV PREFERRED IMPORTS PACKAGES INSTALL
#
# Prints the first of PREFERRED (when set), VENV/bin/python, python3, /usr/bin/python3 that runs
# "import IMPORTS". When none can: with INSTALL=1 makes VENV (python3 -m venv) and pip-installs
# PACKAGES (words) into it from PyPI; else says why on stderr and returns 77. Returns 1 when the
# install fails. Messages start with NAME.
python_with() {
  local name=$1 venv=$2 preferred=$3 imports=$4 packages=$5 install=$6
  local candidates=() p
  [ -n "$preferred" ] && candidates+=("$preferred")
  candidates+=("$venv/bin/python" python3 /usr/bin/python3)
  for p in "${candidates[@]}"; do
    if { [ -x "$p" ] || command -v "$p" >/dev/null 2>&1; } && "$p" -c "import $imports" >/dev/null 2>&1; then
      echo "$p"
      return 0
    fi
  done
  if [ "$install" -ne 1 ]; then
    echo "$name: no Python that can import $imports (tried ${preferred:+$preferred, }$(basename "$venv")/, python3, /usr/bin/python3); run with --install to make $(basename "$venv")/" >&2
    return 77
  fi
  echo "$name: installing $packages into $venv" >&2
  local start
  start=$(date +%s)
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" || { echo "$name: 'python3 -m venv' failed (on Debian: apt-get install python3-venv)" >&2; return 1; }
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2 || true
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $packages >&2 ||
    { echo "$name: pip install of $packages into $venv failed" >&2; return 1; }
  "$venv/bin/python" -c "import $imports" >/dev/null 2>&1 || { echo "$name: $venv/bin/python still cannot import $imports" >&2; return 1; }
  echo "$name: installed in $(($(date +%s) - start)) s" >&2
  echo "$venv/bin/python"
}

# run_baseline NAME VENV PREFERRED IMPORTS PACKAGES MODULE SCRIPT [ARGS...]: the whole of a baseline
# script. --install and --check are its own flags (install when missing; only find the Python and
# print MODULE's version); the other ARGS go to SCRIPT, run with the Python found. Exits with the
# script's status, or python_with's.
run_baseline() {
  local name=$1 venv=$2 preferred=$3 imports=$4 packages=$5 module=$6 script=$7
  shift 7
  local install=0 check=0 args=() a python status=0
  for a in "$@"; do
    case "$a" in
      --install) install=1 ;;
      --check) check=1 ;;
      *) args+=("$a") ;;
    esac
  done
  python="$(python_with "$name" "$venv" "$preferred" "$imports" "$packages" "$install")" || status=$?
  [ "$status" -eq 0 ] || exit "$status"
  if [ "$check" -eq 1 ]; then
    echo "$name: $python has $module $("$python" -c "import $module; print($module.__version__)")"
    exit 0
  fi
  exec "$python" "$script" ${args[@]+"${args[@]}"}
}
