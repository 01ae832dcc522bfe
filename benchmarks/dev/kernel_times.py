"""Per-kernel GPU time of sparse_mla_decode calls (torch.profiler), to split a call's time between
its split kernel and its reduce (thirty-seventh session: where the active splits' fixed costs at
257-512 tokens go).

Eager calls over the shape's L2-cold input sets (as the sweeps' graphs replay them), `--rounds`
passes; prints, per shape and split count, the mean µs per call of each kernel name (split /
reduce / other; a programmatic launch's kernel counts from its start, so the reduce's time
includes its wait for the split kernel), their sum, and the call's time under graph replay
(mla_ext.bench.time_graph). Layers as c128_length_sweep.py (its band layers included). Run from
the repository root on a GPU, e.g.

  python benchmarks/dev/kernel_times.py --shapes c128r1k_mixed:8:512,v4_c128_mixed:8:512 --splits 0,1
"""
import argparse
import os
import sys
from collections import defaultdict

import torch
from tabulate import tabulate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import c128_length_sweep  # noqa: E402

c128_length_sweep.install()
import mla_ext  # noqa: E402
from mla_ext.bench import build_layer_sets, sweep_shapes, time_graph  # noqa: E402
from mla_ext.cli import _int_list  # noqa: E402


def kind(name: str) -> str:
    if "reduce" in name:
        return "reduce"
    return "split" if "decode" in name else "other"


ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--shapes", required=True, help="layer:num_heads:num_tokens, comma-separated")
ap.add_argument("--splits", type=_int_list, default="0", help="split counts (0 = automatic)")
ap.add_argument("--rounds", type=int, default=5, help="passes over the input sets")
args = ap.parse_args()
rows = []
for layer, heads, batch in sweep_shapes(ap, args.shapes, "kernel_times.py"):
    ds = build_layer_sets(layer, num_tokens=batch, num_heads=heads)
    nbytes = max(mla_ext.sparse_mla_decode_workspace_size(batch, heads, num_splits=s, device="cuda")
                 for s in args.splits)
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda")
    for s in args.splits:
        calls = ds.calls(ws, s)
        for fn in calls:  # warm-up: module load, lazy init
            fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.rounds):
                for fn in calls:
                    fn()
            torch.cuda.synchronize()
        per = defaultdict(float)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                per[kind(e.name)] += e.time_range.elapsed_us()
        n = args.rounds * len(calls)
        t = {k: round(v / n, 2) for k, v in per.items()}
        rows.append([layer, heads, batch, s or "auto", t.get("split", 0.0), t.get("reduce", 0.0),
                     t.get("other", 0.0), round(sum(t.values()), 2), round(time_graph(calls), 2)])
        print(*rows[-1], file=sys.stderr, flush=True)
    del ds, ws
print(tabulate(rows, headers=["layer", "H", "T", "S", "split us", "reduce us", "other us", "sum us", "graph us"]))
