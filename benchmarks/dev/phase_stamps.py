"""Dev probe: where a one-token decode call's time goes, from %globaltimer stamps that a build
with `benchmarks/dev/phase_stamps.patch` takes in its kernels (thread 0 of every block; min and
max over the blocks). Each call runs alone (stamps reset, the call, a sync), on the benchmark's
L2-cold input sets in turn; medians over the calls, in µs from the split grid's first block
entry. Also the same calls' graph-replay time (the benchmark's figure) for scale.

    PYTHON=<python with the cu130 torch> tools/build_variant.sh stamp HEAD benchmarks/dev/phase_stamps.patch
    cp .dev/stamp/_C.abi3.so .dev/stamp/_build_info.py mla_ext/   # (on the GPU machine)
    python3 benchmarks/dev/phase_stamps.py [layer:H:T,...]

A stamp is thread 0's %globaltimer at a point of its program (dev_stamp); dev_stamp_dep first
waits for a value, so "landed" marks when a load's data arrived. Stamps cost time themselves
(this build's calls ran ~0.3 µs longer than the plain build's).
"""
import ctypes
import statistics
import sys

import torch

import mla_ext
from mla_ext import DecodeWorkspace
from mla_ext.bench import build_layer_sets, time_graph

lib = ctypes.CDLL(mla_ext._LIBRARY_PATH)
buf = (ctypes.c_ulonglong * 128)()  # [2 slot]: min, [2 slot + 1]: max, [64 + slot]: block 0's clock64

POINTS = [  # (name, slot of phase_stamps.patch's dev_stamp)
    ("split: entered", 0), ("split: past wait", 1), ("lengths landed", 6), ("tile 0 index landed", 12),
    ("tile 0 addresses+barrier", 7), ("tile 0 rows in regs", 2), ("tile 0 stored+barrier", 3), ("tiles done", 4),
    ("epilogue inv computed", 13), ("epilogue inv barrier", 11), ("split exit", 5), ("reduce entered", 8),
    ("reduce past wait", 9), ("reduce lses landed", 14), ("reduce scan barrier 1", 16), ("reduce weight sum", 17),
    ("reduce group folded", 18), ("reduce folded", 15), ("reduce exit", 10),
]
# (name, slot, 0: the first block's stamp / 1: the last block's)
PHASES = [(f"{name}: {which}", slot, mx) for name, slot in POINTS for mx, which in enumerate(("first", "last"))]

shapes = [("v4_swa", 8, 1), ("v4_c4_flash", 8, 1), ("v4_c4_flash", 16, 1), ("v4_c4_flash", 128, 1),
          ("v4_c4_pro", 8, 1), ("v4_c4_pro", 128, 1), ("v4_c128", 8, 1), ("v4_c128", 16, 1),
          ("v4_c128", 128, 1), ("v32", 16, 1)]
if len(sys.argv) > 1:
    shapes = [(l, int(h), int(t)) for l, h, t in (x.split(":") for x in sys.argv[1].split(","))]
print(f"{torch.cuda.get_device_name()}; µs from the split grid's first block entry (median of calls)", flush=True)
for layer, H, T in shapes:
    ds = build_layer_sets(layer, num_tokens=T, num_heads=H)
    ws = DecodeWorkspace(T, H, device="cuda").tensor
    calls = ds.calls(ws, 0)
    graph_us = time_graph(calls)
    rows, res = [], set()  # res: stamps' values mod 1000 ns (a few: a coarse timer; 125 on the H100)
    for i in range(3 * len(calls) if len(calls) < 20 else 60):
        torch.cuda.synchronize()
        assert lib.mla_ext_dev_stamps_reset() == 0
        calls[i % len(calls)]()
        torch.cuda.synchronize()
        assert lib.mla_ext_dev_stamps_read(buf) == 0
        v = list(buf)
        t0 = v[0]
        r = {}
        for name, slot, mx in PHASES:
            x = v[2 * slot + mx]
            r[name] = (x - t0) / 1e3 if x not in (0, 2**64 - 1) else float("nan")
            if x not in (0, 2**64 - 1):
                res.add(x % 1000)
        clk = v[64:96]
        r["block 0 clocks"] = [c - clk[0] if c else 0 for c in clk]
        if i >= 3:  # first calls: module load, lazy init
            rows.append(r)
    print(f"\n== {layer} H={H} T={T}: graph replay {graph_us:.2f} µs per call; {len(rows)} calls; "
          f"stamp ns residues seen: {len(res)}", flush=True)
    for name, _, _ in PHASES:
        xs = [r[name] for r in rows if r[name] == r[name]]
        if xs:
            print(f"  {name:32s} {statistics.median(xs):7.2f}  (min {min(xs):6.2f}, max {max(xs):6.2f})")
    clks = [r["block 0 clocks"] for r in rows]
    print("  block 0 clocks (entry, wait, lens, index, addr, rows, stored, done, inv, invbar, exit):",
          [int(statistics.median(c[k] for c in clks)) for k in (0, 1, 6, 12, 7, 2, 3, 4, 13, 11, 5)])
    del ds, ws, calls
    torch.cuda.empty_cache()
