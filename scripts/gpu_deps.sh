#!/usr/bin/env bash
# gpu_deps.sh: packs the CPU side's build dependencies into build-gpu-deps/ (about 41 MB), for a
# GPU machine whose image has the CUDA toolkit, CMake and ninja but not Debian's fmt, OpenBLAS,
# Catch2 and nlohmann-json, and cannot fetch them (the lent H200's). Run here, then carry the folder
# (the device tool's `carry`); scripts/gpu_check.sh uses it when the system lacks those headers.
# The files keep their places relative to /usr, so the packages' CMake configs (which locate
# themselves) work from the copy; OpenBLAS's config names absolute paths, so it is rewritten.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh > /dev/null
dest=build-gpu-deps
rm -rf "$dest"
arch=$(gcc -dumpmachine)
copy() {  # copy /usr/PATH... into $dest/PATH..., links followed
  for path in "$@"; do
    mkdir -p "$dest/$(dirname "$path")"
    cp -rL "/usr/$path" "$dest/$path"
  done
}
copy include/fmt include/catch2 include/nlohmann \
     lib/$arch/cmake/fmt lib/cmake/Catch2 share/cmake/nlohmann_json \
     lib/$arch/libgfortran.so.5 lib/$arch/libquadmath.so.0 lib/libCatch2WithMain.a
fmt_file=$(basename "$(readlink -f /usr/lib/$arch/libfmt.so)")  # the name fmt's CMake config expects
cp -L /usr/lib/$arch/libfmt.so "$dest/lib/$arch/$fmt_file"
ln -s "$fmt_file" "$dest/lib/$arch/libfmt.so.9"
ln -s "$fmt_file" "$dest/lib/$arch/libfmt.so"
mkdir -p "$dest/include/openblas" "$dest/lib/$arch/cmake/openblas"
cp /usr/include/$arch/openblas-pthread/*.h "$dest/include/openblas/"
cp -L /usr/lib/$arch/openblas-pthread/libopenblas.so.0 "$dest/lib/$arch/libopenblas.so.0"
ln -s libopenblas.so.0 "$dest/lib/$arch/libopenblas.so"
cat > "$dest/lib/$arch/cmake/openblas/OpenBLASConfig.cmake" <<CONFIG
# Written by scripts/gpu_deps.sh: Debian's OpenBLAS (pthread build), relocated.
get_filename_component(_prefix "\${CMAKE_CURRENT_LIST_DIR}/../../../.." ABSOLUTE)
set(OpenBLAS_VERSION "$(grep -o '"[0-9.]*"' /usr/lib/$arch/cmake/openblas/OpenBLASConfig.cmake | head -1 | tr -d '"')")
set(OpenBLAS_INCLUDE_DIRS "\${_prefix}/include/openblas")
set(OpenBLAS_LIBRARIES "\${_prefix}/lib/$arch/libopenblas.so")
CONFIG
du -sh "$dest"
