"""Split and reduce kernel durations of sparse_mla_decode, against explicit split counts.

Answers: of a decode call's time, how much is the split kernel and how much the reduce, and how
does the split kernel's time grow with the tiles each split walks (rows per split / 64)? Per
shape and split count it prints the CUDA-graph time of the whole call (as the benchmark: L2-cold
input sets, `mla_ext.bench.time_graph`) and the median device duration of each kernel from the
profiler (CUPTI), the calls run one at a time with a synchronize after each, so a kernel's
duration is its own (no queueing). Run with MLA_EXT_PDL=0, or a programmatically launched reduce
also counts the time it waits for the split kernel. Layers as benchmarks/bench_decode.py
(mla_ext.bench.DECODE_LAYERS); split count 0 is the automatic one.

Usage: MLA_EXT_PDL=0 python3 tests/gpu_dev/kernel_durations.py [--shapes v4_c128:8:1] [--splits 0,17,33,130]
       [--row-placement pages|packed] [--json out.json]
"""
import argparse
import collections
import json

import torch
from tabulate import tabulate
from torch.profiler import ProfilerActivity, profile

from mla_ext.bench import build_layer_sets, sweep_shapes, time_graph
from mla_ext.cli import _int_list

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--shapes", default="v4_c128:8:1,v4_c128:16:1,v4_c4_flash:8:1",
                help="layer:num_heads:num_tokens, comma-separated")
ap.add_argument("--splits", type=_int_list, default="0,17,33,130", help="split counts (0 = automatic)")
ap.add_argument("--row-placement", default="pages", choices=["pages", "packed"],
                help="the builder's row_placement: whole pages in random order (the benchmark's), or the "
                     "selected rows back to back (how much of a tile's time is the rows' scatter)")
ap.add_argument("--json", help="also write the rows here")
args = ap.parse_args()
shapes = sweep_shapes(ap, args.shapes, "kernel_durations.py")
ws = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
rows = []
for layer, heads, batch in shapes:
    ds = build_layer_sets(layer, num_tokens=batch, num_heads=heads, row_placement=args.row_placement)
    for s in args.splits:
        calls = ds.calls(ws, s)
        graph_us = time_graph(calls)
        for fn in calls:
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                for fn in calls:
                    fn()
                    torch.cuda.synchronize()
        dur = collections.defaultdict(list)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA and "decode_" in e.name:
                dur["split" if "decode_split" in e.name else "reduce"].append(e.device_time_total)
        med = {k: sorted(v)[len(v) // 2] for k, v in dur.items()}
        rows.append(dict(layer=layer, H=heads, T=batch, splits=s, placement=args.row_placement,
                         rows=int(ds.rows_per_call), graph_us=graph_us,
                         split_us=med.get("split", 0.0), reduce_us=med.get("reduce", 0.0)))
    del ds
    torch.cuda.empty_cache()
cols = ["layer", "H", "T", "splits", "placement", "rows", "graph_us", "split_us", "reduce_us"]
print(tabulate([[r[c] for c in cols] for r in rows], headers=cols, floatfmt=".2f"))
if args.json:
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)
