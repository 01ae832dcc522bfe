"""merge_attn_states_n benchmark (GPU): the S-way merge against S-1 chained two-way merges and
against a device-to-device copy of the same bytes, all measured in the same run.

Method (mla_ext.bench): CUDA-graph replay, inputs rotated through >= 256 MiB so L2 does not
serve them, median of the replays.
- merge_n: one ``merge_attn_states_n`` call. Bytes = S value reads + one write + S + 1 LSE rows.
- chain: what an engine does without it: ``S - 1`` calls of ``merge_attn_states``, the running
  result accumulated in place in the output (values alias; the LSE ping-pongs between two
  buffers, since an LSE written by one row may not be read by another thread of the same row).
  Its own bytes are 3 (S - 1) value passes; its time is reported against the merge_n bytes.
- copy: a device-to-device copy moving the merge_n bytes (the floor).
Layout: values [S, T, H, D] bf16 contiguous (what an all-gather writes), LSEs [S, T, H].

Usage: python benchmarks/bench_merge_n.py [--json FILE] [--quick]
"""
import argparse
import json

import torch
from tabulate import tabulate

import mla_ext
from mla_ext import reference
from mla_ext.bench import require_gpu, copy_bandwidth_gbs, copy_ceiling_us, num_rotations, time_graph

# (S, T, H, D): context-parallel decode (S ranks, 512-wide MLA latent output), split-K partials,
# and a prefill-sized merge of a few context chunks.
SHAPES = [
    (2, 1, 128, 512), (4, 1, 128, 512), (8, 1, 128, 512),
    (2, 64, 128, 512), (4, 64, 128, 512), (8, 64, 128, 512),
    (4, 256, 16, 512), (8, 256, 16, 512),
    (16, 64, 16, 512), (32, 64, 16, 512), (64, 64, 16, 512),
    (4, 4096, 128, 128), (8, 4096, 16, 128),
]
QUICK = [(4, 64, 128, 512), (8, 64, 128, 512), (64, 64, 16, 512), (4, 4096, 128, 128)]


def merge_n_bytes(S, T, H, D, esize=2):
    return (S + 1) * T * H * D * esize + (S + 1) * T * H * 4


def make_set(S, T, H, D, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    values = torch.randn(S, T, H, D, device="cuda", dtype=dtype, generator=g)
    lses = torch.randn(S, T, H, device="cuda", generator=g) * 2
    out = torch.empty(T, H, D, device="cuda", dtype=dtype)
    out_lse = torch.empty(T, H, device="cuda")
    tmp_lse = torch.empty(T, H, device="cuda")
    return values, lses, out, out_lse, tmp_lse


def run_chain(values, lses, out, out_lse, tmp_lse):
    """S - 1 two-way merges; the final LSE lands in out_lse."""
    S = values.shape[0]
    if S == 1:
        out.copy_(values[0])
        out_lse.copy_(lses[0])
        return
    # choose the first buffer so that the last merge writes out_lse
    bufs = (out_lse, tmp_lse) if (S - 1) % 2 == 1 else (tmp_lse, out_lse)
    mla_ext.merge_attn_states(out, bufs[0], values[0], lses[0], values[1], lses[1])
    for s in range(2, S):
        src, dst = bufs[s % 2], bufs[(s + 1) % 2]
        mla_ext.merge_attn_states(out, dst, out, src, values[s], lses[s])


def max_rel_err(out, out_lse, values, lses, rows=32):
    T = out.shape[0]
    idx = torch.linspace(0, T - 1, min(T, rows), device=out.device).long().unique()
    ref_o, ref_l = reference.merge_attn_states_n(values[:, idx].cpu(), lses[:, idx].cpu())
    err = ((out[idx].double().cpu() - ref_o).abs().max() / ref_o.abs().max().clamp_min(1e-30)).item()
    lse_err = (out_lse[idx].double().cpu() - ref_l).abs().max().item()
    return err, lse_err


def measure(S, T, H, D, dtype=torch.bfloat16):
    nbytes = merge_n_bytes(S, T, H, D, torch.empty((), dtype=dtype).element_size())
    sets = [make_set(S, T, H, D, dtype, i) for i in range(num_rotations(nbytes))]
    v, l, o, ol, _ = sets[0]
    o.fill_(float("nan"))
    ol.fill_(float("nan"))
    mla_ext.merge_attn_states_n(o, ol, v, l)
    err, lse_err = max_rel_err(o, ol, v, l)
    o.fill_(float("nan"))
    run_chain(*sets[0])
    chain_err, chain_lse_err = max_rel_err(o, ol, v, l)
    us = time_graph([lambda a=a: mla_ext.merge_attn_states_n(a[2], a[3], a[0], a[1]) for a in sets])
    chain_us = time_graph([lambda a=a: run_chain(*a) for a in sets])
    del sets
    cu = copy_ceiling_us(nbytes)
    return dict(S=S, T=T, H=H, D=D, bytes=nbytes, us=us, chain_us=chain_us, speedup=chain_us / us,
                copy_us=cu, pct_copy=100.0 * cu / us, **{"GB/s": nbytes / us / 1e3},
                max_rel_err=err, lse_err=lse_err, chain_err=chain_err, chain_lse_err=chain_lse_err)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="four shapes only")
    args = ap.parse_args()
    require_gpu("bench_merge_n.py")
    bw = copy_bandwidth_gbs(nbytes=512 << 20)
    rows = [measure(*shape) for shape in (QUICK if args.quick else SHAPES)]
    cols = ["S", "T", "H", "D", "bytes", "us", "chain_us", "speedup", "copy_us", "pct_copy", "GB/s",
            "max_rel_err", "lse_err", "chain_err", "chain_lse_err"]
    print(f"\nmerge_attn_states_n, bf16, {torch.cuda.get_device_name()}, copy bandwidth {bw:.0f} GB/s "
          f"(512 MiB, read+write)")
    print(tabulate([[r.get(c, "") for c in cols] for r in rows], headers=cols, floatfmt=".4g"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_GBps": bw, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
