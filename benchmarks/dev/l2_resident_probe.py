"""Decode GB/s with L2-resident rows beside the benchmark's L2-cold rows (same layer, heads, tokens).

Why: on the H200 the C128 16-head tile reaches about the same GB/s as on the H100 (2.2-2.3 TB/s)
although the H200's copy is 1.4x faster, so there the tile's own rate, not DRAM, sets the time.
On an H100 DRAM binds first. A call whose rows stay in L2 takes DRAM out of the picture: if its
GB/s stays near the cold call's, the tile's rate is the limit there too, and an H100 can stand in
for the H200's regime when a tile change is judged.

Shared rows: ``--requests`` requests of ``T / requests`` query tokens each (MTP-style rows: a
request's tokens select from one context), with contexts short enough that every request's rows
fit the L2 together (C128: 4 x 8,320 rows of 584 B, 19 MB); one input set, replayed (L2-warm). Cold rows: the benchmark's
own build (mla_ext.bench.build_layer_sets: one request per token, rotations past the L2).
Prints one table (µs per call, GB/s of KV rows read, the copy's GB/s measured in the same run).

Usage: python3 benchmarks/dev/l2_resident_probe.py [--shapes v4_c128:16:512,v32:16:512] [--requests 4]
"""
import argparse

import torch
from tabulate import tabulate

from mla_ext import DecodeWorkspace
from mla_ext.bench import DECODE_LAYERS, build_decode_sets, build_layer_sets, copy_bandwidth_gbs, sweep_shapes, time_calls

# Context lengths (tokens) whose selected rows fit an H100's 50 MB L2 for 4 requests: C128 keeps
# its 1M context (8,320 rows of 584 B per request: 19 MB); C4 and V3.2 take shorter contexts.
SHARED_CONTEXT = {"v4_swa": 32768, "v4_c4_flash": 16384, "v4_c4_pro": 16384, "v4_c128": 1 << 20, "v32": 8192}

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--shapes", default="v4_c128:16:512,v4_c128:8:512,v4_c4_pro:16:512,v32:16:512",
                help="layer:num_heads:num_tokens, comma-separated (num_tokens a multiple of --requests)")
ap.add_argument("--requests", type=int, default=4, help="requests sharing the rows in the L2-resident build")
args = ap.parse_args()
shapes = sweep_shapes(ap, args.shapes, "l2_resident_probe.py")
copy_gbs = copy_bandwidth_gbs()
rows = []
for layer, heads, tokens in shapes:
    if layer not in SHARED_CONTEXT or tokens % args.requests:
        ap.error(f"{layer}:{heads}:{tokens}: layers {sorted(SHARED_CONTEXT)}, tokens a multiple of --requests")
    kind, topk, _ = DECODE_LAYERS[layer]
    ws = DecodeWorkspace(tokens, heads, device="cuda")
    for label in ("cold", "shared"):
        if label == "cold":
            ds = build_layer_sets(layer, num_tokens=tokens, num_heads=heads)
        else:
            ds = build_decode_sets(kind, batch=args.requests, num_heads=heads, mtp=tokens // args.requests - 1,
                                   context_len=SHARED_CONTEXT[layer], topk=topk, device="cuda")
        us = time_calls(ds.calls(ws.tensor), "cuda")
        rows.append([layer, heads, tokens, label, ds.sets, round(ds.cache_bytes / 1e6, 1), round(us, 2),
                     round(ds.kv_bytes_per_call / us / 1e3, 1)])
        del ds
        torch.cuda.empty_cache()
print(f"copy {copy_gbs:.0f} GB/s ({torch.cuda.get_device_name()})")
print(tabulate(rows, headers=["layer", "H", "T", "rows", "sets", "caches allocated MB", "us", "GB/s"]))
