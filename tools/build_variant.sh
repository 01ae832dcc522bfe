#!/bin/bash
# Build the extension of one commit (optionally with patches applied) for sm_90a into
# .dev/NAME/ (_C.abi3.so + _build_info.py), to carry to the GPU machine for an A/B run
# (benchmarks/dev/device_call.sh copies a variant into mla_ext/ before each benchmark process).
# Unlike tools/device_ab.sh, which builds both variants on the GPU machine (1-2 min of device
# time each), this builds on the CPU machine: device time goes to measuring only.
#
#   tools/build_variant.sh NAME REV [PATCH ...]
#
# PYTHON: an interpreter whose torch has CUDA (on the CPU build machine: a venv with the
# cu130 wheel, `pip install torch==2.14.1 numpy ninja setuptools wheel`; the stable-ABI build
# then loads under the GPU machine's torch >= 2.10). nvcc must be on PATH (CUDA_HOME default
# /usr/local/cuda). Where the linker finds no libcudart.so (the wheel ships libcudart.so.13
# only), point LIBRARY_PATH at a folder with a libcudart.so link to it. ~80 s on 2 cores.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2; }
NAME=$1; REV=$2; shift 2
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
SRC=/tmp/mla_ext_variants/$NAME
rm -rf "$SRC"; mkdir -p /tmp/mla_ext_variants
git clone -q "$ROOT" "$SRC"
git -C "$SRC" checkout -q "$REV"
for p in "$@"; do git -C "$SRC" apply "$(realpath "$p")"; done
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} MLA_EXT_REQUIRE_GPU=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
t0=$(date +%s)
(cd "$SRC" && "${PYTHON:-python3}" setup.py build_ext --inplace > "$SRC.log" 2>&1) || { tail -20 "$SRC.log"; exit 1; }
mkdir -p "$ROOT/.dev/$NAME"
cp "$SRC"/mla_ext/_C*.so "$SRC"/mla_ext/_build_info.py "$ROOT/.dev/$NAME/"
echo "$NAME: $(git -C "$SRC" rev-parse --short HEAD)${*:+ + $*}, built in $(( $(date +%s) - t0 )) s -> .dev/$NAME"
