"""Dev probe (not part of the library): the strided merge at 16384 x 16 x 128 against plain
torch kernels reading and writing the same strided views, each in a fresh allocator state.

bench_merge.py's strided layout reads [..., :128] of [T, H, 192] (256 of every 384 bytes) and
writes a token-offset view. If torch.add over the same views (2 strided reads + 1 write, no
LSEs) is as far below the contiguous copy as the merge, the access pattern on this GPU sets the
limit, not the merge kernel. Prints µs and % of the contiguous copy of the merge's bytes
(torch.add moves no LSEs: ~1.5% fewer bytes at 16384 x 16 x 128).
Run on a GPU: python benchmarks/dev/merge_strided_probe.py [T H D]
"""
import sys

import torch

from mla_ext.bench import copy_ceiling_us, make_merge_inputs, merge_bytes, num_rotations
from merge_state import report  # benchmarks/dev: the merge beside torch.add, as % of the copy


def main():
    T, H, D = (int(x) for x in sys.argv[1:4]) if len(sys.argv) > 3 else (16384, 16, 128)
    nbytes = merge_bytes(T, H, D, torch.bfloat16)
    for layout in ("contiguous", "strided", "strided", "contiguous"):
        torch.cuda.empty_cache()
        sets = [make_merge_inputs(T, H, D, torch.bfloat16, "cuda", layout=layout, seed=i)
                for i in range(num_rotations(nbytes))]
        report(layout, sets, copy_ceiling_us(nbytes, "cuda"))
        del sets


if __name__ == "__main__":
    main()
