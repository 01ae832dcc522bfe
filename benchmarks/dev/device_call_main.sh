#!/bin/bash
# A short device call on one prebuilt build (carry [".dev"]): what a kernel default change needs
# first. Writes at most 6 files straight into $OUT (the device returns only a few), most
# important first, so a call cut off by its limit still brings back what finished:
#   1. compute-sanitizer memcheck over tests/gpu_dev/sanitize_case.py's V3.2 cases (the A16 tile
#      at 9-16 heads included);  2. test_gpu_asym16_switch;  3. the full bench_decode.py grid;
#   4. synccheck over the same cases.
#   bash benchmarks/dev/device_call_main.sh main      (.dev/main from tools/build_variant.sh)
set -u
B=${1:?build}; T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLA_EXT_SANITIZE_KINDS=v32 MLA_EXT_SANITIZE_SKIP_MERGE=1
cp ".dev/$B/_C.abi3.so" ".dev/$B/_build_info.py" mla_ext/ || exit 1
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader; python3 -m mla_ext.cli info; } \
  > "$OUT/info.txt" 2>&1; head -1 "$OUT/info.txt"
run_san() {
  timeout "$2" compute-sanitizer --tool "$1" --error-exitcode 9 python3 tests/gpu_dev/sanitize_case.py > "$OUT/san_$1.log" 2>&1
  echo "$1 rc $? $(el) s: $(grep -E 'ERROR SUMMARY' "$OUT/san_$1.log" | tail -1) $(tail -1 "$OUT/san_$1.log")"
}
run_san memcheck 150
timeout 90 python3 -m pytest -q -rfEs -p no:cacheprovider tests/test_sparse_mla_decode.py -k asym16_switch > "$OUT/switch.log" 2>&1
echo "switch rc $? $(el) s: $(tail -1 "$OUT/switch.log")"
timeout 100 python3 benchmarks/bench_decode.py --json "$OUT/decode.json" > "$OUT/decode.log" 2>&1
echo "bench_decode rc $? $(el) s"
run_san synccheck 120
grep -E "^v32 " "$OUT/decode.log" | head -24
