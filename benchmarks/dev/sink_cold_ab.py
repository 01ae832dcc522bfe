"""Dev probe: decode µs per call (automatic split counts, CUDA-graph replay over the benchmark's
L2-cold input sets) with the benchmark's attention sink shared by every set (L2-hot after the
first replay) and with a sink tensor per set (so that, like an engine's per-layer sink, it comes
from DRAM). Writes {"layer:H:T": [hot_us, cold_us]} as JSON; run once per build and compare.

    python3 benchmarks/dev/sink_cold_ab.py out.json [layer:H:T,...]
"""
import json
import sys

from mla_ext import DecodeWorkspace
from mla_ext.bench import build_layer_sets, time_graph

shapes = [(l, h, t) for l in ("v4_swa", "v4_c4_flash", "v4_c4_pro", "v4_c128") for h in (8, 16, 128) for t in (1, 16)]
if len(sys.argv) > 2:
    shapes = [(l, int(h), int(t)) for l, h, t in (x.split(":") for x in sys.argv[2].split(","))]
res = {}
for layer, H, T in shapes:
    ds = build_layer_sets(layer, num_tokens=T, num_heads=H)
    ws = DecodeWorkspace(T, H, device="cuda").tensor
    hot = time_graph(ds.calls(ws, 0))
    cold = float("nan")
    if ds.kwargs[0].get("attn_sink") is not None:  # (V3.2 layers have no sink)
        for r in range(ds.sets):
            ds.kwargs[r]["attn_sink"] = ds.kwargs[r]["attn_sink"].clone()
        cold = time_graph(ds.calls(ws, 0))
    res[f"{layer}:{H}:{T}"] = (hot, cold)
    print(layer, H, T, round(hot, 2), round(cold, 2), flush=True)
    del ds, ws
json.dump(res, open(sys.argv[1], "w"))
