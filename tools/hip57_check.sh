#!/usr/bin/env bash
# Compile-only check of the torch-free kernel headers for gfx942 (MI300, the CDNA3 target AMD
# engines run) with Debian 13's hipcc 5.7 (clang 17), which knows gfx942 where Debian 12's
# hipcc 5.2 (compile_check.sh, hipify_check.sh: gfx90a and gfx940) does not. Debian 13 comes as a
# minimal debootstrap chroot (~25 s, plus ~20 s for hipcc; kept in $MLA_EXT_TRIXIE_ROOT,
# default /tmp/mla_ext_trixie, and reused). It compiles tests/compile/kernels_check.cu, which
# instantiates every kernel, and fails on an error or on any warning from csrc/.
# Building the chroot needs root and the Debian mirror; where either is missing the check says
# so and exits 0 (a missing tool is not a kernel defect).
set -euo pipefail
cd "$(dirname "$0")/.."
root=${MLA_EXT_TRIXIE_ROOT:-/tmp/mla_ext_trixie}
skip() { echo "hip57_check: skipped ($1)"; exit 0; }
t0=$SECONDS
if [ ! -x "$root/usr/bin/hipcc" ]; then
  [ "$(id -u)" = 0 ] || skip "debootstrap and chroot need root"
  if ! command -v debootstrap >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap) >/dev/null 2>&1 ||
      skip "cannot install debootstrap"
  fi
  log=$(mktemp)
  rm -rf "$root"
  debootstrap --variant=minbase trixie "$root" http://deb.debian.org/debian >"$log" 2>&1 ||
    { tail -5 "$log"; rm -rf "$root"; skip "debootstrap of Debian 13 failed"; }
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  chroot "$root" bash -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hipcc" >"$log" 2>&1 ||
    { tail -5 "$log"; rm -rf "$root"; skip "hipcc did not install in the Debian 13 chroot"; }
  echo "hip57_check: Debian 13 chroot with $(chroot "$root" hipcc --version 2>/dev/null | head -1) in $((SECONDS - t0)) s"
fi
work=$(mktemp -d "$root/tmp/mla_ext.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tests"
cp -r csrc "$work/"
cp -r tests/compile "$work/tests/"
rel=${work#"$root"}
echo "hipcc 5.7 gfx942: tests/compile/kernels_check.cu"
chroot "$root" bash -c "cd $rel && HIP_PLATFORM=amd hipcc --offload-arch=gfx942 -std=c++17 -O2 -Werror=return-type \
  -Icsrc/include -Icsrc/cpu -Icsrc/torch -x hip -c tests/compile/kernels_check.cu -o kernels_check.o" \
  >"$work/log" 2>&1 || { cat "$work/log"; echo "hip57_check: FAILED"; exit 1; }
if grep -q "csrc/.*warning:" "$work/log"; then
  cat "$work/log"
  echo "hip57_check: FAILED (warnings from csrc/)"
  exit 1
fi
echo "hip57_check: ok ($((SECONDS - t0)) s)"
