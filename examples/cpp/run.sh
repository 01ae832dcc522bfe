#!/usr/bin/env bash
# Build and install the mla_ext CMake package into a temporary prefix, build
# this example against the installed package (find_package(mla_ext)), and run
# it on the GPU. Exit status: the example's (0 ok, 1 mismatch, 2 no GPU).
#   usage: examples/cpp/run.sh [extra cmake args for the package, e.g. -DCMAKE_CUDA_ARCHITECTURES=90a]
# Environment: MLA_EXT_GPU (CUDA | HIP, default CUDA), CUDA_ARCHS (default: the
# GPU's own arch via CMake's "native"; without a GPU and without CUDA_ARCHS it exits 2
# before building), KEEP=1 keeps the scratch folder.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
GPU="${MLA_EXT_GPU:-CUDA}"
work="$(mktemp -d "${TMPDIR:-/tmp}/mla_ext_example.XXXXXX")"
[[ "${KEEP:-0}" == 1 ]] || trap 'rm -rf "$work"' EXIT
# CMake >= 3.24 (CUDA arch "native", the package's minimum): the system's, else pip's.
cmake_ok() {
  local v
  v="$(cmake --version 2>/dev/null | awk 'NR == 1 {print $3}')" || return 1
  [[ -n "$v" ]] && printf '%s\n3.24\n' "$v" | sort -V -C -r
}
if ! cmake_ok; then
  echo "run.sh: no CMake >= 3.24 on PATH; pip-installing cmake + ninja into the scratch folder" >&2
  "${PYTHON:-python3}" -m pip install -q --target "$work/tools" "cmake>=3.24" ninja
  export PATH="$work/tools/bin:$PATH" PYTHONPATH="$work/tools${PYTHONPATH:+:$PYTHONPATH}"
  cmake_ok || { echo "run.sh: CMake >= 3.24 is needed" >&2; exit 1; }
fi
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
jobs="$(nproc 2>/dev/null || echo 2)"
arch=()
if [[ "$GPU" == CUDA ]]; then
  # "native" needs a visible GPU; without one the example could not run anyway (exit 2, not 1)
  if [[ -z "${CUDA_ARCHS:-}" ]] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "run.sh: no GPU (nvidia-smi lists none); set CUDA_ARCHS (e.g. 90a) to build without running" >&2
    exit 2
  fi
  arch=("-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-native}")
fi

t0=$SECONDS
cmake -S "$ROOT" -B "$work/build" "${gen[@]}" -DMLA_EXT_GPU="$GPU" "${arch[@]}" "$@" >"$work/configure.log" \
  || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" -j "$jobs"
cmake --install "$work/build" --prefix "$work/prefix" >/dev/null
echo "run.sh: package built and installed in $((SECONDS - t0)) s ($work/prefix)"
cmake -S "$ROOT/examples/cpp" -B "$work/example" "${gen[@]}" -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/example.log" \
  || { cat "$work/example.log"; exit 1; }
cmake --build "$work/example" -j "$jobs"
"$work/example/mla_ext_example"
