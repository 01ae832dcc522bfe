"""Small GPU cases for compute-sanitizer (memcheck / racecheck / synccheck).

Runs merge_attn_states (vector and narrow paths, FP8 output), merge_attn_states_n and sparse_mla_decode (every layer kind, the
tensor-core paths (64-head blocks: warpgroup MMAs on Hopper, and mma.sync forced), the portable path, one and several
splits, sink and lse) once each on tiny shapes,
then checks each result against the float64 reference so a sanitizer run also proves the values.
Usage: compute-sanitizer --tool memcheck python3 tests/gpu_dev/sanitize_case.py
Environment: MLA_EXT_SANITIZE_KINDS (comma list of decode layer kinds, default all four; "balanced"
runs only the balanced-map cases, which v4_c128 includes, "anchored" only the anchored-map case,
which v4_c128 includes too; "two_token" only the forced two-token case,
which v4_swa includes; "reduce_chunks" only the column-chunked reduce cases, which v4_c4 includes)
and MLA_EXT_SANITIZE_SKIP_MERGE=1 narrow a
run (racecheck over every case takes minutes).
"""
import sys

import torch

import mla_ext
from mla_ext import reference
from mla_ext.builders import build_decode_inputs

import os
dev = os.environ.get("MLA_EXT_DEVICE", "cuda")
kinds = os.environ.get("MLA_EXT_SANITIZE_KINDS", "v4_swa,v4_c4,v4_c128,v32").split(",")
skip_merge = os.environ.get("MLA_EXT_SANITIZE_SKIP_MERGE") == "1"
bad = 0


def decode_ok(label, out, lse, ref_o, ref_l):
    """Print and return whether out / lse match the reference (lse where it is finite, and
    finite exactly there)."""
    ref_o, ref_l = ref_o.double().cpu(), ref_l.double().cpu()  # references may come back on the GPU
    eo = ((out.double().cpu() - ref_o).abs().max() / ref_o.abs().max()).item()
    fin = torch.isfinite(ref_l)
    el = (lse.double().cpu()[fin] - ref_l[fin]).abs().max().item()
    ok = eo < 1.6e-2 and el < 1e-2 and torch.equal(torch.isfinite(lse.cpu()), fin)
    print(f"decode {label}: out err {eo:.3g} lse err {el:.3g} {'ok' if ok else 'FAIL'}")
    return ok


def run_inputs(label, inp, splits, ref_o, ref_l):
    """One call on build_decode_inputs' inputs into NaN-poisoned output and lse and a 0xFF
    workspace, checked with decode_ok; returns whether it passed."""
    T, H = inp.num_tokens, inp.num_heads
    out = torch.full((T, H, 512), float("nan"), device=dev, dtype=torch.bfloat16)
    lse = torch.full((T, H), float("nan"), device=dev)
    ws = torch.empty(mla_ext.sparse_mla_decode_workspace_size(T, H, num_splits=splits, device=dev),
                     dtype=torch.uint8, device=dev).fill_(0xFF)
    mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, inp.indices, output=out, workspace=ws, lse=lse,
                              num_splits=splits, **inp.op_kwargs())
    if dev == "cuda":
        torch.cuda.synchronize()
    return decode_ok(label, out, lse, ref_o, ref_l)


# merge: 16-byte path (D=128) and narrow path (D=7), with output_lse; the last case is a large
# call (tens of thousands of blocks)
for T, H, D in () if skip_merge else ((5, 3, 128), (5, 3, 7), (4400, 16, 128)):
    po, so = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16), torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
    pl, sl = torch.randn(T, H, device=dev), torch.randn(T, H, device=dev)
    out = torch.full((T, H, D), float("nan"), device=dev, dtype=torch.bfloat16)
    ol = torch.full((T, H), float("nan"), device=dev)
    mla_ext.merge_attn_states(out, ol, po, pl, so, sl)
    ro, rl = reference.merge_attn_states(po, pl, so, sl)
    err = ((out.double() - ro.to(dev)).abs().max() / ro.abs().max()).item()
    print(f"merge T={T} H={H} D={D}: max err {err:.3g}")
    bad += not err < 2e-2

