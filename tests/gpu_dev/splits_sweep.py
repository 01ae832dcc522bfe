"""Time sparse_mla_decode against explicit split counts (CUDA-graph replay, L2-cold sets).

Answers: is the automatic split count right at small num_tokens, where a call is latency-bound
(a split kernel, then the split reduction: inside a thread-block cluster on sm_90+ for 2..8
splits, else a separate reduce kernel)? Each shape is timed with the cluster reduction allowed
("cluster") and with the reduce kernel forced ("kernel"). Prints one table.
Usage: python3 tests/gpu_dev/splits_sweep.py
"""
import torch
from tabulate import tabulate

from mla_ext.bench import build_decode_sets, time_graph

SHAPES = [("v4_swa", 8, 1), ("v4_swa", 64, 1), ("v4_c4", 8, 1), ("v4_c4", 64, 1), ("v4_c128", 8, 1),
          ("v4_c128", 64, 1), ("v32", 16, 1), ("v32", 128, 1), ("v4_c4", 8, 16), ("v4_swa", 8, 16)]
SPLITS = [0, 1, 2, 4, 6, 8, 12, 16, 32]
rows = []
for kind, heads, batch in SHAPES:
    ds = build_decode_sets(kind, batch=batch, num_heads=heads, context_len=(24576, 40960), sets=16, device="cuda")
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    for mode in ("cluster", "kernel"):
        prev = torch.ops.mla_ext._set_no_cluster_reduce(mode == "kernel")
        try:
            row = [kind, heads, batch, int(ds.rows_per_call), mode]
            for s in SPLITS:
                calls = [lambda r=r: ds._op(**ds.kwargs[r], output=ds.outputs[r], workspace=ws, lse=ds.lses[r],
                                            num_splits=s) for r in range(ds.sets)]
                row.append(round(time_graph(calls), 1))
        finally:
            torch.ops.mla_ext._set_no_cluster_reduce(prev)
        rows.append(row)
    del ds
print(tabulate(rows, headers=["kind", "H", "T", "rows", "reduce"] + [f"S={s}" if s else "auto" for s in SPLITS]))
