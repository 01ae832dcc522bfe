#!/usr/bin/env bash
# Developer helper: build the mla_ext C API (sparse_mla_decode) into a shared
# library for tests/gpu_dev/decode_ctypes_check.py. Not part of the pytest suite.
#   usage: tests/gpu_dev/build_capi.sh [OUT.so] [extra nvcc flags...]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${1:-$ROOT/build/gpu_dev/libmla_ext_capi.so}"
shift || true
mkdir -p "$(dirname "$OUT")"
NVCC="${NVCC:-nvcc}"
ARCH="${MLA_EXT_GENCODE:--gencode=arch=compute_90a,code=sm_90a}"
# -cudart shared: the process's one shared runtime, as the CMake package links it (nvcc's default,
# a static runtime, is a separate runtime instance with its own last-error slot, so the harness's
# runtime-state check could not see an error the caller left pending).
"$NVCC" $ARCH -O3 -std=c++17 -shared -cudart shared -Xcompiler -fPIC -Xptxas -v \
  -I"$ROOT/csrc/include" -I"$ROOT/csrc/capi" \
  "$ROOT/csrc/capi/mla_ext_capi.cu" -o "$OUT" "$@" 2> "${OUT%.so}.ptxas.log" || {
  cat "${OUT%.so}.ptxas.log" >&2
  exit 1
}
grep -E "Compiling entry|spill|registers" "${OUT%.so}.ptxas.log" | paste - - - | sed 's/ptxas info    ://g' >&2 || true
echo "$OUT"
