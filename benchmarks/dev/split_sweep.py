"""Dev probe: µs per call (graph replay, L2-cold input sets) at explicit split counts beside the
automatic one (num_splits=0), for a few shapes.

    python3 benchmarks/dev/split_sweep.py layer:H:T:S1/S2/... [...]
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
    for S in [0] + [int(c) for c in counts.split("/")]:
        ws = DecodeWorkspace(T, H, num_splits=S, device="cuda").tensor
        res.append(f"S={S or 'auto'}: {time_graph(ds.calls(ws, S)):.2f}")
        del ws
    print(f"{layer} H={H} T={T}: " + ", ".join(res), flush=True)
    del ds
    torch.cuda.empty_cache()
