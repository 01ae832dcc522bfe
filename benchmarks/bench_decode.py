"""sparse_mla_decode benchmark (GPU), with its ceilings measured in the same run.

Per shape: median µs per call under CUDA-graph replay with L2-cold inputs (the graph cycles over
token slices of one build, each slice selecting its own requests' rows), GB/s of KV bytes
gathered, TFLOP/s (2·H·(d_qk + 512) per selected row), % of the roofline
max(bytes / copy bandwidth, flops / bf16 matmul rate), and the time of a plain warp-per-row
kernel gathering as many random rows of the same cache (16-byte loads) as a third ceiling.

Layers (DESIGN.md §4): v4_swa (sliding window 128, page 256), v4_c4_flash / v4_c4_pro (window +
top-k 512 / 1024 of 4:1 rows, page 64, sink), v4_c128 (window + 8192 128:1 rows, page 2),
v4_c128_mixed (one token 8192 rows, the others ~500), v32 (top-k 2048, page 64, fp8_ds_mla).

Usage: python benchmarks/bench_decode.py [--quick] [--json FILE] [--baseline FILE] [--ab-mma-sync]

--baseline FILE (a --json file of an earlier run: another build, commit or environment switch)
adds the columns us_base and vs_base = us / us_base (below 1: faster now) for the shapes both
runs have. A/B of two builds: run each build with --json, the second with --baseline the first's;
alternate the order over rounds (the GPU's state drifts between processes).

--ab-mma-sync times every shape a second time with the 64-head blocks forced onto the mma.sync
kernel (torch.ops.mla_ext._set_force_mma_sync; Hopper runs them on warpgroup MMAs otherwise) and
reports the ratio, an A/B of the two kernels in one build and one process.
"""
import argparse
import json

import torch
from tabulate import tabulate

from mla_ext.bench import (DECODE_LAYERS, compare_to_baseline, copy_bandwidth_gbs, matmul_tflops, measure_decode,
                           require_gpu)

FULL = dict(heads=[8, 16, 64, 128], tokens=[1, 16, 64, 128, 512])
QUICK = dict(heads=[16, 128], tokens=[1, 64])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="heads {16,128} x tokens {1,64}")
    ap.add_argument("--layers", default=",".join(DECODE_LAYERS))
    ap.add_argument("--heads", help="comma list, overrides the grid's heads")
    ap.add_argument("--tokens", help="comma list, overrides the grid's num_tokens")
    ap.add_argument("--json")
    ap.add_argument("--baseline", metavar="FILE", help="a --json file of an earlier run: columns us_base, vs_base")
    ap.add_argument("--ab-mma-sync", action="store_true",
                    help="also time each shape on the forced mma.sync kernel (columns us_mma_sync, ratio)")
    args = ap.parse_args()
    require_gpu("bench_decode.py")
    baseline = None
    if args.baseline:
        with open(args.baseline) as f:  # read first: a bad file fails before any measuring
            baseline = json.load(f)["rows"]
    grid = dict(QUICK if args.quick else FULL)
    if args.heads:
        grid["heads"] = [int(x) for x in args.heads.split(",")]
    if args.tokens:
        grid["tokens"] = [int(x) for x in args.tokens.split(",")]
    bw = copy_bandwidth_gbs(nbytes=512 << 20)
    mm = matmul_tflops()
    rows = []
    for layer in args.layers.split(","):
        for h in grid["heads"]:
            for t in grid["tokens"]:
                try:
                    row = measure_decode(layer, h, t, copy_gbs=bw, mm_tflops=mm)
                    if args.ab_mma_sync:
                        prev = torch.ops.mla_ext._set_force_mma_sync(True)
                        try:
                            alt = measure_decode(layer, h, t, copy_gbs=bw, mm_tflops=mm, with_gather=False)
                        finally:
                            torch.ops.mla_ext._set_force_mma_sync(prev)
                        row["us_mma_sync"] = alt["us"]
                        row["ratio"] = row["us"] / alt["us"]
                    rows.append(row)
                except torch.OutOfMemoryError:
                    rows.append(dict(layer=layer, H=h, T=t, us=float("nan")))
                    torch.cuda.empty_cache()
                print(rows[-1], flush=True)
    cols = ["layer", "H", "T", "rows", "us", "GBps", "TFLOPs", "pct_roofline", "gather_us", "pct_gather",
            "max_rel_err"] + (["us_mma_sync", "ratio"] if args.ab_mma_sync else [])
    if baseline is not None:
        n = compare_to_baseline(rows, baseline)
        print(f"baseline {args.baseline}: {n} of {len(rows)} shapes matched")
        cols += ["us_base", "vs_base"]
    print(f"\nsparse_mla_decode, {torch.cuda.get_device_name()}: copy {bw:.0f} GB/s, bf16 matmul {mm:.0f} TFLOP/s")
    print(tabulate([[r.get(c, "") for c in cols] for r in rows], headers=cols, floatfmt=".5g"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_GBps": bw, "matmul_TFLOPs": mm, "device": torch.cuda.get_device_name(),
                       "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
