"""C128 split sweeps on rows shorter than the set (thirty-fifth session): tests/gpu_dev/splits_sweep.py
with extra layers whose compressed rows are cut to a band of lengths.

A C128 layer's index set is 8,320 entries wide (the 128-entry window + 8,192 compressed rows for
1M tokens of context); engines' rows are mostly far shorter. Layers added here, each the
`v4_c128` build of `mla_ext.bench` with every token's extra_lengths drawn uniformly from a band
(no straggler): c128r1k_mixed 900-1,100 compressed rows, c128r2k 1,800-2,200, c128r3k
2,700-3,300, c128r4k 3,600-4,400, c128r5k 4,500-5,500, c128r6k 5,400-6,600, c128r7k
7,200-8,192, c128rnd 300-8,192 (the "_mixed" suffix is what makes `mla_ext.bench` cut lengths).
`v4_c128` (full rows) and `v4_c128_mixed` (one full row, the rest ~500) stay as they are.
Arguments are splits_sweep.py's; run from the repository root on a GPU, e.g.

  python benchmarks/dev/c128_length_sweep.py --shapes c128r3k_mixed:16:128,v4_c128:16:144 --splits 0,2,4

With `MLA_EXT_ACTIVE_SPLITS=s` in the environment the automatic count's slots in use are forced to
S' = s (decode_active_table), which is how RESULTS.md's call 3 measured S' = 1..7.
"""
import runpy
import sys

import torch

import mla_ext.bench as bench

BANDS = {"c128r1k_mixed": (900, 1100), "c128r2k_mixed": (1800, 2200), "c128r3k_mixed": (2700, 3300),
         "c128r4k_mixed": (3600, 4400), "c128r5k_mixed": (4500, 5500), "c128r6k_mixed": (5400, 6600),
         "c128r7k_mixed": (7200, 8192), "c128rnd_mixed": (300, 8192)}
_build, _mixed = bench.build_layer_sets, bench.make_mixed
_band = {}


def make_mixed(inp, rows=500, seed=0):
    band = _band.get("now")
    if band is None:
        return _mixed(inp, rows, seed)
    g = torch.Generator(device="cpu").manual_seed(seed + 7)
    cut = torch.randint(band[0], band[1] + 1, (inp.num_tokens,), generator=g).to(inp.extra_lengths.device)
    inp.extra_lengths = torch.minimum(inp.extra_lengths, cut.to(inp.extra_lengths.dtype))
    return inp  # (num_selected / num_kv_bytes stay the full rows': the sweep prints times only)


def build_layer_sets(layer, **kw):
    _band["now"] = BANDS.get(layer)
    return _build(layer, **kw)


def install() -> None:
    """Add the band layers to mla_ext.bench (benchmarks/dev/kernel_times.py imports this too)."""
    for name in BANDS:
        bench.DECODE_LAYERS[name] = ("v4_c128", None, (1 << 20, 1 << 20))
    bench.make_mixed = make_mixed
    bench.build_layer_sets = build_layer_sets


if __name__ == "__main__":
    install()
    sys.argv = ["splits_sweep.py"] + sys.argv[1:]
    runpy.run_path("tests/gpu_dev/splits_sweep.py", run_name="__main__")