# merge with an FP8 output and prefill_tokens_with_context (vector and narrow paths)
for D in () if skip_merge else (128, 7):
    T, H = 5, 3
    po, so = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16), torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
    pl, sl = torch.randn(T, H, device=dev), torch.randn(T, H, device=dev)
    out = torch.empty(T, H, D, device=dev, dtype=torch.float8_e4m3fn)
    mla_ext.merge_attn_states(out, None, po, pl, so, sl, 3, torch.tensor([0.05], device=dev))
    ro, _ = reference.merge_attn_states(po, pl, so, sl, prefill_tokens_with_context=3, output_scale=0.05,
                                        fp8_dtype=torch.float8_e4m3fn)
    err = ((out.double() - ro.to(dev)).abs() / (ro.to(dev).abs() + 1e-2)).max().item()
    print(f"merge fp8 D={D}: max rel err {err:.3g}")
    bad += not err < 0.07

# merge_attn_states_n: S = 5 with empty states, vector (D=128) and narrow (D=7) paths
for D in () if skip_merge else (128, 7):
    S, T, H = 5, 4, 3
    v = torch.randn(S, T, H, D, device=dev, dtype=torch.bfloat16)
    lv = torch.randn(S, T, H, device=dev)
    lv[1, 0] = float("inf")
    lv[:, 1] = float("-inf")
    out = torch.full((T, H, D), float("nan"), device=dev, dtype=torch.bfloat16)
    ol = torch.full((T, H), float("nan"), device=dev)
    mla_ext.merge_attn_states_n(out, ol, v, lv)
    ro, rl = reference.merge_attn_states_n(v, lv)
    err = ((out.double() - ro.to(dev)).abs().max() / ro.abs().max()).item()
    print(f"merge_n D={D}: max err {err:.3g}")
    bad += not err < 2e-2

for kind in [k for k in kinds if k not in ("balanced", "anchored", "two_token", "reduce_chunks")]:
    # (V3.2 also at 100 heads: two 64-head groups, which Hopper runs as a 2-block cluster)
    for heads in (16, 64) + ((100,) if kind == "v32" else ()):
        inp = build_decode_inputs(kind, batch=2, num_heads=heads, context_len=(300, 700), mtp=1,
                                  topk=128 if kind in ("v4_c4", "v32") else None, device=dev, seed=3)
        ref_o, ref_l = inp.reference()
        # (portable, mma_sync): at 64 heads also the forced mma.sync kernel; the head tile is forced
        # to 64 there, so the 64-head block runs (small calls pick smaller tiles on their own)
        paths = [(False, False), (True, False)] + ([(False, True)] if heads >= 64 else [])
        for portable, mma_sync in paths:
            # 20 splits: the block-wide split reduction (from 16 splits on)
            for splits in (1, 3) + ((20,) if not portable and heads == 16 else ()):
                T, H = inp.num_tokens, inp.num_heads
                out = torch.full((T, H, 512), float("nan"), device=dev, dtype=torch.bfloat16)
                lse = torch.full((T, H), float("nan"), device=dev)
                ws = torch.empty(mla_ext.sparse_mla_decode_workspace_size(T, H, num_splits=splits, device=dev),
                                 dtype=torch.uint8, device=dev).fill_(0xFF)
                prev = torch.ops.mla_ext._set_force_portable(portable)
                prev_m = torch.ops.mla_ext._set_force_mma_sync(mma_sync)
                prev_t = torch.ops.mla_ext._set_head_tile(64 if heads >= 64 else 0)
                try:
                    mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, inp.indices, output=out, workspace=ws,
                                              lse=lse, num_splits=splits, **inp.op_kwargs())
                    if dev == "cuda":
                        torch.cuda.synchronize()
                finally:
                    torch.ops.mla_ext._set_head_tile(prev_t)
                    torch.ops.mla_ext._set_force_mma_sync(prev_m)
                    torch.ops.mla_ext._set_force_portable(prev)
                eo = ((out.double() - ref_o.to(dev)).abs().max() / ref_o.abs().max()).item()  # relative to max |ref|
                el = (lse.double() - ref_l.to(dev)).abs().max().item()
                tol_o, tol_l = 1.6e-2, 1e-2
                ok = eo < tol_o and el < tol_l
                bad += not ok
                print(f"decode {kind:8s} H={heads:3d} portable={portable!s:5s} mma_sync={mma_sync!s:5s} splits={splits}: "
                      f"out err {eo:.3g} lse err {el:.3g} {'ok' if ok else 'FAIL'}")
