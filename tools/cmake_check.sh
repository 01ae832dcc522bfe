#!/usr/bin/env bash
# CMake package check (CI, no GPU needed: compile + link only):
#  1. configure + build the package with CUDA (CMAKE_CUDA_ARCHITECTURES=90a by
#     default; CUDA_ARCHS overrides) and install it into a temporary prefix;
#  2. check that the installed C API header is C (C99) and C++11 clean;
#  3. configure + build examples/cpp against the installed package
#     (find_package(mla_ext)); the example is not run; tests/compile/capi_host_check.c
#     (the C API's argument validation, host only) is built and run;
#  4. configure + install the header-only package (MLA_EXT_GPU=NONE);
#  5. MLA_EXT_GPU=HIP: configure + build + install with CMake's HIP language and
#     Debian's ROCm (what `apt-get install hipcc` brings: clang-15, libamdhip64-dev,
#     rocm-device-libs), for gfx90a; exports and examples/cpp against it, as in 1-3.
#     Skipped with a note when hipcc is missing (compile_check.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
jobs="${MAX_JOBS:-$(nproc 2>/dev/null || echo 2)}"
step() { echo "cmake_check: $1 ($((SECONDS - t0)) s so far)"; }
# The shared library exports the C API and nothing else.
check_exports() {
  local exported
  exported=$(nm -D --defined-only "$1" | awk '$2 == "T" {print $3}' | sort)
  if grep -v '^mla_ext_' <<<"$exported"; then
    echo "cmake_check: $1 exports symbols outside the C API (above)" >&2
    exit 1
  fi
  echo "cmake_check: $(basename "$(dirname "$(dirname "$1")")") exports: $(tr '\n' ' ' <<<"$exported")"
}
t0=$SECONDS

cmake -S "$ROOT" -B "$out/build" "${gen[@]}" -DMLA_EXT_GPU=CUDA \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" >"$out/configure.log" || { cat "$out/configure.log"; exit 1; }
step "configured (CUDA, ${CUDA_ARCHS:-90a})"
cmake --build "$out/build" -j "$jobs" >"$out/build.log" || { cat "$out/build.log"; exit 1; }
cmake --install "$out/build" --prefix "$out/prefix" >/dev/null
step "built and installed libmla_ext"

check_exports "$out/prefix/lib/libmla_ext.so"
# The soname is the C API version (a program built against another version's header must not bind).
capi=$(sed -n 's/^#define MLA_EXT_CAPI_VERSION \([0-9]*\).*/\1/p' csrc/capi/mla_ext_capi.h)
soname=$(readelf -d "$out/prefix/lib/libmla_ext.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libmla_ext.so.$capi" ] || { echo "cmake_check: soname $soname, expected libmla_ext.so.$capi" >&2; exit 1; }
# ... and so does the file's name, so one C API version installed over another keeps the older file.
real=$(basename "$(readlink -f "$out/prefix/lib/libmla_ext.so")")
case "$real" in libmla_ext.so.$capi.*) ;; *) echo "cmake_check: library file $real, expected libmla_ext.so.$capi.*" >&2; exit 1;; esac
step "soname $soname, file $real"
cc -std=c99 -Wall -Wextra -pedantic -Werror -fsyntax-only -x c "$out/prefix/include/mla_ext_capi.h"
c++ -std=c++11 -Wall -Wextra -pedantic -Werror -fsyntax-only -x c++ "$out/prefix/include/mla_ext_capi.h"
step "mla_ext_capi.h is C99 and C++11 clean"

cmake -S examples/cpp -B "$out/example" "${gen[@]}" -DCMAKE_PREFIX_PATH="$out/prefix" \
  -DCMAKE_COMPILE_WARNING_AS_ERROR=ON >"$out/example.log" || { cat "$out/example.log"; exit 1; }
cmake --build "$out/example" -j "$jobs" >"$out/example_build.log" || { cat "$out/example_build.log"; exit 1; }
step "built examples/cpp against the installed package"

