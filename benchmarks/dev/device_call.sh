#!/bin/bash
# One device call (<= 600 s) for the decode's and merge's measurements, run in the repository
# root on the GPU machine (carry [".dev"]). The device returns only a few files from $OUT, so
# write into a folder and pack it:
#
#   R=$OUT; mkdir -p $R/r; OUT=$R/r bash benchmarks/dev/device_call.sh main > $R/r/call.log 2>&1;
#   tail -45 $R/r/call.log; tar czf $R/all.tgz -C $R r && rm -rf $R/r
#
# BASE (and A16, by default BASE): folders under .dev/ made by tools/build_variant.sh.
#  1. bench_merge.py, host_time_ab.py and the full bench_decode.py grid on BASE (RESULTS.md);
#  2. two rounds of the A16 16-head tile against the mma.sync tile on A16's build:
#     MLA_EXT_ASYM16=0 (never) / 1 (wherever it applies) / 2 (the launch rule, the default since
#     the fifty-fifth session: V3.2 splits of >= 320 entries since 5e02a3b's successor, 512 before), at C4 Pro, C128 and V3.2 x 8-16
#     heads x 16-512 tokens, modes 1 and 2 through --baseline against mode 0 of the round;
#  3. the gather probe (benchmarks/dev/v4_gather_probe.cu, compiled there, 3 s);
#  4. test_gpu_asym16_switch on A16; then every GPU test on A16 under the launch rule
#     (MLA_EXT_ASYM16=2) through tools/device_check.sh with the time left (logs and per-test times under $OUT/tests).
# Prints a short table last. ~320 s on an H100 (fifty-fifth session). Preparation on the CPU
# machine (~90 s; .dev/ is git-ignored):
#   PYTHON=<python with the cu130 torch> tools/build_variant.sh main HEAD
set -u
BASE=${1:?BASE}; A16=${2:-$BASE}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
use() { cp ".dev/$1/_C.abi3.so" ".dev/$1/_build_info.py" mla_ext/; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader | tee "$OUT/smi.txt"
use "$BASE"
python3 -c "import mla_ext, torch; print(mla_ext.__file__, torch.__version__, torch.cuda.get_device_name())"
echo "== bench_merge $(el)"; timeout 60 python3 benchmarks/bench_merge.py --json "$OUT/merge.json" > "$OUT/merge.log" 2>&1; echo rc $?
echo "== host_time_ab $(el)"; timeout 40 python3 benchmarks/dev/host_time_ab.py --rounds 3 > "$OUT/host.log" 2>&1; echo rc $?
echo "== bench_decode $(el)"; timeout 90 python3 benchmarks/bench_decode.py --json "$OUT/decode.json" > "$OUT/decode.log" 2>&1; echo rc $?
G=(--layers v4_c4_pro,v4_c128,v32 --heads 8,16 --tokens 16,64,128,512)
use "$A16"
for r in 1 2; do
  for m in 0 1 2; do
    b=(); [ $m != 0 ] && b=(--baseline "$OUT/ab_r${r}_m0.json")
    echo "== A16 round $r mode $m $(el)"
    MLA_EXT_ASYM16=$m timeout 60 python3 benchmarks/bench_decode.py "${G[@]}" "${b[@]}" --json "$OUT/ab_r${r}_m$m.json" \
      > "$OUT/ab_r${r}_m$m.log" 2>&1; echo rc $?
  done
done
echo "== gather probe $(el)"
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/gp benchmarks/dev/v4_gather_probe.cu && timeout 60 /tmp/gp > "$OUT/gp.log" 2>&1; echo rc $?
echo "== asym16 switch test on $A16 $(el)"
timeout 60 python3 -m pytest -q tests/test_sparse_mla_decode.py -k asym16_switch > "$OUT/switch.log" 2>&1; echo rc $?; tail -2 "$OUT/switch.log"
left=$(( 560 - $(el) )); [ $left -gt 300 ] && left=300
# On A16 under the launch rule (MLA_EXT_ASYM16=2, the candidate default): every kernel but
# A16 is BASE's, and A16 runs where the rule picks it.
echo "== GPU tests on $A16, MLA_EXT_ASYM16=2 (tools/device_check.sh), limit $left s $(el)"
MLA_EXT_ASYM16=2 OUT="$OUT/tests" PREBUILT=".dev/$A16" PYTEST_LIMIT=$left tools/device_check.sh; echo rc $?
sort -rn "$OUT/tests/test_times.txt" 2>/dev/null | head -5
echo "== end $(el)"
tail -4 "$OUT/merge.log"; tail -6 "$OUT/host.log"
python3 - "$OUT" <<'PY'
import json, os, sys
from tabulate import tabulate
out = sys.argv[1]
def rows(n):
    p = os.path.join(out, n)
    return {(r["layer"], r["H"], r["T"]): r for r in json.load(open(p))["rows"]} if os.path.exists(p) else {}
r10, r11, r12, r21, r22 = (rows(f"ab_r{n}.json") for n in ("1_m0", "1_m1", "1_m2", "2_m1", "2_m2"))
t = [[*k, v["us"], v.get("gather_us"), *(d.get(k, {}).get("vs_base") for d in (r11, r21, r12, r22)),
      max(d.get(k, {}).get("max_rel_err", 0) for d in (r11, r12))] for k, v in r10.items()]
print(tabulate(t, headers=["layer", "H", "T", "mma_us", "gather_us", "A16 r1", "A16 r2", "rule r1", "rule r2", "err"],
               floatfmt=".4g"))
PY
head -40 "$OUT/gp.log"
