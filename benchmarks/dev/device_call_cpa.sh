#!/bin/bash
# One device call (<= 600 s) for the cp.async raw-row gather of the 16-head mma.sync tile
# (MLA_EXT_DECODE_CPA; benchmarks/dev/cpa2.patch, cpa3.patch): BASE against each variant, all
# builds from tools/build_variant.sh (carry [".dev/BASE", ".dev/V1", ...]).
#
#   R=$OUT; mkdir -p $R/r; OUT=$R/r bash benchmarks/dev/device_call_cpa.sh main3 cpa2 cpa3 > $R/r/call.log 2>&1;
#   tail -50 $R/r/call.log; tar czf $R/all.tgz -C $R r && rm -rf $R/r
#
#  1. tests/gpu_dev/sanitize_case.py's V4 cases on each variant (values against the reference);
#  2. two rounds, builds alternating, of V4 C4 Pro, C128 and the window layer x 8-16 heads x
#     1-512 tokens, each variant through --baseline against the round's BASE run;
#  3. compute-sanitizer memcheck over the V4 cases on the first variant;
#  4. every GPU test on the first variant (tools/device_check.sh) with the time left.
set -u
BASE=${1:?BASE}; shift; VARS=("$@")
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLA_EXT_SANITIZE_KINDS=v4_swa,v4_c4,v4_c128 MLA_EXT_SANITIZE_SKIP_MERGE=1
use() { cp ".dev/$1/_C.abi3.so" ".dev/$1/_build_info.py" mla_ext/; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader | tee "$OUT/smi.txt"
for v in "${VARS[@]}"; do
  use "$v"
  timeout 60 python3 tests/gpu_dev/sanitize_case.py > "$OUT/cases_$v.log" 2>&1
  echo "cases on $v rc $? $(el) s: $(grep -c ' ok' "$OUT/cases_$v.log") ok, $(grep -c FAIL "$OUT/cases_$v.log") FAIL"
done
G=(--layers v4_c4_pro,v4_c128,v4_swa --heads 8,16 --tokens 1,16,64,128,512)
for r in 1 2; do
  order=("$BASE" "${VARS[@]}"); [ $r = 2 ] && order=("${VARS[@]}" "$BASE")
  for v in "${order[@]}"; do
    b=(); [ "$v" != "$BASE" ] && [ -f "$OUT/r${r}_$BASE.json" ] && b=(--baseline "$OUT/r${r}_$BASE.json")
    use "$v"
    timeout 60 python3 benchmarks/bench_decode.py "${G[@]}" "${b[@]}" --json "$OUT/r${r}_$v.json" > "$OUT/r${r}_$v.log" 2>&1
    echo "round $r $v rc $? $(el) s"
  done
done
# Round 2 ran BASE last: its variants' ratios against round 2's BASE, computed below.
use "${VARS[0]}"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/gpu_dev/sanitize_case.py > "$OUT/memcheck.log" 2>&1
echo "memcheck on ${VARS[0]} rc $? $(el) s: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
left=$(( 560 - $(el) )); [ $left -gt 240 ] && left=240
if [ $left -gt 60 ]; then
  OUT="$OUT/tests" PREBUILT=".dev/${VARS[0]}" PYTEST_LIMIT=$left tools/device_check.sh; echo "tests rc $? $(el) s"
fi
python3 - "$OUT" "$BASE" "${VARS[@]}" <<'PY'
import json, os, sys
from tabulate import tabulate
out, base, vs = sys.argv[1], sys.argv[2], sys.argv[3:]
def rows(n):
    p = os.path.join(out, n)
    return {(r["layer"], r["H"], r["T"]): r for r in json.load(open(p))["rows"]} if os.path.exists(p) else {}
b1, b2 = rows(f"r1_{base}.json"), rows(f"r2_{base}.json")
v1 = [rows(f"r1_{v}.json") for v in vs]
v2 = [rows(f"r2_{v}.json") for v in vs]
t = []
for k, r in b1.items():
    row = [*k, r["us"], r.get("gather_us")]
    for a, c in zip(v1, v2):
        row += [a.get(k, {}).get("us", float("nan")) / r["us"],
                c.get(k, {}).get("us", float("nan")) / b2.get(k, {}).get("us", float("nan"))]
    row.append(max((d.get(k, {}).get("max_rel_err", 0) for d in v1 + v2), default=0))
    t.append(row)
print(tabulate(t, headers=["layer", "H", "T", "base_us", "gather_us"] + [f"{v} r{i}" for v in vs for i in (1, 2)] + ["err"],
               floatfmt=".4g"))
PY
echo "== end $(el) s"
