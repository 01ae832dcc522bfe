"""Dev probe (not part of the library): why does 16384 x 16 x 128 depend on what ran before?

bench_merge.py measured it last, after 8192 x 128 x 128 (1.6 GB of inputs freed back to torch's
caching allocator), at ~91% of the copy; in a fresh process it measures ~98%. Here the merge
runs on input sets placed on purpose, each next to a torch.add of the same two inputs into the
same output (2 reads + 1 write, no LSE) and the copy ceiling:
  fresh           : make_merge_inputs in a fresh allocator state (as merge_env.py)
  carved(a,b,o)   : prefix, suffix and output are views of one big buffer at a, b, o MiB
  ... lseTH       : the same with [T, H] LSEs (flat row order instead of token tiles)
Run on a GPU: python benchmarks/dev/merge_state.py
"""
import torch

from mla_ext import merge_attn_states
from mla_ext.bench import copy_ceiling_us, make_merge_inputs, merge_bytes, time_graph

T, H, D = 16384, 16, 128
MIB = 1 << 20


def carved(offsets_mib, seed, lse_th=False):
    """One input set whose value tensors are views of one buffer at the given MiB offsets."""
    o, ol, pa, la, pb, lb = make_merge_inputs(T, H, D, torch.bfloat16, "cuda", seed=seed)
    n = T * H * D
    buf = torch.empty((max(offsets_mib) * MIB) // 2 + n, dtype=torch.bfloat16, device="cuda")
    views = [buf[off * MIB // 2: off * MIB // 2 + n].view(T, H, D) for off in offsets_mib]
    views[0].copy_(pa)
    views[1].copy_(pb)
    if lse_th:
        la, lb, ol = la.contiguous(), lb.contiguous(), torch.empty(T, H, device="cuda")
    return (views[2], ol, views[0], la, views[1], lb), buf


def report(label, sets, cu):
    us = time_graph([lambda a=a: merge_attn_states(*a) for a in sets])
    add = time_graph([lambda a=a: torch.add(a[2], a[4], out=a[0]) for a in sets])
    print(f"{label:<34} merge {us:7.2f} us ({100 * cu / us:5.1f}% of copy)   torch.add {add:7.2f} us "
          f"({100 * cu / add:5.1f}%)", flush=True)


def main():
    cu = copy_ceiling_us(merge_bytes(T, H, D, torch.bfloat16))
    print(f"copy ceiling {cu:.2f} us")
    sets = [make_merge_inputs(T, H, D, torch.bfloat16, "cuda", seed=i) for i in range(2)]
    report("fresh", sets, cu)
    report("fresh, lse [T, H]", [(o, torch.empty(T, H, device="cuda"), pa, la.contiguous(), pb, lb.contiguous())
                                 for o, _, pa, la, pb, lb in sets], cu)
    del sets
    for offs in [(0, 64, 128), (64, 0, 128), (0, 128, 64), (0, 65, 130), (0, 66, 132), (0, 96, 192), (0, 70, 140)]:
        for th in (False, True):
            made = [carved(offs, seed=i, lse_th=th) for i in range(2)]
            report(f"carved{offs}" + (" lseTH" if th else ""), [m[0] for m in made], cu)
            del made
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