# V3.2 at 1-16 heads with splits of >= 320 index entries: on Hopper (sm_90a build) the A16 tile
# (asymmetric warpgroups, transposed products), the default there since 5e02a3b; contexts
# shorter than the 1024-entry sets leave invalid rows in the tiles
if "v32" in kinds:
    for heads in (16, 9):
        inp = build_decode_inputs("v32", batch=2, num_heads=heads, context_len=(600, 1500), mtp=1, topk=1024,
                                  device=dev, seed=7 + heads)
        ref_o, ref_l = inp.reference()
        for splits in (1, 2):
            bad += not run_inputs(f"v32 H={heads} T={inp.num_tokens} W=1024 splits={splits} (A16 on Hopper)", inp,
                                  splits, ref_o, ref_l)
# the balanced split map (V4, index width >= 4096, lengths very different), auto and explicit splits;
# 16 heads, and 64 with the 64-head tile forced (on Hopper: the warpgroup kernel with two K stages)
if "v4_c128" in kinds or "balanced" in kinds:
    from mla_ext import formats
    g = torch.Generator().manual_seed(5)
    T, H, W, ps, pages = 9, 16, 4608, 2, 3000
    lengths = torch.tensor([4608, 17, 0, 300, 5, 4000, 64, 1, 129], dtype=torch.int32)
    idx = torch.randint(0, pages * ps, (T, W), generator=g, dtype=torch.int32)
    cache = formats.alloc_kv_cache("fp8_ds_mla_v4", pages, ps, 512, device="cpu")
    slots = torch.unique(idx.reshape(-1).to(torch.int64))
    formats.write_kv_rows(cache, "fp8_ds_mla_v4", slots, torch.randn(slots.numel(), 512, generator=g))
    base = cache.as_strided((pages * cache.stride(0),), (1,), 0).to(dev)  # keep the padded page stride
    cache_d = base.as_strided(cache.shape, cache.stride(), 0)
    for H, splits in ((16, 0), (16, 5), (64, 0), (64, 5)):
        q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
        ref_o, ref_l = reference.sparse_mla_decode(q, cache, idx, kv_format="fp8_ds_mla_v4", softmax_scale=0.05,
                                                   lengths=lengths)
        out = torch.full((T, H, 512), float("nan"), device=dev, dtype=torch.bfloat16)
        lse = torch.full((T, H), float("nan"), device=dev)
        ws = torch.empty(mla_ext.sparse_mla_decode_workspace_size(T, H, num_splits=splits, device=dev),
                         dtype=torch.uint8, device=dev).fill_(0xFF)
        prev_t = torch.ops.mla_ext._set_head_tile(64 if H == 64 else 0)
        try:
            mla_ext.sparse_mla_decode(q.to(dev), cache_d, idx.to(dev), kv_format="fp8_ds_mla_v4", softmax_scale=0.05,
                                      output=out, workspace=ws, lse=lse, lengths=lengths.to(dev), num_splits=splits)
            if dev == "cuda":
                torch.cuda.synchronize()
        finally:
            torch.ops.mla_ext._set_head_tile(prev_t)
        bad += not decode_ok(f"balanced map H={H} splits={splits}", out, lse, ref_o, ref_l)
# the anchored map (automatic count above 256 tokens: decode_active_slack), 16 heads: on Hopper the
# RAW tile's anchored instance (Q.K from the gathered registers; MLA_EXT_SANITIZE_KINDS "anchored",
# or with v4_c128). Short rows (0-300 entries: splits of one partial tile to a few tiles), one full
# row, empty and one-entry rows, invalid slots inside rows.
if "v4_c128" in kinds or "anchored" in kinds:
    from mla_ext import formats
    g = torch.Generator().manual_seed(9)
    T, H, W, ps, pages = 264, 16, 4096, 2, 3000
    lengths = torch.randint(0, 301, (T,), generator=g, dtype=torch.int32)
    lengths[0], lengths[5], lengths[6], lengths[T - 1] = W, 0, 1, 700
    idx = torch.randint(0, pages * ps, (T, W), generator=g, dtype=torch.int32)
    idx[:, 3::11] = -1
    cache = formats.alloc_kv_cache("fp8_ds_mla_v4", pages, ps, 512, device="cpu")
    slots = torch.unique(idx.reshape(-1).to(torch.int64))
    slots = slots[slots >= 0]
    formats.write_kv_rows(cache, "fp8_ds_mla_v4", slots, torch.randn(slots.numel(), 512, generator=g))
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    ref_o, ref_l = reference.sparse_mla_decode(q, cache, idx, kv_format="fp8_ds_mla_v4", softmax_scale=0.05,
                                               lengths=lengths)
    out = torch.full((T, H, 512), float("nan"), device=dev, dtype=torch.bfloat16)
    lse = torch.full((T, H), float("nan"), device=dev)
    ws = torch.empty(mla_ext.sparse_mla_decode_workspace_size(T, H, num_splits=0, device=dev),
                     dtype=torch.uint8, device=dev).fill_(0xFF)
    mla_ext.sparse_mla_decode(q.to(dev), cache.to(dev), idx.to(dev), kv_format="fp8_ds_mla_v4", softmax_scale=0.05,
                              output=out, workspace=ws, lse=lse, lengths=lengths.to(dev), num_splits=0)
    if dev == "cuda":
        torch.cuda.synchronize()
    bad += not decode_ok(f"anchored map T={T} H={H} auto splits", out, lse, ref_o, ref_l)
