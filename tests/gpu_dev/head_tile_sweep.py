"""Time sparse_mla_decode with each GPU head tile forced (CUDA-graph replay, L2-cold sets).

Answers: at small num_tokens, where the 64-head blocks of a 64-128-head call leave most
processors idle, do smaller head tiles (more blocks, shorter chains) win, and does the automatic
choice (decode_launch_head_tile) pick the best? Prints one table (µs per call).
Usage: python3 tests/gpu_dev/head_tile_sweep.py
"""
import torch
from tabulate import tabulate

from mla_ext.bench import build_layer_sets, require_gpu, time_graph

LAYERS = ["v4_swa", "v4_c4_flash", "v4_c4_pro", "v4_c128", "v32"]
SHAPES = ([(k, h, t) for k in LAYERS for h in (64, 128) for t in (1, 2, 4)]
          + [("v4_c4_flash", 32, 1), ("v4_c4_flash", 128, 16), ("v4_c128_mixed", 128, 2)])
TILES = [0, 16, 32, 64]
require_gpu("head_tile_sweep.py")
rows = []
ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
for layer, heads, batch in SHAPES:
    ds = build_layer_sets(layer, num_tokens=batch, num_heads=heads)
    row = [layer, heads, batch, int(ds.rows_per_call)]
    for tile in TILES:
        prev = torch.ops.mla_ext._set_head_tile(tile)
        try:
            row.append(round(time_graph(ds.calls(ws)), 2))
        finally:
            torch.ops.mla_ext._set_head_tile(prev)
    rows.append(row)
    del ds
print(tabulate(rows, headers=["layer", "H", "T", "rows"] + [f"HT={t}" if t else "auto" for t in TILES]))
