#!/usr/bin/env bash
# CMake package check (CI, no GPU needed: compile + link only):
#  1. configure + build the package with CUDA (CMAKE_CUDA_ARCHITECTURES=90a by
#     default; CUDA_ARCHS overrides) and install it into a temporary prefix;
#  2. check that the installed C API header is C (C99) and C++11 clean;
#  3. configure + build examples/cpp against the installed package
#     (find_package(mla_ext)); the example is not run;
#  4. configure + install the header-only package (MLA_EXT_GPU=NONE).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
jobs="${MAX_JOBS:-$(nproc 2>/dev/null || echo 2)}"
step() { echo "cmake_check: $1 ($((SECONDS - t0)) s so far)"; }
t0=$SECONDS

cmake -S "$ROOT" -B "$out/build" "${gen[@]}" -DMLA_EXT_GPU=CUDA \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" >"$out/configure.log" || { cat "$out/configure.log"; exit 1; }
step "configured (CUDA, ${CUDA_ARCHS:-90a})"
cmake --build "$out/build" -j "$jobs" >"$out/build.log" || { cat "$out/build.log"; exit 1; }
cmake --install "$out/build" --prefix "$out/prefix" >/dev/null
step "built and installed libmla_ext"

# The shared library exports the C API and nothing else.
exported=$(nm -D --defined-only "$out/prefix/lib/libmla_ext.so" | awk '$2 == "T" {print $3}' | sort)
if grep -v '^mla_ext_' <<<"$exported"; then
  echo "cmake_check: libmla_ext.so exports symbols outside the C API (above)" >&2
  exit 1
fi
echo "cmake_check: exported: $(tr '\n' ' ' <<<"$exported")"
cc -std=c99 -Wall -Wextra -pedantic -Werror -fsyntax-only -x c "$out/prefix/include/mla_ext_capi.h"
c++ -std=c++11 -Wall -Wextra -pedantic -Werror -fsyntax-only -x c++ "$out/prefix/include/mla_ext_capi.h"
step "mla_ext_capi.h is C99 and C++11 clean"

cmake -S examples/cpp -B "$out/example" "${gen[@]}" -DCMAKE_PREFIX_PATH="$out/prefix" \
  -DCMAKE_COMPILE_WARNING_AS_ERROR=ON >"$out/example.log" || { cat "$out/example.log"; exit 1; }
cmake --build "$out/example" -j "$jobs" >"$out/example_build.log" || { cat "$out/example_build.log"; exit 1; }
step "built examples/cpp against the installed package"

cmake -S "$ROOT" -B "$out/build_none" "${gen[@]}" -DMLA_EXT_GPU=NONE >"$out/none.log" || { cat "$out/none.log"; exit 1; }
cmake --install "$out/build_none" --prefix "$out/prefix_none" >/dev/null
test -f "$out/prefix_none/include/mla_ext/sparse_mla_decode.cuh"
test -f "$out/prefix_none/lib/cmake/mla_ext/mla_extConfig.cmake"
step "header-only package (MLA_EXT_GPU=NONE) installed"

${PYTHON:-python3} tools/wheel_size.py "$out/prefix/lib/libmla_ext.so"
echo "cmake_check: ok ($((SECONDS - t0)) s)"
