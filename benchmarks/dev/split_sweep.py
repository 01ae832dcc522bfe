"""Dev probe: µs per call (graph replay, L2-cold input sets) at explicit split counts beside the
automatic one (num_splits=0), for a few shapes. A count written S@HT also forces the GPU head
tile HT (torch.ops.mla_ext._set_head_tile; the workspace does not depend on it).

    python3 benchmarks/dev/split_sweep.py layer:H:T:S1/S2@HT/... [...]
"""
import sys

import torch

from mla_ext import DecodeWorkspace
from mla_ext.bench import build_layer_sets, time_graph

for spec in sys.argv[1:]:
    layer, H, T, counts = spec.split(":")
    H, T = int(H), int(T)
    ds = build_layer_sets(layer, num_tokens=T, num_heads=H)
    res = []
    for c in ["0"] + counts.split("/"):
        S, _, ht = c.partition("@")
        S, ht = int(S), int(ht or 0)
        ws = DecodeWorkspace(T, H, num_splits=S, device="cuda").tensor
        torch.ops.mla_ext._set_head_tile(ht)
        try:
            res.append(f"S={S or 'auto'}{'@' + str(ht) if ht else ''}: {time_graph(ds.calls(ws, S)):.2f}")
        finally:
            torch.ops.mla_ext._set_head_tile(0)
        del ws
    print(f"{layer} H={H} T={T}: " + ", ".join(res), flush=True)
    del ds
    torch.cuda.empty_cache()
