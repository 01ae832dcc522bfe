"""Dev probe (not part of the library): the graph benchmark's environment against the .cu probes.

bench_merge.py times the merge at 1 x 128 x 512 ~0.2 µs above benchmarks/dev/merge_small.cu's
node for the same kernel, and 16384 x 16 x 128 at ~91% of the copy where merge_variants.cu saw
it near an add. Here, with mla_ext.bench's own time_graph and input sets, per shape: the
benchmark's call, the same without output LSE, with [T, H] LSEs, a torch.add of the two inputs
(2 reads + 1 write, no LSE), every call reading and writing the first set's LSEs (hot_lse: the LSEs
cached, values still L2-cold), and inputs placed 2 MiB apart (like one cudaMalloc each).
Run on a GPU: python benchmarks/dev/merge_env.py [--small]  (--small: 1 x 128 x 512 only)
"""
import sys

import torch

import mla_ext
from mla_ext.bench import copy_ceiling_us, make_merge_inputs, merge_bytes, num_rotations, time_graph


def spaced(t: torch.Tensor, keep: list) -> torch.Tensor:
    """A copy of t whose storage starts on its own 2 MiB boundary (padding kept alive in keep)."""
    pad = torch.empty(2 << 20, dtype=torch.uint8, device=t.device)
    keep.append(pad)
    n = t.untyped_storage().nbytes()
    buf = torch.empty(n + (2 << 20), dtype=torch.uint8, device=t.device)
    keep.append(buf)
    off = (-buf.data_ptr()) % (2 << 20)
    view = buf[off:off + n].view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())
    view.copy_(t)
    return view


def main():
    rows = []
    shapes = [(1, 128, 512), (16384, 16, 128), (4096, 128, 128)]
    for T, H, D in shapes[:1] if "--small" in sys.argv[1:] else shapes:
        nbytes = merge_bytes(T, H, D, torch.bfloat16)
        sets = [make_merge_inputs(T, H, D, torch.bfloat16, "cuda", seed=i) for i in range(num_rotations(nbytes))]
        res = {"copy": copy_ceiling_us(nbytes)}
        res["bench"] = time_graph([lambda a=a: mla_ext.merge_attn_states(*a) for a in sets])
        res["no_out_lse"] = time_graph([lambda a=a: mla_ext.merge_attn_states(a[0], None, *a[2:]) for a in sets])
        th = [(o, ol.T.contiguous().T.contiguous(), pa, la.contiguous(), pb, lb.contiguous())
              for o, ol, pa, la, pb, lb in sets]
        res["lse_TH"] = time_graph([lambda a=a: mla_ext.merge_attn_states(*a) for a in th])
        o0, ol0, _, la0, _, lb0 = sets[0]
        res["hot_lse"] = time_graph([lambda a=a: mla_ext.merge_attn_states(a[0], ol0, a[2], la0, a[4], lb0)
                                     for a in sets])
        res["torch_add"] = time_graph([lambda a=a: torch.add(a[2], a[4], out=a[0]) for a in sets])
        keep = []
        sp = [tuple(spaced(x, keep) for x in a) for a in sets]
        res["spaced"] = time_graph([lambda a=a: mla_ext.merge_attn_states(*a) for a in sp])
        del sets, th, sp, keep
        torch.cuda.empty_cache()
        rows.append((f"{T}x{H}x{D}", res))
    keys = list(rows[0][1])
    print(f"{'shape':>14} " + " ".join(f"{k:>11}" for k in keys) + "   (µs per graph node)")
    for name, res in rows:
        print(f"{name:>14} " + " ".join(f"{res[k]:11.2f}" for k in keys))


if __name__ == "__main__":
    main()
