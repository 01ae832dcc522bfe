#!/usr/bin/env bash
# Compile-only checks of the GPU code, so a CUDA- or HIP-only break fails CI on a
# machine without a GPU:
#  1. nvcc, sm_90a: every GPU source of the extension (csrc/sources.txt "gpu",
#     against the installed torch's headers) and the torch-free kernel headers; the
#     kernel headers also for sm_80 and sm_90 (the mma.sync fallback bodies); compat.h's
#     environment-switch parser built for the host and run; the launcher's policy helpers
#     (tests/compile/policy_check.cpp) built for the host and run.
#  2. hipcc (Debian's, HIP_PLATFORM=amd), gfx90a and gfx940, -Wall -Wextra -Werror: the torch-free
#     kernel headers (Debian 12's hipcc 5.2 knows no gfx942; gfx940 is its
#     nearest CDNA3 target).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
inc=(-Icsrc/include -Icsrc/cpu -Icsrc/torch)

if command -v nvcc >/dev/null; then
  torch_inc=$($PYTHON -c "from torch.utils.cpp_extension import include_paths; print(' '.join('-I'+p for p in include_paths()))")
  py_inc=$($PYTHON -c "import sysconfig; print('-I' + sysconfig.get_paths()['include'])")
  for src in $(awk '$1 == "gpu" {print $2}' csrc/sources.txt); do
    echo "nvcc sm_90a: $src"
    nvcc -std=c++17 -O3 -DUSE_CUDA -DTORCH_TARGET_VERSION=0x020a000000000000 --expt-relaxed-constexpr \
      -gencode=arch=compute_90a,code=sm_90a "${inc[@]}" $torch_inc $py_inc -c "$src" -o "$out/$(basename "$src").o"
  done
  # The binding's GPU branch (only compiled in GPU builds) with the host compiler.
  for src in $(awk '$1 == "cpu" && $2 ~ /^csrc\/torch\// {print $2}' csrc/sources.txt); do
    echo "g++ (GPU build flags): $src"
    g++ -std=c++17 -fsyntax-only -DUSE_CUDA -DMLA_EXT_WITH_GPU -DTORCH_TARGET_VERSION=0x020a000000000000 \
      "${inc[@]}" $torch_inc $py_inc "$src"
  done
  echo "nvcc sm_90a: tests/compile/kernels_check.cu"
  # Host side under -Wall -Wextra -Werror (the headers' host code is what C++ engines compile).
  nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -Wall,-Wextra,-Werror "${inc[@]}" \
    -c tests/compile/kernels_check.cu -o "$out/k_cuda.o"
  # The bodies a build without sm_90a runs (the default arch list's 8.0, and Hopper builds for
  # plain 9.0, where the warpgroup kernels fall back to mma.sync bodies, two-token grids included).
  echo "nvcc sm_80 + sm_90: tests/compile/kernels_check.cu"
  nvcc -std=c++17 -O3 --threads 2 -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90 \
    "${inc[@]}" -c tests/compile/kernels_check.cu -o "$out/k_cuda_8090.o"
  # compat.h's environment switches (host code, run here): integers taken, anything else ignored.
  echo "nvcc host + run: tests/compile/env_int_check.cu"
  nvcc -std=c++17 "${inc[@]}" tests/compile/env_int_check.cu -o "$out/env_int_check"
  for case in "=5" "0=0" "2=2" "0x10=16" "off=5" "2x=5"; do
    got=$(MLA_EXT_TEST_ENV="${case%=*}" "$out/env_int_check" 2>/dev/null)
    [ "$got" = "${case##*=}" ] || { echo "env_int(\"${case%=*}\") = $got, expected ${case##*=}" >&2; exit 1; }
  done
else
  echo "compile_check: nvcc not found" >&2
  exit 1
fi

# The GPU launcher's policy helpers no CPU test reaches (reduce column chunks; the split counts
# they were measured on), built for the host and run.
echo "g++ + run: tests/compile/policy_check.cpp"
g++ -std=c++17 -Wall -Werror "${inc[@]}" tests/compile/policy_check.cpp -o "$out/policy_check"
"$out/policy_check" >/dev/null || { "$out/policy_check" >&2; exit 1; }

if ! command -v hipcc >/dev/null; then
  echo "compile_check: installing Debian's hipcc"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hipcc) >/dev/null
fi
for arch in gfx90a gfx940; do
  echo "hipcc $arch: tests/compile/kernels_check.cu"
  HIP_PLATFORM=amd hipcc --offload-arch=$arch -std=c++17 -O2 -Wall -Wextra -Werror "${inc[@]}" -x hip \
    -c tests/compile/kernels_check.cu -o "$out/k_hip_$arch.o"
done
echo "compile_check: ok"
