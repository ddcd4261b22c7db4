#!/usr/bin/env bash
# Installs the build dependencies nax needs from Debian's packages, only those missing.
# Idempotent: a second run installs nothing. Set NAX_SETUP_SKIP=1 to skip entirely.
set -euo pipefail
[ "${NAX_SETUP_SKIP:-0}" = "1" ] && exit 0

packages=(cmake g++ ninja-build pkg-config libopenblas-dev libdnnl-dev ocl-icd-opencl-dev libfmt-dev catch2 nlohmann-json3-dev libpcre2-dev openmpi-bin libopenmpi-dev python3)  # python3: scripts/check_*.py; ocl-icd-opencl-dev: oneDNN's CMake config needs OpenCL's headers

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
