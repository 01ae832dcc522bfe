"""Time sparse_mla_decode against explicit split counts (CUDA-graph replay, L2-cold sets).

Answers: is the automatic split count right at small num_tokens, where a call is latency-bound
(a split kernel, then a reduce kernel when num_splits > 1)? Prints one table.
Usage: python3 tests/gpu_dev/splits_sweep.py
"""
import torch
from tabulate import tabulate

from mla_ext.bench import build_decode_sets, time_graph

SHAPES = [("v4_swa", 8, 1), ("v4_swa", 64, 1), ("v4_c4", 8, 1), ("v4_c4", 64, 1), ("v4_c128", 8, 1),
          ("v4_c128", 64, 1), ("v32", 16, 1), ("v32", 128, 1), ("v4_c4", 8, 16), ("v4_swa", 8, 16)]
SPLITS = [0, 1, 2, 4, 8, 12, 16, 24, 32, 64]
rows = []
for kind, heads, batch in SHAPES:
    ds = build_decode_sets(kind, batch=batch, num_heads=heads, context_len=(24576, 40960), sets=16, device="cuda")
    row = [kind, heads, batch, int(ds.rows_per_call)]
    for s in SPLITS:
        ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        calls = [lambda r=r: ds._op(**ds.kwargs[r], output=ds.outputs[r], workspace=ws, lse=ds.lses[r], num_splits=s)
                 for r in range(ds.sets)]
        row.append(round(time_graph(calls), 1))
    rows.append(row)
    del ds
print(tabulate(rows, headers=["kind", "H", "T", "rows"] + [f"S={s}" if s else "auto" for s in SPLITS]))