# The C API's argument checks run on the host, before any launch: exercised here without a GPU.
cc -std=c99 -Wall -Wextra -Werror -I"$out/prefix/include" tests/compile/capi_host_check.c \
  -L"$out/prefix/lib" -lmla_ext -Wl,-rpath,"$out/prefix/lib" -o "$out/capi_host_check"
"$out/capi_host_check"
step "C API argument validation (host only) checked"

cmake -S "$ROOT" -B "$out/build_none" "${gen[@]}" -DMLA_EXT_GPU=NONE >"$out/none.log" || { cat "$out/none.log"; exit 1; }
cmake --install "$out/build_none" --prefix "$out/prefix_none" >/dev/null
test -f "$out/prefix_none/include/mla_ext/sparse_mla_decode.cuh"
test -f "$out/prefix_none/lib/cmake/mla_ext/mla_extConfig.cmake"
step "header-only package (MLA_EXT_GPU=NONE) installed"

if command -v hipcc >/dev/null && command -v hipconfig >/dev/null; then
  # Debian's layout needs three hints that a ROCm install under /opt/rocm does not:
  # CMake 3.25's HIP support looks for <ROCm root>/lib/cmake/hip-lang only (Debian keeps it
  # in lib/<multiarch>/cmake: a one-link shim root), finds no `clang++` (only clang++-15),
  # and clang needs the ROCm and device-library paths that hipcc passes it.
  rocm=$(hipconfig --rocmpath)
  clangdir=$(hipconfig --hipclangpath)
  hipcxx=$( (ls -d "$clangdir"/clang++ "$clangdir"/clang++-[0-9]* 2>/dev/null || true) | head -1)
  hiplang=$( (ls -d "$rocm"/lib/cmake/hip-lang "$rocm"/lib/*/cmake/hip-lang 2>/dev/null || true) | head -1)
  devlibs=$(dirname "$( (find "$rocm"/lib -name ocml.bc 2>/dev/null || true) | head -1)")
  mkdir -p "$out/rocm/lib/cmake"
  ln -s "$hiplang" "$out/rocm/lib/cmake/hip-lang"
  export CMAKE_PREFIX_PATH="$(dirname "$hiplang")${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"  # amd_comgr, AMDDeviceLibs
  cmake -S "$ROOT" -B "$out/build_hip" "${gen[@]}" -DMLA_EXT_GPU=HIP -DCMAKE_HIP_ARCHITECTURES=gfx90a \
    -DCMAKE_HIP_COMPILER="$hipcxx" -DCMAKE_HIP_COMPILER_ROCM_ROOT="$out/rocm" \
    -DCMAKE_HIP_FLAGS="--rocm-path=$rocm --hip-device-lib-path=$devlibs" >"$out/hip.log" 2>&1 \
    || { cat "$out/hip.log"; exit 1; }
  cmake --build "$out/build_hip" -j "$jobs" >"$out/hip_build.log" 2>&1 || { cat "$out/hip_build.log"; exit 1; }
  cmake --install "$out/build_hip" --prefix "$out/prefix_hip" >/dev/null
  check_exports "$out/prefix_hip/lib/libmla_ext.so"
  cmake -S examples/cpp -B "$out/example_hip" "${gen[@]}" -DCMAKE_PREFIX_PATH="$out/prefix_hip" \
    -DCMAKE_COMPILE_WARNING_AS_ERROR=ON >"$out/example_hip.log" 2>&1 || { cat "$out/example_hip.log"; exit 1; }
  cmake --build "$out/example_hip" -j "$jobs" >"$out/example_hip_build.log" 2>&1 \
    || { cat "$out/example_hip_build.log"; exit 1; }
  step "HIP package (gfx90a, $hipcxx) built, installed; examples/cpp built against it"
else
  echo "cmake_check: no hipcc/hipconfig, HIP package step skipped (apt-get install hipcc)"
fi

${PYTHON:-python3} tools/wheel_size.py "$out/prefix/lib/libmla_ext.so"
echo "cmake_check: ok ($((SECONDS - t0)) s)"
