"""splits_sweep.py with extra layers of short index sets, for the one-split rule of the decode
policy (decode_one_split_pays in csrc/include/mla_ext/sparse_mla_decode.h, thirty-third session).

The V4 window layer (128 entries) is the only benchmark layer with short index sets; these add
the C4 format with a top-k of 64 / 128 / 256 after its 128-entry window (192 / 256 / 384
entries: three, four and six tiles) and V3.2 with a top-k of 64 / 128 / 256 (one, two and four
tiles), to see where one split stops paying as the sets grow.
Usage: python3 tests/gpu_dev/splits_sweep_short.py --shapes c4k64:16:128,v32k128:64:16 --splits 0,1,2,4
(every other argument as splits_sweep.py; the layers of mla_ext.bench.DECODE_LAYERS work too).
"""
import os
import runpy
import sys

import mla_ext.bench as bench

_CTX = (32768, 65536)
for _k in (64, 128, 256):
    bench.DECODE_LAYERS[f"c4k{_k}"] = ("v4_c4", _k, _CTX)
    bench.DECODE_LAYERS[f"v32k{_k}"] = ("v32", _k, _CTX)

sys.argv = ["splits_sweep.py"] + sys.argv[1:]
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "splits_sweep.py"), run_name="__main__")
