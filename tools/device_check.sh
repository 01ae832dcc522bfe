#!/usr/bin/env bash
# One device session: build for sm_90a, run the test suite on the GPU, run benchmarks.
# Usage (on the GPU machine, from the repository root):
#   tools/device_check.sh [pytest args...]      (GPU tests; ALL_TESTS=1 for all) BENCH="merge decode" to choose benchmarks,
#   SANITIZE="memcheck racecheck" to run compute-sanitizer on tests/gpu_dev/sanitize_case.py,
#   PREBUILT=DIR to use a build made elsewhere (tools/build_variant.sh's .dev/NAME, carried)
#   instead of building here: its _C*.so and _build_info.py are copied into mla_ext/;
#   PYTEST_LIMIT=SECONDS stops the test run after that long (to end inside a device call).
# Logs go to $OUT (or ./device_out); a short table is printed last.
set -uo pipefail
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
export MAX_JOBS=${MAX_JOBS:-16}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
t0=$(date +%s)
if [ -n "${PREBUILT:-}" ]; then
  cp "$PREBUILT"/_C*.so "$PREBUILT/_build_info.py" mla_ext/ || exit 1
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  echo "build: $PREBUILT"
else
  python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 \
    || { tail -50 "$OUT/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
python3 -m mla_ext.cli info > "$OUT/info.txt" 2>&1
# The GPU tests only (CI runs the rest), spread over pytest-xdist workers where it is installed:
# the whole directory serially takes longer than a device call may (twenty-seventh session: 29
# tests in 240 s, the CLI's first); `-n 12 -k "(cuda or gpu) and not portable"` ran 719 in 350 s.
# ALL_TESTS=1 runs every test; PYTEST_WORKERS sets the worker count (0: serial).
XDIST=()
if [ "${PYTEST_WORKERS:-12}" != 0 ] && python3 -c "import xdist" 2>/dev/null; then XDIST=(-n "${PYTEST_WORKERS:-12}"); fi
SELECT=(-k "cuda or gpu")
[ "${ALL_TESTS:-0}" = 1 ] && SELECT=()
# Per-test times as each test ends ($OUT/test_times.txt: a run cut off by the device call's limit
# still says where the time went); each xdist worker's torch takes its share of the cores
# (tests/conftest.py).
MLA_EXT_TEST_TIMES="$OUT/test_times.txt" ${PYTEST_LIMIT:+timeout "$PYTEST_LIMIT"} \
python3 -X faulthandler -m pytest -q -rfEs -p no:cacheprovider --timeout=300 "${XDIST[@]}" "${SELECT[@]}" "$@" tests \
  > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? ($(tail -1 "$OUT/pytest.log"))"
if [ -n "${SANITIZE:-}" ]; then  # SANITIZE="memcheck racecheck synccheck"
  for tool in $SANITIZE; do
    timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 9 python3 tests/gpu_dev/sanitize_case.py \
      > "$OUT/sanitize_$tool.log" 2>&1
    echo "compute-sanitizer $tool rc=$? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1))"
  done
fi
for b in ${BENCH:-}; do
  python3 benchmarks/bench_$b.py --json "$OUT/bench_$b.json" > "$OUT/bench_$b.log" 2>&1
  echo "bench_$b rc=$?"
done
grep -E "^(FAILED|ERROR)|Fatal|Segmentation" "$OUT/pytest.log" | head -30
for b in ${BENCH:-}; do tail -25 "$OUT/bench_$b.log"; done
