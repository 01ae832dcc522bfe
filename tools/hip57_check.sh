#!/usr/bin/env bash
# Compile-only check of the torch-free kernel headers for gfx942 (MI300, the CDNA3 target AMD
# engines run) with Debian 13's hipcc 5.7 (clang 17), which knows gfx942 where Debian 12's
# hipcc 5.2 (compile_check.sh, hipify_check.sh: gfx90a and gfx940) does not. Debian 13 comes as a
# minimal debootstrap chroot (~25 s, plus ~20 s for hipcc, ~1.7 GB; kept in $MLA_EXT_TRIXIE_ROOT,
# default /tmp/mla_ext_trixie, and reused once complete). It compiles
# tests/compile/kernels_check.cu, which instantiates every kernel, and the C API source as
# CMake's HIP build does, with -Wall -Wextra, and fails on an error or on any warning from csrc/. trixie is not pinned to a snapshot:
# a point release may bring a newer clang and new warnings.
# The chroot needs root and the Debian mirror; where either is missing the check prints
# "hip57_check: SKIPPED" and exits 0 (a missing tool is not a kernel defect), or exits 1 when
# MLA_EXT_REQUIRE_HIP57=1.
set -euo pipefail
cd "$(dirname "$0")/.."
root=${MLA_EXT_TRIXIE_ROOT:-/tmp/mla_ext_trixie}
stamp="$root/.mla_ext_hip57_ready"
skip() {
  echo "hip57_check: SKIPPED ($1): kernels not compiled for gfx942"
  [ "${MLA_EXT_REQUIRE_HIP57:-0}" = 1 ] && exit 1
  exit 0
}
# Run in the chroot with a clean environment (a host's ROCM_PATH / HIP_PATH / HIP_CLANG_PATH
# would point hipcc at tools that are not there).
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
  DEBIAN_FRONTEND=noninteractive HIP_PLATFORM=amd bash -c "$1"; }
log="" work=""
trap '[ -z "$log" ] || rm -f "$log"; [ -z "$work" ] || rm -rf "$work"' EXIT
t0=$SECONDS
[ "$(id -u)" = 0 ] || skip "chroot needs root"
exec 9>"${root%/}.lock"
flock 9  # one job at a time builds or uses the chroot
if [ ! -e "$stamp" ]; then
  if [ -e "$root" ]; then
    # Only ever delete a directory this script made: an unfinished chroot (no stamp yet).
    [ -e "$root/.mla_ext_hip57_partial" ] || skip "$root exists and is not this script's chroot"
    rm -rf --one-file-system "$root"
  fi
  if ! command -v debootstrap >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap) >/dev/null 2>&1 ||
      skip "cannot install debootstrap"
  fi
  [ -r /etc/resolv.conf ] || skip "no /etc/resolv.conf to resolve the Debian mirror in the chroot"
  log=$(mktemp)
  mkdir -p "$root"
  touch "$root/.mla_ext_hip57_partial"
  debootstrap --variant=minbase trixie "$root" http://deb.debian.org/debian >"$log" 2>&1 ||
    { tail -5 "$log"; skip "debootstrap of Debian 13 failed"; }
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  in_root "apt-get update -qq && apt-get install -y -qq hipcc" >"$log" 2>&1 ||
    { tail -5 "$log"; skip "hipcc did not install in the Debian 13 chroot"; }
  version=$(in_root "hipcc --version" 2>/dev/null) || skip "hipcc does not run in the chroot"
  version=${version%%$'\n'*}
  touch "$stamp"
  echo "hip57_check: Debian 13 chroot with $version in $((SECONDS - t0)) s"
fi
work=$(mktemp -d "$root/tmp/mla_ext.XXXXXX")
mkdir -p "$work/tests"
cp -r csrc "$work/"
cp -r tests/compile "$work/tests/"
# The kernels, every instance; then the C API as CMake's HIP build (-DMLA_EXT_GPU=HIP) compiles it.
for src in tests/compile/kernels_check.cu csrc/capi/mla_ext_capi.cu; do
  echo "hipcc 5.7 gfx942: $src"
  in_root "cd ${work#"$root"} && hipcc --offload-arch=gfx942 -std=c++17 -O2 -fPIC -Wall -Wextra -Werror=return-type \
    -Icsrc/include -Icsrc/cpu -Icsrc/torch -Icsrc/capi -x hip -c $src -o $(basename "$src").o" \
    >"$work/log" 2>&1 || { cat "$work/log"; echo "hip57_check: FAILED"; exit 1; }
  if grep -q "csrc/.*warning:" "$work/log"; then
    cat "$work/log"
    echo "hip57_check: FAILED (warnings from csrc/)"
    exit 1
  fi
done
echo "hip57_check: ok ($((SECONDS - t0)) s)"
