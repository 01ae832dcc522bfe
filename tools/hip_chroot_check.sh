#!/usr/bin/env bash
# Compile-only check of the GPU code for AMD targets that Debian 12's hipcc 5.2 (compile_check.sh,
# hipify_check.sh: gfx90a and gfx940) does not know, with a newer Debian's hipcc in a minimal
# debootstrap chroot:
#   tools/hip_chroot_check.sh trixie gfx942   Debian 13, hipcc 5.7 / clang 17: MI300
#   tools/hip_chroot_check.sh sid gfx950      Debian unstable, hipcc package 7.0 (HIP 6.4) / clang 21: MI350
# The chroot (~25 s, plus ~20-40 s for hipcc, 1.7-2.5 GB) is kept in /tmp/mla_ext_chroot_<suite>
# and reused once complete. It compiles tests/compile/kernels_check.cu (every kernel instance) and
# the C API source as CMake's HIP build compiles it, with -Wall -Wextra, and fails on an error or
# on any warning from csrc/. The suites are not pinned to a snapshot: a newer clang may bring new
# warnings with no change here.
# The chroot needs root and the Debian mirror; where either is missing the check prints
# "hip_chroot_check: SKIPPED" and exits 0 (a missing tool is not a kernel defect), or exits 1
# when MLA_EXT_REQUIRE_HIP_CHROOT=1.
set -euo pipefail
cd "$(dirname "$0")/.."
suite=${1:?usage: tools/hip_chroot_check.sh SUITE ARCH...}
shift
[ $# -gt 0 ] || { echo "usage: tools/hip_chroot_check.sh SUITE ARCH..." >&2; exit 2; }
archs=("$@")
root=/tmp/mla_ext_chroot_$suite
stamp="$root/.mla_ext_ready"
name="hip_chroot_check ($suite, ${archs[*]})"
skip() {
  echo "$name: SKIPPED ($1): kernels not compiled for ${archs[*]}"
  [ "${MLA_EXT_REQUIRE_HIP_CHROOT:-0}" = 1 ] && exit 1
  exit 0
}
# Run in the chroot with a clean environment (a host's ROCM_PATH / HIP_PATH / HIP_CLANG_PATH
# would point hipcc at tools that are not there).
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
  DEBIAN_FRONTEND=noninteractive HIP_PLATFORM=amd bash -c "$1"; }
mounted=0 log="" work=""
cleanup() {
  [ "$mounted" = 0 ] || umount "$root/proc" 2>/dev/null || true
  [ -z "$log" ] || rm -f "$log"
  [ -z "$work" ] || rm -rf "$work"
}
trap cleanup EXIT
# Newer hipcc finds itself through /proc/self/exe.
mount_proc() { [ "$mounted" = 1 ] || { mount -t proc proc "$root/proc" 2>/dev/null && mounted=1; } || true; }
t0=$SECONDS
[ "$(id -u)" = 0 ] || skip "chroot needs root"
exec 9>"$root.lock"
flock 9  # one job at a time builds or uses this chroot
if [ ! -e "$stamp" ]; then
  if [ -e "$root" ]; then
    # Only ever delete a directory this script made: an unfinished chroot (no stamp yet).
    [ -e "$root/.mla_ext_partial" ] || skip "$root exists and is not this script's chroot"
    umount "$root/proc" 2>/dev/null || true
    rm -rf --one-file-system "$root"
  fi
  if ! command -v debootstrap >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap) >/dev/null 2>&1 ||
      skip "cannot install debootstrap"
  fi
  [ -r /etc/resolv.conf ] || skip "no /etc/resolv.conf to resolve the Debian mirror in the chroot"
  log=$(mktemp)
  mkdir -p "$root"
  touch "$root/.mla_ext_partial"
  debootstrap --variant=minbase "$suite" "$root" http://deb.debian.org/debian >"$log" 2>&1 ||
    { tail -5 "$log"; skip "debootstrap of Debian $suite failed"; }
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  # Check-Valid-Until off: a mirror that serves a fixed snapshot of unstable has Release files
  # past their (one-week) validity.
  in_root "apt-get -o Acquire::Check-Valid-Until=false update -qq && apt-get install -y -qq hipcc" >"$log" 2>&1 ||
    { tail -5 "$log"; skip "hipcc did not install in the Debian $suite chroot"; }
  mount_proc
  version=$(in_root "hipcc --version" 2>/dev/null) || skip "hipcc does not run in the chroot"
  version=${version%%$'\n'*}
  touch "$stamp"
  echo "$name: chroot with $version in $((SECONDS - t0)) s"
fi
mount_proc
work=$(mktemp -d "$root/tmp/mla_ext.XXXXXX")
mkdir -p "$work/tests"
cp -r csrc "$work/"
cp -r tests/compile "$work/tests/"
offload=""
for a in "${archs[@]}"; do offload+=" --offload-arch=$a"; done
# The kernels, every instance; then the C API as CMake's HIP build (-DMLA_EXT_GPU=HIP) compiles it.
for src in tests/compile/kernels_check.cu csrc/capi/mla_ext_capi.cu; do
  echo "hipcc ($suite)${offload}: $src"
  in_root "cd ${work#"$root"} && hipcc$offload -std=c++17 -O2 -fPIC -Wall -Wextra -Werror=return-type \
    -Icsrc/include -Icsrc/cpu -Icsrc/torch -Icsrc/capi -x hip -c $src -o $(basename "$src").o" \
    >"$work/log" 2>&1 || { cat "$work/log"; echo "$name: FAILED"; exit 1; }
  if grep -q "csrc/.*warning:" "$work/log"; then
    cat "$work/log"
    echo "$name: FAILED (warnings from csrc/)"
    exit 1
  fi
done
echo "$name: ok ($((SECONDS - t0)) s)"
