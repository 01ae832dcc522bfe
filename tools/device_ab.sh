#!/usr/bin/env bash
# A/B of a kernel change on the GPU machine: both variants built and benchmarked in one session,
# so the comparison shares the machine, clocks and process order (run-to-run spread between
# machines is +-2-4% on the decode benchmark, larger than most single changes).
#
# Usage (on the GPU machine, from the repository root, in a git checkout):
#   tools/device_ab.sh PATCH [benchmarks/bench_decode.py args...]
#     A = the working tree as it is; B = the same with PATCH (`git apply`) on top.
#     Each variant is built (pip install -e), then benchmarked twice with the given args;
#     the table printed last has both runs of each variant and B / A of the best of two.
#   TESTS="pytest -k expression" also runs tests/test_sparse_mla_decode.py -k TESTS on B.
# Logs and JSON go to $OUT (or ./device_out). The tree is restored (`git apply -R`) at the end.
# Calibration (H200, twelfth session): a comment-only patch (same SASS) gave B / A 0.968-1.001 over
# 18 decode shapes, median 0.991: B, built and measured second, reads ~1% fast, up to 3% on a
# 40 us shape. Treat smaller differences as noise, or repeat with the roles swapped (apply the
# patch to the tree and pass its reverse, `git diff -R`) and average the two.
# Example (twelfth session): a patch turning on whole K stores in the balanced-map kernel,
#   tools/device_ab.sh /tmp/bal.patch --layers v4_c128,v4_c128_mixed --heads 64,128 --tokens 16,64,128
set -uo pipefail
[ $# -ge 1 ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
PATCH=$(realpath "$1"); shift
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
git apply --check "$PATCH" || { echo "device_ab: $PATCH does not apply to this tree" >&2; exit 2; }
t0=$(date +%s)
build() {  # $1: variant name
  python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build_$1.log" 2>&1 \
    || { tail -40 "$OUT/build_$1.log"; return 1; }
  echo "device_ab: built $1 ($(( $(date +%s) - t0 )) s)"
}
bench() {  # $1: variant name; runs 1 and 2
  for run in 1 2; do
    python3 benchmarks/bench_decode.py "${BENCH_ARGS[@]}" --json "$OUT/$1$run.json" > "$OUT/$1$run.log" 2>&1 \
      || { echo "device_ab: benchmark $1$run failed (rc $?)"; tail -20 "$OUT/$1$run.log"; return 1; }
  done
}
BENCH_ARGS=("$@")
status=0
build A && bench A || status=1
if [ $status -eq 0 ]; then
  git apply "$PATCH" || { echo "device_ab: git apply failed" >&2; exit 1; }
  trap 'git apply -R "$PATCH"' EXIT
  build B && bench B || status=1
  if [ $status -eq 0 ] && [ -n "${TESTS:-}" ]; then
    python3 -m pytest -q -rfE -n 4 -p no:cacheprovider tests/test_sparse_mla_decode.py -k "$TESTS" \
      > "$OUT/tests_B.log" 2>&1
    echo "device_ab: tests on B rc=$? ($(tail -1 "$OUT/tests_B.log"))"
    grep -E "^(FAILED|ERROR)" "$OUT/tests_B.log" | head
  fi
fi
[ $status -eq 0 ] || exit 1
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def load(name):
    return {(r["layer"], r["H"], r["T"]): r["us"] for r in json.load(open(f"{out}/{name}.json"))["rows"]}
a1, a2, b1, b2 = (load(n) for n in ("A1", "A2", "B1", "B2"))
print(f"{'layer':14s} {'H':>4s} {'T':>4s} {'A run 1':>9s} {'A run 2':>9s} {'B run 1':>9s} {'B run 2':>9s}  B/A (best)")
for k in a1:
    a, b = min(a1[k], a2[k]), min(b1[k], b2[k])
    print(f"{k[0]:14s} {k[1]:4d} {k[2]:4d} {a1[k]:9.1f} {a2[k]:9.1f} {b1[k]:9.1f} {b2[k]:9.1f}  {b / a:.3f}")
PY
echo "device_ab: $(( $(date +%s) - t0 )) s"