# the reduce's column chunks (one token, more than 32 splits, few (token, head) rows: 4 chunks at 16
# heads, 2 at 48 on a GPU of 96-191 processors; MLA_EXT_SANITIZE_KINDS "reduce_chunks", or with v4_c4)
if "v4_c4" in kinds or "reduce_chunks" in kinds:
    for H, splits in ((16, 40), (48, 40), (16, 33)):
        inp = build_decode_inputs("v4_c4", batch=1, num_heads=H, context_len=(2000, 3000), device=dev, seed=11 + H)
        ref_o, ref_l = inp.reference()
        bad += not run_inputs(f"reduce chunks H={H} splits={splits}", inp, splits, ref_o, ref_l)
# two-token blocks (the V4 64-head kernel, forced: MLA_EXT_SANITIZE_KINDS "two_token", or with v4_swa):
# window + compressed sets, odd token count, blocks whose first, second or both tokens have no rows
if "v4_swa" in kinds or "two_token" in kinds:
    from mla_ext import formats
    g = torch.Generator().manual_seed(7)
    T, H, ps_w, ps_c, pages_w, pages_c = 11, 64, 256, 64, 2, 12
    lw = torch.tensor([0, 5, 0, 0, 128, 1, 64, 0, 3, 128, 65], dtype=torch.int32)
    lc = torch.tensor([0, 0, 0, 0, 512, 7, 65, 0, 200, 0, 64], dtype=torch.int32)
    idx_w = torch.randint(0, pages_w * ps_w, (T, 128), generator=g, dtype=torch.int32)
    idx_c = torch.randint(0, pages_c * ps_c, (T, 512), generator=g, dtype=torch.int32)
    idx_c[:, ::7] = -1  # invalid slots inside rows
    caches = []
    for pages, ps, idx in ((pages_w, ps_w, idx_w), (pages_c, ps_c, idx_c)):
        c = formats.alloc_kv_cache("fp8_ds_mla_v4", pages, ps, 512, device="cpu")
        slots = torch.unique(idx.reshape(-1).to(torch.int64))
        slots = slots[slots >= 0]
        formats.write_kv_rows(c, "fp8_ds_mla_v4", slots, torch.randn(slots.numel(), 512, generator=g))
        caches.append(c)
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    sink = torch.randn(H, generator=g)
    kw = dict(kv_format="fp8_ds_mla_v4", softmax_scale=0.05, lengths=lw, extra_indices=idx_c, extra_lengths=lc,
              attn_sink=sink)
    ref_o, ref_l = reference.sparse_mla_decode(q, caches[0], idx_w, extra_kv_cache=caches[1], **kw)
    dkw = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}

    def to_dev(c):  # keeps the padded page stride
        base = c.as_strided((c.shape[0] * c.stride(0),), (1,), 0).to(dev)
        return base.as_strided(c.shape, c.stride(), 0)
    out = torch.full((T, H, 512), float("nan"), device=dev, dtype=torch.bfloat16)
    lse = torch.full((T, H), float("nan"), device=dev)
    ws = torch.empty(0, dtype=torch.uint8, device=dev)
    prev_w = torch.ops.mla_ext._set_two_token(2)
    prev_t = torch.ops.mla_ext._set_head_tile(64)
    try:
        mla_ext.sparse_mla_decode(q.to(dev), to_dev(caches[0]), idx_w.to(dev), extra_kv_cache=to_dev(caches[1]),
                                  output=out, workspace=ws, lse=lse, num_splits=1, **dkw)
        if dev == "cuda":
            torch.cuda.synchronize()
    finally:
        torch.ops.mla_ext._set_head_tile(prev_t)
        torch.ops.mla_ext._set_two_token(prev_w)
    bad += not decode_ok(f"two-token blocks H={H} T={T}", out, lse, ref_o, ref_l)
print("FAILED" if bad else "all ok")
sys.exit(1 if bad else 0)
