"""Time sparse_mla_decode against explicit split counts (CUDA-graph replay, L2-cold sets).

Answers: is the automatic split count right at small num_tokens, where a call is latency-bound
(a split kernel, then a reduce kernel when num_splits > 1)? Prints one table (µs per call;
"auto" is num_splits=0). Layers as benchmarks/bench_decode.py (mla_ext.bench.DECODE_LAYERS).
Usage: python3 tests/gpu_dev/splits_sweep.py [--shapes v4_c128:128:2,v32:64:1] [--splits 0,16,32]
"""
import argparse
import sys

import torch
from tabulate import tabulate

import mla_ext
from mla_ext.bench import build_layer_sets, sweep_shapes, time_graph
from mla_ext.cli import _int_list

DEFAULT_SHAPES = ("v4_swa:8:1,v4_swa:64:1,v4_c4_flash:8:1,v4_c4_flash:64:1,v4_c128:8:1,v4_c128:64:1,"
                  "v32:16:1,v32:128:1,v4_c4_flash:8:16,v4_swa:8:16")
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="layer:num_heads:num_tokens, comma-separated")
ap.add_argument("--splits", type=_int_list, default="0,1,2,4,8,12,16,24,32,64", help="split counts (0 = automatic)")
args = ap.parse_args()
splits = args.splits
shapes = sweep_shapes(ap, args.shapes, "splits_sweep.py")
rows = []
for layer, heads, batch in shapes:
    ds = build_layer_sets(layer, num_tokens=batch, num_heads=heads)
    # one workspace per shape, as large as the largest split count asks
    nbytes = max(mla_ext.sparse_mla_decode_workspace_size(batch, heads, num_splits=s, device="cuda") for s in splits)
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda")
    row = [layer, heads, batch, int(ds.rows_per_call)]
    for s in splits:
        row.append(round(time_graph(ds.calls(ws, s)), 2))
    rows.append(row)
    print(*row, file=sys.stderr, flush=True)  # progress, in case a later shape fails
    del ds, ws
print(tabulate(rows, headers=["layer", "H", "T", "rows"] + [f"S={s}" if s else "auto" for s in splits]))
