"""sparse_mla_decode against the float64 reference on fresh random inputs (CPU always, GPU when present).

Every call gets poisoned output / lse (NaN) and workspace (0xFF bytes = NaN floats), and caches whose
unselected slots are garbage that decodes to NaN, so an unwritten element, a workspace cell read before
being written, or a read of an unselected row shows up as NaN.
"""
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import zlib

import pytest
import torch

import mla_ext
from mla_ext import builders, formats, reference
from conftest import (HAS_GPU, assert_close_rel, assert_fake_refuses_like_op, e4m3_reference_table,
                      leave_runtime_error_pending, loaded_cuda_runtime, ops_seen_by_function_mode, poison_,
                      requires_gpu)


@contextlib.contextmanager
def gpu_path(portable=None, head_tile=None, mma_sync=None, smem_limit=None, two_token=None):
    """Set the process-global GPU path switches (portable kernels, forced head tile, mma.sync
    instead of warpgroup MMAs on Hopper, a smaller shared-memory limit per block, the two-token
    mode of the V4 64-head kernel) for the block; the previous settings come back afterwards,
    also on failure (a refused setting included)."""
    ops = torch.ops.mla_ext
    setters = [(ops._set_two_token, two_token), (ops._set_force_portable, portable),
               (ops._set_head_tile, head_tile), (ops._set_force_mma_sync, mma_sync),
               (ops._set_smem_limit, smem_limit)]
    restore = []
    try:
        for setter, value in setters:
            if value is not None:
                restore.append((setter, setter(value)))
        yield
    finally:
        for setter, prev in reversed(restore):
            setter(prev)


INF = float("inf")
GEOMS = [("bf16", 576), ("bf16", 512), ("fp8_ds_mla", 576), ("fp8_ds_mla_v4", 512)]
# The same layouts with e4m3fnuz value bytes (gfx942 engines); kept out of GEOMS so the covering
# set below stays as it is, and tested by the fnuz tests further down.
FNUZ_GEOMS = [("fp8_ds_mla_fnuz", 576), ("fp8_ds_mla_v4_fnuz", 512)]
FP8_GEOMS = [g for g in GEOMS + FNUZ_GEOMS if g[0] != "bf16"]
HEADS = [1, 8, 16, 64, 128]
TOKENS = [1, 5, 33]
WIDTHS = [1, 63, 65, 130, 2048]
INVALID = ["none", "leading", "middle", "trailing", "scattered", "all_rows"]
PAGE_SIZES = [1, 2, 61, 64, 256]
SINKS = [None, "-inf", "finite", "+inf", "mixed"]
SPLITS = [0, 1, 2, 7, 16, 64]
LENGTHS = [None, "random", "zeros"]


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def make_indices(g, T, W, num_slots, invalid, lengths_mode):
    """Random int32 [T, W] slots with invalid entries placed as asked; optional lengths [T]."""
    idx = torch.randint(0, num_slots, (T, W), generator=g, dtype=torch.int64)
    bad_values = torch.tensor([-1, -7, num_slots, num_slots + 5, -(2**31)], dtype=torch.int64)

    def bad(n):
        return bad_values[torch.randint(0, len(bad_values), (n,), generator=g)]

    k = max(1, W // 4)
    for t in range(T):
        if invalid == "leading":
            idx[t, :k] = bad(k)
        elif invalid == "middle" and W > 2:
            a = W // 3
            idx[t, a:a + k] = bad(len(idx[t, a:a + k]))
        elif invalid == "trailing":
            idx[t, W - k:] = bad(k)
        elif invalid == "scattered":
            m = torch.rand(W, generator=g) < 0.3
            idx[t, m] = bad(int(m.sum()))
        elif invalid == "all_rows" and t % 2 == 0:
            idx[t] = bad(W)  # every other token has no valid entry
    lengths = None
    if lengths_mode == "random":
        lengths = torch.randint(0, W + 3, (T,), generator=g, dtype=torch.int32)
    elif lengths_mode == "zeros":
        lengths = torch.randint(0, W + 1, (T,), generator=g, dtype=torch.int32)
        lengths[::2] = 0
    return idx.to(torch.int32), lengths


def make_cache(g, fmt, d_qk, num_pages, page_size, slots, device, page_stride=None):
    """Garbage-filled cache (NaN under any reading) with random rows written only at `slots`."""
    cache = formats.alloc_kv_cache(fmt, num_pages, page_size, d_qk, device="cpu", page_stride=page_stride)
    s = torch.unique(slots.reshape(-1).to(torch.int64))
    s = s[(s >= 0) & (s < num_pages * page_size)]
    if s.numel():
        rows = torch.randn(s.numel(), d_qk, generator=g) * 2
        formats.write_kv_rows(cache, fmt, s, rows)
    if device != "cpu":
        if _is_v4(fmt):  # keep the padded page stride on the device
            base = cache.as_strided((num_pages * cache.stride(0),), (1,), 0).to(device)
            cache = base.as_strided(cache.shape, cache.stride(), 0)
        else:
            cache = cache.to(device)
    return cache


def _is_v4(fmt):
    return formats.kv_layout(fmt) == "fp8_ds_mla_v4"


def make_sink(g, H, mode):
    if mode is None:
        return None
    if mode == "-inf":
        return torch.full((H,), -INF)
    if mode == "+inf":
        return torch.full((H,), INF)
    s = torch.randn(H, generator=g) * 2
    if mode == "mixed":
        s[0::3] = -INF
        s[1::3] = INF
    return s


def ws_size(T, H, S, device):
    return mla_ext.sparse_mla_decode_workspace_size(T, H, num_splits=S, device=device)


def poisoned_buffers(T, H, S, device):
    out = poison_(torch.empty(T, H, 512, dtype=torch.bfloat16, device=device))
    lse = poison_(torch.empty(T, H, device=device))
    ws = torch.full((ws_size(T, H, S, device),), 0xFF, dtype=torch.uint8, device=device)
    return out, lse, ws


def check_lse(lse, ref_lse, what="lse", kv_format=None):
    # Tolerances live in reference.decode_tolerances, shared with `mla-ext decode`.
    _, tol = reference.decode_tolerances(lse.device.type, kv_format)
    lse = lse.double().cpu()
    assert not torch.isnan(lse).any(), f"{what}: NaN (unwritten or wrong)"
    inf = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), inf), f"{what}: -inf pattern differs from the reference"
    err = reference.lse_error(lse, ref_lse)
    assert err <= tol, f"{what}: error {err:.3g} (reference.lse_error) > {tol}"


def check_out(out, ref_o, kv_format=None):
    tol, _ = reference.decode_tolerances(out.device.type, kv_format)
    got = out.double().cpu()
    ref = ref_o.double().cpu()
    assert not torch.isnan(got).any(), "output: NaN in result (unwritten or wrong)"
    err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    assert err <= tol, f"output: max error {err:.3g} (relative to max |ref|) > {tol}"


def run_check(q, cache, idx, *, fmt, scale, device, num_splits=0, lengths=None, extra=None, sink=None,
              out=None, lse=None, ws=None, check=True, memo=None):
    """Call the op on poisoned buffers (unless given) and compare with the float64 reference.
    memo: a dict kept across calls on the same inputs (kernel paths of one case), so that the
    reference is computed once."""
    T, H = q.shape[0], q.shape[1]
    extra = extra or {}
    if out is None:
        out, lse, ws = poisoned_buffers(T, H, num_splits, device)
    dev = lambda x: None if x is None else x.to(device)
    kw = dict(kv_format=fmt, softmax_scale=scale, lengths=dev(lengths),
              extra_kv_cache=extra.get("cache"), extra_indices=dev(extra.get("indices")),
              extra_lengths=dev(extra.get("lengths")), attn_sink=dev(sink))
    mla_ext.sparse_mla_decode(q.to(device), cache, idx.to(device), output=out, workspace=ws, lse=lse,
                              num_splits=num_splits, **kw)
    if check:
        if memo is not None and "ref" in memo:
            ref_o, ref_l = memo["ref"]
        else:
            ref_o, ref_l = reference.sparse_mla_decode(
                q.cpu(), cache.cpu() if not _is_v4(fmt) else _cpu_v4(cache), idx.cpu(),
                kv_format=fmt, softmax_scale=scale, lengths=lengths,
                extra_kv_cache=None if not extra else (extra["cache"].cpu() if not _is_v4(fmt)
                                                       else _cpu_v4(extra["cache"])),
                extra_indices=extra.get("indices"), extra_lengths=extra.get("lengths"), attn_sink=sink)
            if memo is not None:
                memo["ref"] = (ref_o, ref_l)
        check_out(out, ref_o, fmt)
        if lse is not None:
            check_lse(lse, ref_l, kv_format=fmt)
    return out, lse, ws


def _cpu_v4(cache):
    if cache.device.type == "cpu":
        return cache
    n = cache.shape[0] * cache.stride(0)
    base = cache.as_strided((n,), (1,), cache.storage_offset()).cpu()
    return base.as_strided(cache.shape, cache.stride(), 0)


# ---------------------------------------------------------------------------------------------
# a covering subset of geometry x heads x tokens x width x invalid x pages x sinks x splits
# ---------------------------------------------------------------------------------------------

def _covering_cases(n=48):
    """Each dimension cycles with its own stride (co-prime lengths spread the combinations);
    the costliest combinations are trimmed so the CPU run stays short."""
    dims = [GEOMS, HEADS, TOKENS, WIDTHS, INVALID, PAGE_SIZES, SINKS, SPLITS, LENGTHS, [False, True]]
    cases = []
    for i in range(n):
        c = [d[(i * (j + 1) + i // len(d)) % len(d)] for j, d in enumerate(dims)]
        (fmt, d_qk), H, T, W, inv, ps, sink, S, lmode, extra = c
        if T * H * W > 33 * 16 * 2048:  # keep the float64 reference cheap
            H = max(1, (33 * 16 * 2048) // (T * W))
            H = max(h for h in HEADS if h <= H) if H >= 1 else 1
        cases.append(pytest.param(fmt, d_qk, H, T, W, inv, ps, sink, S, lmode, extra,
                                  id=f"{fmt}-{d_qk}-H{H}-T{T}-W{W}-{inv}-ps{ps}-sink{sink}-S{S}-len{lmode}"
                                     f"{'-extra' if extra else ''}"))
    return cases


@pytest.mark.parametrize("fmt,d_qk,H,T,W,invalid,page_size,sink_mode,S,lengths_mode,with_extra", _covering_cases())
def test_covering(device, fmt, d_qk, H, T, W, invalid, page_size, sink_mode, S, lengths_mode, with_extra):
    g = torch.Generator().manual_seed(zlib.crc32(repr((fmt, d_qk, H, T, W, invalid, page_size, S)).encode()))
    num_pages = max(2, -(-min(W * T, 4096) // page_size) + 3)
    num_slots = num_pages * page_size
    idx, lengths = make_indices(g, T, W, num_slots, invalid, lengths_mode)
    page_stride = None
    if fmt == "fp8_ds_mla_v4" and page_size % 2:
        page_stride = formats.default_v4_page_stride(page_size) + 576  # extra padding
    cache = make_cache(g, fmt, d_qk, num_pages, page_size, idx, device, page_stride)
    extra = None
    if with_extra:
        eps = [2, 64, 1, 61][W % 4]
        W2 = [7, 64, 130][T % 3]
        e_pages = -(-W2 * T // eps) + 2
        e_idx, e_len = make_indices(g, T, W2, e_pages * eps, ["scattered", "trailing", "none"][H % 3],
                                    ["random", None, "zeros"][W % 3])
        extra = dict(cache=make_cache(g, fmt, d_qk, e_pages, eps, e_idx, device), indices=e_idx, lengths=e_len)
    q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
    sink = make_sink(g, H, sink_mode)
    run_check(q, cache, idx, fmt=fmt, scale=d_qk ** -0.5, device=device, num_splits=S, lengths=lengths,
              extra=extra, sink=sink)


# ---------------------------------------------------------------------------------------------
# splits, extra set, strides, duplicates
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("S", [1, 2, 7, 16, 20, 32, 40, 64, 130, 256, 0])
@pytest.mark.parametrize("fmt,d_qk", [("fp8_ds_mla_v4", 512), ("fp8_ds_mla", 576)])
def test_explicit_splits(device, S, fmt, d_qk):
    """Includes more splits than valid entries (W=5 with lengths down to 0: most splits empty)."""
    g = torch.Generator().manual_seed(10 + S)
    T, H, ps = 5, 16, 64
    for W in (5, 200):
        idx, lengths = make_indices(g, T, W, 20 * ps, "scattered", "random")
        cache = make_cache(g, fmt, d_qk, 20, ps, idx, device)
        q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
        run_check(q, cache, idx, fmt=fmt, scale=0.07, device=device, num_splits=S, lengths=lengths,
                  sink=make_sink(g, H, "finite"))


def test_splits_agree(device):
    """Every split count gives the same result up to fp32 rounding (same semantics through the workspace)."""
    g = torch.Generator().manual_seed(3)
    T, H, W, ps, fmt = 3, 8, 300, 64, "fp8_ds_mla_v4"
    idx, lengths = make_indices(g, T, W, 30 * ps, "middle", "random")
    cache = make_cache(g, fmt, 512, 30, ps, idx, device)
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16).to(device)
    outs = []
    for S in (1, 2, 7, 64, 256):
        out, lse, _ = run_check(q, cache, idx, fmt=fmt, scale=0.05, device=device, num_splits=S,
                                lengths=lengths, check=False)
        outs.append((out.float(), lse))
    for o, l in outs[1:]:
        assert (o - outs[0][0]).abs().max() <= 2e-2 * outs[0][0].abs().max()
        fin = torch.isfinite(outs[0][1])
        assert torch.allclose(l[fin], outs[0][1][fin], atol=1e-4)


@pytest.mark.parametrize("H", [8, 64])
@pytest.mark.parametrize("fmt,d_qk", [("fp8_ds_mla_v4", 512), ("fp8_ds_mla", 576)])
def test_full_and_short_lengths_side_by_side(device, fmt, d_qk, H):
    """The GPU kernels load each split's (V3.2: split 0's) first indices before the lengths
    arrive, guessing that both index sets are full, and keep them only where the lengths agree. Tokens here are full in
    both sets, full in one and a row or more short in the other, or short in both, side by side
    in one call, at split counts that move every split's start when a length is one short. Every
    index past a length names a written row, so a guessed index used where it should not be
    changes the result."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((fmt, H)).encode()))
    W, W2, ps, eps = 200, 130, 64, 61
    # (main length, extra length) per token; W / W2 = full (longer counts as full).
    lens = [(W, W2), (W, W2 - 1), (W - 1, W2), (W - 1, W2 - 1), (W, 1), (3, W2), (W + 5, W2 + 9),
            (W, 0), (0, W2), (W - 64, W2)]
    T = len(lens)
    idx = torch.randint(0, 8 * ps, (T, W), generator=g, dtype=torch.int32)
    e_idx = torch.randint(0, 6 * eps, (T, W2), generator=g, dtype=torch.int32)
    lengths = torch.tensor([m for m, _ in lens], dtype=torch.int32)
    e_len = torch.tensor([x for _, x in lens], dtype=torch.int32)
    cache = make_cache(g, fmt, d_qk, 8, ps, idx, device)
    extra = dict(cache=make_cache(g, fmt, d_qk, 6, eps, e_idx, device), indices=e_idx, lengths=e_len)
    q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
    for S in (0, 2, 3, 7, 16):
        run_check(q, cache, idx, fmt=fmt, scale=d_qk ** -0.5, device=device, num_splits=S, lengths=lengths,
                  extra=extra, sink=make_sink(g, H, "finite"))
    # Lengths for one set only (the other counts as full).
    for S in (3, 7):
        run_check(q, cache, idx, fmt=fmt, scale=d_qk ** -0.5, device=device, num_splits=S, lengths=None,
                  extra=extra, sink=None)
        run_check(q, cache, idx, fmt=fmt, scale=d_qk ** -0.5, device=device, num_splits=S, lengths=lengths,
                  extra=dict(extra, lengths=None), sink=None)


@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_steep_scores_large_lse(device, scale):
    """Scores in the thousands (softmax_scale far above 1/sqrt(d_qk), q scaled by 30): lse
    values of ~4,500-45,000, where an fp32 lse is good to ~1e-7 of itself rather than to the
    1e-3 absolute of small ones (reference.lse_error); outputs still within tolerance."""
    g = torch.Generator().manual_seed(int(scale * 7) + 1)
    T, H, W, ps, fmt = 2, 8, 200, 64, "bf16"
    idx, _ = make_indices(g, T, W, 4 * ps, "none", None)
    cache = make_cache(g, fmt, 512, 4, ps, idx, device)
    q = (torch.randn(T, H, 512, generator=g) * 30).to(torch.bfloat16)
    _, lse, _ = run_check(q, cache, idx, fmt=fmt, scale=scale, device=device, num_splits=0)
    assert lse.abs().max().item() > 1000 * scale


@pytest.mark.parametrize("H", [16, 128])
@pytest.mark.parametrize("S", [0, 130])
def test_one_token_long_row(device, H, S):
    """One token over 8320 entries (a V4 C128 row): the automatic split count (65 on the H200: 64
    rounded up so each split walks 2 tiles, not 3) and
    130 explicit splits of 64 entries, both reduced by the block-wide scan. About 30% of the
    entries are invalid."""
    g = torch.Generator().manual_seed(40 + H + S)
    T, W, ps, fmt = 1, 8320, 2, "fp8_ds_mla_v4"
    idx, lengths = make_indices(g, T, W, 5000 * ps, "scattered", None)
    cache = make_cache(g, fmt, 512, 5000, ps, idx, device)
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    run_check(q, cache, idx, fmt=fmt, scale=512 ** -0.5, device=device, num_splits=S, lengths=lengths,
              sink=make_sink(g, H, "finite"))


STRAGGLER_LENGTHS = [4608, 17, 0, 300, 5, 4000, 64, 1, 129]


@pytest.mark.parametrize("S,H", [(0, 16), (3, 16), (16, 16), (40, 16), (64, 16), (0, 64), (5, 128)])
def test_balanced_split_map(device, S, H):
    """V4 rows with a long compressed set (W >= 4096) and very different lengths take the
    balanced split map: the long tokens get most of the T x S split slots, an empty token still
    gets its slot, and at S = 64 the longest token's share is capped at 256 splits."""
    g = torch.Generator().manual_seed(70 + S + H)
    T, W, ps, fmt = len(STRAGGLER_LENGTHS), 4608, 2, "fp8_ds_mla_v4"
    idx, _ = make_indices(g, T, W, 3000 * ps, "scattered", None)
    lengths = torch.tensor(STRAGGLER_LENGTHS, dtype=torch.int32)
    cache = make_cache(g, fmt, 512, 3000, ps, idx, device)
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    run_check(q, cache, idx, fmt=fmt, scale=512 ** -0.5, device=device, num_splits=S, lengths=lengths,
              sink=make_sink(g, H, "finite"))


def _empty_slots(spans, effective, num_slots):
    """Which of num_slots workspace cells hold an empty split's -inf lse: token t's slots
    spans[t] = (first, count) over its effective[t] entries; slot j of n is empty when
    floor(E (j + 1) / n) == floor(E j / n) (decode_split_range)."""
    empty = torch.zeros(num_slots, dtype=torch.bool)
    for (f, n), e in zip(spans, effective):
        for j in range(n):
            empty[f + j] = e * (j + 1) // n == e * j // n
    return empty


def _balanced_map(costs, S):
    """The balanced split map of sparse_mla_decode.h in Python: (first slot, slots used) per
    token, from F(t) = t + floor(T (S - 1) C_t / C_T + 1/2) and n_t = min(256, F(t + 1) - F(t))."""
    T, total = len(costs), sum(costs)
    F = [t + (2 * T * (S - 1) * sum(costs[:t]) + total) // (2 * total) for t in range(T + 1)]
    return [(F[t], min(256, F[t + 1] - F[t])) for t in range(T)]


@pytest.mark.parametrize("S", [2, 3])
def test_balanced_split_map_nearly_equal_lengths(device, S):
    """Rows of nearly equal length (4,950-5,050 entries, 40 tokens) on the balanced map: every
    token gets exactly S slots (the shares are rounded to the nearest slot: rounded down, the
    drift of the cumulative share around whole slots gave tokens S - 1 or S + 1 at random, and at
    S = 2 a token with one slot walked its whole row alone). Each used workspace cell writes its
    split's lse into the NaN-poisoned workspace; the output matches the float64 reference."""
    g = torch.Generator().manual_seed(95 + S)
    T, H, W, ps, fmt = 40, 8, 5120, 2, "fp8_ds_mla_v4"
    idx, _ = make_indices(g, T, W, 3000 * ps, "none", None)
    lengths = torch.randint(4950, 5051, (T,), generator=g, dtype=torch.int32)
    cache = make_cache(g, fmt, 512, 3000, ps, idx, device)
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    spans = _balanced_map([int(n) for n in lengths], S)
    assert [n for _, n in spans] == [S] * T, spans
    _, _, ws = run_check(q, cache, idx, fmt=fmt, scale=512 ** -0.5, device=device, num_splits=S,
                         lengths=lengths)
    N = T * S
    out_bytes = (H * N * 512 * 4 + 255) // 256 * 256
    cell_lse = ws[out_bytes:out_bytes + H * N * 4].view(torch.float32).view(H, N).cpu()
    assert (~torch.isnan(cell_lse)).all()
    floor_map = [t + T * (S - 1) * int(lengths[:t].sum()) // int(lengths.sum()) for t in range(T + 1)]
    assert any(floor_map[t + 1] - floor_map[t] != S for t in range(T))  # what rounding down gave


@pytest.mark.parametrize("S", [2, 3, 64])
def test_balanced_split_map_slots(device, S):
    """Which workspace cells a balanced call writes: exactly the slots of the map (cumulative
    rounding: every one of the T x S slots is used, none left idle by rounding; at S = 64 the
    4608-entry token's share passes 256 and its last slots stay idle). The workspace is
    poisoned with NaN; each used slot writes its split's lse (finite, or -inf when empty), an
    idle slot writes nothing."""
    g = torch.Generator().manual_seed(90 + S)
    T, H, W, ps, fmt = len(STRAGGLER_LENGTHS), 16, 4608, 2, "fp8_ds_mla_v4"
    idx, _ = make_indices(g, T, W, 3000 * ps, "none", None)
    lengths = torch.tensor(STRAGGLER_LENGTHS, dtype=torch.int32)
    cache = make_cache(g, fmt, 512, 3000, ps, idx, device)
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    _, _, ws = run_check(q, cache, idx, fmt=fmt, scale=512 ** -0.5, device=device, num_splits=S,
                         lengths=lengths)
    N = T * S
    out_bytes = (H * N * 512 * 4 + 255) // 256 * 256
    cell_lse = ws[out_bytes:out_bytes + H * N * 4].view(torch.float32).view(H, N).cpu()
    written = ~torch.isnan(cell_lse)
    want = torch.zeros(N, dtype=torch.bool)
    spans = _balanced_map([max(1, min(n, W)) for n in STRAGGLER_LENGTHS], S)
    for f, n in spans:
        want[f:f + n] = True
    assert (written == want).all(), (spans, written.sum(1))
    if S < 64:
        assert want.all() and spans[0][1] > 1  # no idle slot; the long token split
    else:
        assert not want.all() and spans[0][1] == 256


@pytest.mark.parametrize("T,S", [(257, 2), (300, 2), (511, 2), (512, 3)])
def test_balanced_split_map_past_256_tokens(device, T, S):
    """257-512 tokens take the balanced map too (until the thirty-sixth session they took the
    uniform map: the split blocks' prologue held one token per thread, now two): the workspace
    cells written are exactly the map's slots (NaN-poisoned workspace), the 4608-entry rows get
    the most, and the output matches the float64 reference."""
    g = torch.Generator().manual_seed(96 + T + S)
    H, W, ps, fmt = 2, 4608, 2, "fp8_ds_mla_v4"
    idx, _ = make_indices(g, T, W, 3000 * ps, "none", None)
    lengths = torch.tensor((STRAGGLER_LENGTHS * T)[:T], dtype=torch.int32)
    cache = make_cache(g, fmt, 512, 3000, ps, idx, device)
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    _, _, ws = run_check(q, cache, idx, fmt=fmt, scale=512 ** -0.5, device=device, num_splits=S,
                         lengths=lengths, sink=make_sink(g, H, "finite"))
    N = T * S
    out_bytes = (H * N * 512 * 4 + 255) // 256 * 256
    lse_cells = ws[out_bytes:out_bytes + H * N * 4].view(torch.float32).view(H, N).cpu()
    written = ~torch.isnan(lse_cells)
    # Which cells hold an empty split's -inf: a token of E entries over n slots leaves slot j
    # empty when floor(E (j + 1) / n) == floor(E j / n). (Every slot is written on either map;
    # the uniform map would give the tokens of 0 and 1 entries S - 1 or S empty slots each.)
    want_written = torch.zeros(N, dtype=torch.bool)
    effective = [max(0, min(int(n), W)) for n in lengths]
    spans = _balanced_map([max(1, e) for e in effective], S)
    for f, n in spans:
        want_written[f:f + n] = True
    want_empty = _empty_slots(spans, effective, N)
    assert (written == want_written).all(), written.sum(1)
    assert (torch.isneginf(lse_cells) == want_empty).all()
    assert spans[0][1] > 2 * S and spans[1][1] == 1  # the 4608-entry rows get the most slots


def test_two_split_floor_in_the_automatic_workspace(device):
    """200 tokens with one 4608-entry row among short ones: the automatic policy keeps two splits
    for rows this long up to 256 tokens (the balanced map then spreads the long row), at any head
    count and processor count, and the automatic workspace for 200 tokens covers them."""
    T, H, W, ps, fmt = 200, 16, 4608, 2, "fp8_ds_mla_v4"
    for h in (1, 16, 128):
        assert ws_size(T, h, 0, device) >= ws_size(T, h, 2, device) > 0
        assert ws_size(256, h, 0, device) >= ws_size(256, h, 2, device)
    g = torch.Generator().manual_seed(95)
    idx, _ = make_indices(g, T, W, 3000 * ps, "scattered", None)
    lengths = torch.randint(1, 64, (T,), generator=g, dtype=torch.int32)
    lengths[77] = W
    cache = make_cache(g, fmt, 512, 3000, ps, idx, device)
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    ws = mla_ext.DecodeWorkspace(T, H, device=device)
    ws.tensor.fill_(0xFF)
    out, lse, _ = poisoned_buffers(T, H, 1, device)
    run_check(q, cache, idx, fmt=fmt, scale=512 ** -0.5, device=device, num_splits=0, lengths=lengths,
              out=out, lse=lse, ws=ws.tensor, sink=make_sink(g, H, "finite"))
    assert (ws.tensor != 0xFF).any()  # two splits: partials went through the workspace
    # Calls that cannot take the balanced map (no lengths; a bf16 cache) keep the policy's one
    # split here: the workspace is not touched.
    bf16_cache = make_cache(g, "bf16", 512, 3000, ps, idx, device)
    for c, f, ln in [(cache, fmt, None), (bf16_cache, "bf16", lengths)]:
        ws.tensor.fill_(0xFF)
        out, lse, _ = poisoned_buffers(T, H, 1, device)
        run_check(q, c, idx, fmt=f, scale=512 ** -0.5, device=device, num_splits=0, lengths=ln,
                  out=out, lse=lse, ws=ws.tensor, check=False)
        assert not torch.isnan(out.float()).any() and not torch.isnan(lse).any()
        assert (ws.tensor == 0xFF).all(), f


def test_balanced_split_map_fnuz_and_portable(device):
    """The balanced map on the e4m3fnuz V4 format, and on a GPU through the portable kernels."""
    g = torch.Generator().manual_seed(78)
    T, H, W, ps, fmt = len(STRAGGLER_LENGTHS), 16, 4608, 2, "fp8_ds_mla_v4_fnuz"
    idx, _ = make_indices(g, T, W, 3000 * ps, "scattered", None)
    lengths = torch.tensor(STRAGGLER_LENGTHS, dtype=torch.int32)
    cache = make_cache(g, fmt, 512, 3000, ps, idx, device)
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    for portable in ([False, True] if device != "cpu" else [False]):
        with gpu_path(portable=portable):
            run_check(q, cache, idx, fmt=fmt, scale=0.05, device=device, num_splits=0, lengths=lengths)


@requires_gpu
@pytest.mark.parametrize("fmt", ["fp8_ds_mla_v4", "fp8_ds_mla_v4_fnuz"])
def test_gpu_balanced_split_map_head_tiles(fmt):
    """The balanced map's kernel instances with 16-, 32- and 64-head tiles (40 heads: a partial
    last tile each time), automatic and explicit split counts, tensor-core and portable paths."""
    g = torch.Generator().manual_seed(79 + len(fmt))
    T, H, W, ps = len(STRAGGLER_LENGTHS), 40, 4608, 2
    idx, _ = make_indices(g, T, W, 3000 * ps, "scattered", None)
    lengths = torch.tensor(STRAGGLER_LENGTHS, dtype=torch.int32)
    cache = make_cache(g, fmt, 512, 3000, ps, idx, "cuda")
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    sink = make_sink(g, H, "finite")
    for portable in (False, True):
        for tile in (16, 32, 64):
            with gpu_path(portable=portable, head_tile=tile):
                for S in (0, 3):
                    run_check(q, cache, idx, fmt=fmt, scale=0.05, device="cuda", num_splits=S,
                              lengths=lengths, sink=sink)


def _c128_window_set(g, T, H, fmt, idx):
    """The anchored-map tests' C128 layer around given compressed indices (pages of 2 rows): its
    cache, a 128-entry window set with its own lengths and pages of 256, q and a mixed sink."""
    cache = make_cache(g, fmt, 512, 2100, 2, idx, "cuda")
    e_idx, _ = make_indices(g, T, 128, 4 * 256, "none", None)
    e_len = torch.randint(0, 129, (T,), generator=g, dtype=torch.int32)
    e_cache = make_cache(g, fmt, 512, 4, 256, e_idx, "cuda")
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    return cache, dict(cache=e_cache, indices=e_idx, lengths=e_len), q, make_sink(g, H, "mixed")


@requires_gpu
@pytest.mark.parametrize("T,H", [(300, 16), (512, 16), (300, 11)])
def test_gpu_anchored_map_paths(T, H):
    """The anchored map (automatic counts above 256 tokens, decode_active_slack) on the tensor-core
    and portable kernels, with one and two head groups (head tile 16 or 8), on a C128 layer's two
    sets (compressed rows of 0-4096 entries, one full straggler, and a 128-entry window set with
    its own lengths and pages): poisoned buffers, the float64 reference. 11 heads: a head group of
    3 at head tile 8."""
    g = torch.Generator().manual_seed(370 + T + (H != 16))
    W, fmt = 4096, "fp8_ds_mla_v4"
    idx, _ = make_indices(g, T, W, 2100 * 2, "middle", None)
    lengths = torch.randint(400, 701, (T,), generator=g, dtype=torch.int32)
    lengths[3], lengths[4], lengths[5], lengths[T - 1] = W, 0, 1, W
    cache, extra, q, sink = _c128_window_set(g, T, H, fmt, idx)
    memo = {}
    for portable in (False, True):
        for tile in (16, 8):
            with gpu_path(portable=portable, head_tile=tile):
                run_check(q, cache, idx, fmt=fmt, scale=0.06, device="cuda", num_splits=0, lengths=lengths,
                          extra=extra, sink=sink, memo=memo)


@requires_gpu
@pytest.mark.parametrize("T,H", [(300, 32), (300, 64), (512, 100), (264, 18)])
def test_gpu_anchored_map_wide_heads(T, H):
    """The anchored map at 17-128 heads above 256 tokens (decode_active_wide: a grid of two slots
    per token, S' = 1) on a C128 layer's two sets with short rows and two full stragglers: every
    output against the float64 reference on the 32-head tensor-core tile, the asymmetric 64-head
    kernel (one or two head groups), its mma.sync form and the portable kernels (the symmetric
    warpgroup kernel: test_gpu_asym_switch_both_kernels). On Hopper also the workspace cells
    written (NaN-poisoned): every kernel finishes a token of one slot in its split block, so
    cells are written only for the tokens of several slots. 18 heads: the reduce's last block of
    kReduceAnchoredHeads heads has 2."""
    g = torch.Generator().manual_seed(380 + T + H)
    W, fmt = 4096, "fp8_ds_mla_v4"
    idx, _ = make_indices(g, T, W, 2100 * 2, "middle", None)
    lengths = torch.randint(20, 81, (T,), generator=g, dtype=torch.int32)
    lengths[3], lengths[T - 2] = W, W
    lengths[4], lengths[5] = 0, 1
    cache, extra, q, sink = _c128_window_set(g, T, H, fmt, idx)
    costs = [max(1, int(a) + int(b)) for a, b in zip(lengths.clamp(0, W), extra["lengths"])]
    spans = _active_map(costs, 1)
    assert spans[3][1] > 2 and spans[0][1] == 1  # the stragglers take several slots, the rest one
    N = T * 2  # decode_active_grid
    out_bytes = (H * N * 512 * 4 + 255) // 256 * 256
    hopper = torch.cuda.get_device_capability()[0] == 9  # (227 KB blocks: no tile halved)
    memo = {}
    for portable, tile, mma_sync in ((False, None, None), (False, 32, None), (False, None, True),
                                     (True, None, None)):
        if tile is None and H <= 32 and mma_sync:
            continue  # (the same kernel as the first case)
        with gpu_path(portable=portable, head_tile=tile, mma_sync=mma_sync):
            _, _, ws = run_check(q, cache, idx, fmt=fmt, scale=0.06, device="cuda", num_splits=0,
                                 lengths=lengths, extra=extra, sink=sink, memo=memo)
        if not hopper:
            continue
        cells = ws[out_bytes:out_bytes + H * N * 4].view(torch.float32).view(H, N).cpu()
        want = torch.zeros(N, dtype=torch.bool)
        for f, n in spans:
            want[f:f + n] = n > 1
        assert ((~torch.isnan(cells)) == want.expand(H, N)).all(), (portable, tile, mma_sync)


def test_balanced_split_map_with_window_set(device):
    """A C128 layer's two sets: the compressed rows (main, W = 4096, lengths from 0 to the width)
    and a sliding window (extra, page 256, its own lengths); the map balances their sum."""
    g = torch.Generator().manual_seed(77)
    T, H, W, fmt = 6, 16, 4096, "fp8_ds_mla_v4"
    idx, _ = make_indices(g, T, W, 2100 * 2, "middle", None)
    lengths = torch.tensor([4096, 0, 33, 2000, 1, 90], dtype=torch.int32)
    cache = make_cache(g, fmt, 512, 2100, 2, idx, device)
    e_idx, _ = make_indices(g, T, 128, 4 * 256, "none", None)
    e_len = torch.tensor([128, 7, 0, 128, 64, 1], dtype=torch.int32)
    e_cache = make_cache(g, fmt, 512, 4, 256, e_idx, device)
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    for S in (0, 5):
        run_check(q, cache, idx, fmt=fmt, scale=0.06, device=device, num_splits=S, lengths=lengths,
                  extra=dict(cache=e_cache, indices=e_idx, lengths=e_len), sink=make_sink(g, H, "mixed"))


@pytest.mark.parametrize("fmt,d_qk", GEOMS)
def test_extra_set_own_page_size(device, fmt, d_qk):
    g = torch.Generator().manual_seed(5)
    T, H, W, W2 = 5, 16, 128, 96
    idx, lengths = make_indices(g, T, W, 3 * 256, "trailing", "random")
    cache = make_cache(g, fmt, d_qk, 3, 256, idx, device)
    e_idx, e_len = make_indices(g, T, W2, 200 * 2, "scattered", "zeros")
    e_cache = make_cache(g, fmt, d_qk, 200, 2, e_idx, device)
    q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
    for S in (1, 5):
        run_check(q, cache, idx, fmt=fmt, scale=d_qk ** -0.5, device=device, num_splits=S, lengths=lengths,
                  extra=dict(cache=e_cache, indices=e_idx, lengths=e_len), sink=make_sink(g, H, "mixed"))
    # extra set without extra_lengths, main set without lengths
    run_check(q, cache, idx, fmt=fmt, scale=d_qk ** -0.5, device=device, num_splits=3,
              extra=dict(cache=e_cache, indices=e_idx))


def test_v4_padded_page_stride_and_4d(device):
    g = torch.Generator().manual_seed(6)
    T, H, W, ps = 4, 8, 100, 61
    idx, lengths = make_indices(g, T, W, 10 * ps, "none", None)
    stride = formats.default_v4_page_stride(ps) + 3 * 576
    cache = make_cache(g, "fp8_ds_mla_v4", 512, 10, ps, idx, device, page_stride=stride)
    assert cache.stride(0) == stride
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    run_check(q, cache, idx, fmt="fp8_ds_mla_v4", scale=0.05, device=device, num_splits=2)
    run_check(q, cache.unsqueeze(2), idx, fmt="fp8_ds_mla_v4", scale=0.05, device=device, num_splits=1)
    # the same bytes viewed as float8_e4m3fn / int8
    for dt in (torch.float8_e4m3fn, torch.int8):
        run_check(q, cache.view(dt), idx, fmt="fp8_ds_mla_v4", scale=0.05, device=device, num_splits=3,
                  check=False)


def test_duplicates_and_nan_unselected(device):
    """Duplicate slots count once each; every unselected slot is NaN garbage (never read)."""
    g = torch.Generator().manual_seed(7)
    T, H, fmt = 3, 16, "fp8_ds_mla"
    idx = torch.tensor([[5, 5, 5, 9], [9, -1, 9, 70], [70, 70, 70, 70]], dtype=torch.int32)
    cache = make_cache(g, fmt, 576, 2, 64, idx, device)
    q = torch.randn(T, H, 576, generator=g).to(torch.bfloat16)
    for S in (1, 2, 4):
        run_check(q, cache, idx, fmt=fmt, scale=0.05, device=device, num_splits=S)


@pytest.mark.parametrize("fmt,d_qk", [("fp8_ds_mla", 576), ("fp8_ds_mla_v4", 512), ("bf16", 576)])
def test_nan_in_q_poisons_its_row_only(device, fmt, d_qk):
    """NaN in q[t, h] (one element) makes that token and head's output and lse NaN, at every
    split count; every other (token, head) matches the reference."""
    g = torch.Generator().manual_seed(zlib.crc32(fmt.encode()) + 17)
    T, H, W = 5, 16, 150
    idx, _ = make_indices(g, T, W, 6 * 64, "scattered", None)
    cache = make_cache(g, fmt, d_qk, 6, 64, idx, device)
    q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
    bad = [(0, 3, 7), (2, 15, d_qk - 1), (4, 0, 300)]
    for t, h, d in bad:
        q[t, h, d] = float("nan")
    hit = torch.zeros(T, H, dtype=torch.bool)
    for t, h, _ in bad:
        hit[t, h] = True
    ref_o, ref_l = reference.sparse_mla_decode(q, _cpu_v4(cache), idx, kv_format=fmt, softmax_scale=0.05)
    for S in (1, 2, 4):
        out, lse, ws = poisoned_buffers(T, H, S, device)
        mla_ext.sparse_mla_decode(q.to(device), cache, idx.to(device), kv_format=fmt, softmax_scale=0.05,
                                  output=out, workspace=ws, lse=lse, num_splits=S)
        out, lse = out.cpu(), lse.cpu()
        assert torch.isnan(out[hit].float()).all() and torch.isnan(lse[hit]).all(), S
        check_out(out[~hit], ref_o[~hit], fmt)
        check_lse(lse[~hit], ref_l[~hit], kv_format=fmt)


def make_inf_score_case(fmt):
    """(q, cache, indices, sink) of a V3.2-geometry call (576 dims; cache on the CPU) whose scores
    hold -inf and +inf: selected rows with -inf (or +inf) in the last RoPE dim (not a value dim),
    q's RoPE dim 0.5 in every head. Token 0: 96 -inf rows (three 32-row chunks) before 64 finite
    ones; 1: after them; 2: interleaved; 3: -inf rows only (an empty row); 4: one +inf row."""
    g = torch.Generator().manual_seed(zlib.crc32(fmt.encode()) + 23)
    T, H, d_qk = 5, 16, 576
    live = torch.arange(0, 160, dtype=torch.int32)
    dead = torch.arange(160, 320, dtype=torch.int32)
    idx = torch.stack([torch.cat([dead[:96], live[:64]]), torch.cat([live[:64], dead[:96]]),
                       torch.stack([dead[:80], live[:80]], 1).reshape(-1), dead[:160],
                       torch.cat([live[:159], torch.tensor([320], dtype=torch.int32)])])
    cache = formats.alloc_kv_cache(fmt, 6, 64, d_qk, device="cpu")
    rows = torch.randn(321, d_qk, generator=g) * 2
    rows[160:320, d_qk - 1] = -INF
    rows[320, d_qk - 1] = INF
    formats.write_kv_rows(cache, fmt, torch.arange(321), rows)
    q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
    q[..., d_qk - 1] = 0.5
    return q, cache, idx, torch.randn(H, generator=g)


def check_inf_score_case(out, lse, ref_o, ref_l, fmt):
    """The op's result on make_inf_score_case: tokens 0-2 as the reference (the -inf rows weigh
    0), token 3 output 0 and lse -inf, token 4 NaN."""
    check_out(out[:4], ref_o[:4], fmt)
    check_lse(lse[:4], ref_l[:4], kv_format=fmt)
    assert (out[3] == 0).all() and torch.isneginf(lse[3]).all()
    assert torch.isnan(out[4].float()).all() and torch.isnan(lse[4]).all()


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "bf16"])
def test_neg_inf_scores_weigh_zero_anywhere(device, fmt):
    """A score of -inf weighs 0 wherever its row sits in the index row and at every split count
    (the CPU twin made a split NaN when its leading chunk of 32 rows scored only -inf; the GPU
    kernels did not); a (token, head) whose every score is -inf gives output 0 and lse -inf, as an
    empty row, sink or not; a +inf score gives NaN (make_inf_score_case)."""
    q, cache, idx, sink = make_inf_score_case(fmt)
    ref_o, ref_l = reference.sparse_mla_decode(q, cache, idx, kv_format=fmt, softmax_scale=0.05, attn_sink=sink)
    assert torch.isfinite(ref_l[:3]).all() and (ref_o[3] == 0).all() and torch.isneginf(ref_l[3]).all()
    assert torch.isnan(ref_o[4]).all() and torch.isnan(ref_l[4]).all()
    T, H = q.shape[:2]
    cache_d, idx_d = cache.to(device), idx.to(device)
    for S in (1, 2, 3, 5, 0):
        out, lse, ws = poisoned_buffers(T, H, S, device)
        mla_ext.sparse_mla_decode(q.to(device), cache_d, idx_d, kv_format=fmt, softmax_scale=0.05, output=out,
                                  workspace=ws, lse=lse, attn_sink=sink.to(device), num_splits=S)
        check_inf_score_case(out.cpu(), lse.cpu(), ref_o, ref_l, fmt)


def test_strided_views_nothing_outside_written(device):
    g = torch.Generator().manual_seed(8)
    T, H, W, fmt = 6, 8, 70, "fp8_ds_mla_v4"
    idx_full, _ = make_indices(g, T, W + 9, 8 * 64, "scattered", None)
    idx = idx_full[:, 3:3 + W]  # token stride W + 9
    cache = make_cache(g, fmt, 512, 8, 64, idx, device)
    q = torch.randn(H, T, 512 + 64, generator=g).to(torch.bfloat16).transpose(0, 1)[..., :512]
    out_buf = poison_(torch.empty(T + 2, H, 2, 512 + 8, dtype=torch.bfloat16, device=device))
    out = out_buf[1:T + 1, :, 1, :512]
    lse_buf = poison_(torch.empty(H, T + 3, device=device))
    lse = lse_buf[:, 1:T + 1].T
    lengths_buf = torch.randint(0, W + 1, (T, 2), generator=g, dtype=torch.int32)
    sink_buf = torch.randn(H, 2, generator=g)
    for S in (1, 3):
        ws = torch.full((ws_size(T, H, S, device),), 0xFF, dtype=torch.uint8, device=device)
        mla_ext.sparse_mla_decode(q.to(device), cache, idx.to(device), kv_format=fmt, softmax_scale=0.05,
                                  output=out, workspace=ws, lse=lse, num_splits=S,
                                  lengths=lengths_buf.to(device)[:, 1], attn_sink=sink_buf.to(device)[:, 0])
        ref_o, ref_l = reference.sparse_mla_decode(q, _cpu_v4(cache), idx, kv_format=fmt, softmax_scale=0.05,
                                                   lengths=lengths_buf[:, 1], attn_sink=sink_buf[:, 0])
        assert_close_rel(out, ref_o, torch.bfloat16)
        check_lse(lse, ref_l)
    # nothing outside the views was written
    mask = torch.ones(out_buf.shape, dtype=torch.bool, device=device)
    mask[1:T + 1, :, 1, :512] = False
    assert out_buf[mask].isnan().all()
    assert lse_buf[:, 0].isnan().all() and lse_buf[:, T + 1:].isnan().all()


def test_edge_sinks_and_empty(device):
    """+inf sink -> 0 output (lse unchanged); NaN sink -> NaN output (lse unchanged); empty rows ->
    0 / -inf; W = 0; T = 0. S = 40: the
    GPU reduce in three column groups, most splits empty."""
    g = torch.Generator().manual_seed(9)
    T, H, fmt = 4, 8, "bf16"
    idx = torch.tensor([[1, 2], [-1, -1], [3, 400], [0, 0]], dtype=torch.int32)
    cache = make_cache(g, fmt, 512, 4, 64, idx, device)
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    sink = make_sink(g, H, "mixed")
    for S in (1, 2, 40):
        out, lse, _ = run_check(q, cache, idx, fmt=fmt, scale=0.05, device=device, num_splits=S, sink=sink)
        assert (out[:, 1::3] == 0).all()          # +inf sink heads
        assert (out[1] == 0).all() and torch.isneginf(lse[1]).all()
    # NaN sink on heads 2 and 5: NaN output there, lse as without a sink; the empty token still
    # gets 0 and -inf
    nan_sink = make_sink(g, H, "finite")
    nan_sink[[2, 5]] = float("nan")
    for S in (1, 2, 40):
        _, lse0, _ = run_check(q, cache, idx, fmt=fmt, scale=0.05, device=device, num_splits=S)
        out, lse, ws = poisoned_buffers(T, H, S, device)
        mla_ext.sparse_mla_decode(q.to(device), cache, idx.to(device), kv_format=fmt, softmax_scale=0.05, output=out,
                                  workspace=ws, lse=lse, num_splits=S, attn_sink=nan_sink.to(device))
        out, lse = out.cpu(), lse.cpu()
        live = torch.tensor([0, 2, 3])
        assert torch.isnan(out[live][:, [2, 5]].float()).all()
        assert not torch.isnan(out[live][:, [0, 1, 3, 4, 6, 7]].float()).any()
        assert (out[1] == 0).all() and torch.isneginf(lse[1]).all()
        assert torch.equal(lse, lse0.cpu()), (lse - lse0.cpu()).abs().max()
    # W = 0: every row empty
    idx0 = torch.empty(T, 0, dtype=torch.int32)
    out, lse, _ = run_check(q, cache, idx0, fmt=fmt, scale=0.05, device=device, num_splits=0)
    assert (out == 0).all() and torch.isneginf(lse).all()
    # T = 0
    out0 = torch.empty(0, H, 512, dtype=torch.bfloat16, device=device)
    mla_ext.sparse_mla_decode(q[:0].to(device), cache, idx[:0].to(device), kv_format=fmt, softmax_scale=0.05,
                              output=out0, workspace=torch.empty(0, dtype=torch.uint8, device=device))


# ---------------------------------------------------------------------------------------------
# realistic DeepSeek inputs
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,kv_format", [("v4_swa", None), ("v4_c4", None), ("v4_c128", None), ("v32", None),
                                            ("v4_c4", "bf16"), ("v32", "bf16"), ("v4_c4", "fp8_ds_mla_v4_fnuz"),
                                            ("v32", "fp8_ds_mla_fnuz")])
def test_builder_layers(device, kind, kv_format):
    inp = builders.build_decode_inputs(kind, batch=3, num_heads=16, context_len=(200, 1500), mtp=1,
                                       kv_format=kv_format, topk=256 if kind in ("v4_c4", "v32") else None,
                                       device=device, seed=11)
    T, H = inp.num_tokens, inp.num_heads
    ref_o, ref_l = inp.reference()
    for S in (0, 1, 4):
        out, lse, ws = poisoned_buffers(T, H, S, device)
        mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, inp.indices, output=out, workspace=ws, lse=lse,
                                  num_splits=S, **inp.op_kwargs())
        check_out(out, ref_o, inp.kv_format)
        check_lse(lse, ref_l.cpu(), kv_format=inp.kv_format)


@pytest.mark.parametrize("kw,exc,words", [
    (dict(topk=-1), ValueError, "topk must be >= 1, got -1"),
    (dict(topk=2.7), TypeError, "expected topk to be an integer, got 2.7"),
    (dict(batch=2.5), TypeError, "expected batch to be an integer, got 2.5"),
    (dict(num_heads=True), TypeError, "expected num_heads to be an integer, got True"),
    (dict(mtp=-1), ValueError, "mtp >= 0, got batch=2, num_heads=4, mtp=-1"),
    (dict(context_len=(300,)), ValueError, "context_len must be an int or a \\(lo, hi\\) pair"),
    (dict(context_len=(300, 200.0)), TypeError, "expected context_len to be an integer, got 200.0"),
    (dict(context_len=(400, 300)), ValueError, "must satisfy 1 \\+ mtp <= lo <= hi"),
    (dict(dtype_q=torch.float16), ValueError, "dtype_q must be torch.bfloat16 .*, got torch.float16"),
])
def test_builder_refuses_bad_counts(kw, exc, words):
    """build_decode_inputs names a non-integer or out-of-range count instead of truncating it
    (topk 2.7 -> 2) or failing inside torch."""
    args = dict(batch=2, num_heads=4, context_len=300)
    args.update(kw)
    with pytest.raises(exc, match=words):
        builders.build_decode_inputs("v4_c4", **args)


def test_builder_accepts_numpy_integers():
    np = pytest.importorskip("numpy")
    a = builders.build_decode_inputs("v4_c4", batch=np.int64(2), num_heads=4, context_len=np.int32(300), topk=np.int64(64))
    b = builders.build_decode_inputs("v4_c4", batch=2, num_heads=4, context_len=(300, 300), topk=64)
    assert torch.equal(a.q, b.q) and torch.equal(a.indices, b.indices) and torch.equal(a.extra_indices, b.extra_indices)


# ---------------------------------------------------------------------------------------------
# FP8 flavours: e4m3fn (NVIDIA, gfx950) and e4m3fnuz (gfx942 engines)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,d_qk", FNUZ_GEOMS)
@pytest.mark.parametrize("S", [1, 3, 0])
def test_fnuz_formats(device, fmt, d_qk, S):
    """fnuz caches (main + extra set, lengths, sink, invalid entries) against the float64 reference."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((fmt, S)).encode()))
    T, H, W, W2 = 5, 16, 200, 70
    idx, lengths = make_indices(g, T, W, 8 * 64, "scattered", "random")
    cache = make_cache(g, fmt, d_qk, 8, 64, idx, device)
    e_idx, e_len = make_indices(g, T, W2, 40 * 2, "trailing", "zeros")
    e_cache = make_cache(g, fmt, d_qk, 40, 2, e_idx, device)
    q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
    run_check(q, cache, idx, fmt=fmt, scale=d_qk ** -0.5, device=device, num_splits=S, lengths=lengths,
              extra=dict(cache=e_cache, indices=e_idx, lengths=e_len), sink=make_sink(g, H, "finite"))
    # the same bytes viewed as int8 / float8_e4m3fnuz give the same bits
    out, lse, _ = run_check(q, cache, idx, fmt=fmt, scale=d_qk ** -0.5, device=device, num_splits=S,
                            lengths=lengths)
    for dt in (torch.int8, torch.float8_e4m3fnuz):
        o2, l2, _ = run_check(q, cache.view(dt), idx, fmt=fmt, scale=d_qk ** -0.5, device=device, num_splits=S,
                              lengths=lengths, check=False)
        assert torch.equal(o2.view(torch.int16), out.view(torch.int16))
        assert torch.equal(l2.view(torch.int32), lse.view(torch.int32))


@pytest.mark.parametrize("fnuz_fmt,fn_fmt,d_qk", [("fp8_ds_mla_fnuz", "fp8_ds_mla", 576),
                                                  ("fp8_ds_mla_v4_fnuz", "fp8_ds_mla_v4", 512)])
def test_flavour_is_honoured(device, fnuz_fmt, fn_fmt, d_qk):
    """A fnuz cache read as its e4m3fn twin decodes to ~2x the values (and NaN at the +-240 bytes):
    the op must not match the fnuz reference then (guards against a kernel that ignores the flavour)."""
    g = torch.Generator().manual_seed(41)
    T, H, W = 3, 8, 64
    idx, _ = make_indices(g, T, W, 4 * 64, "none", None)
    cache = make_cache(g, fnuz_fmt, d_qk, 4, 64, idx, device)
    q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
    run_check(q, cache, idx, fmt=fnuz_fmt, scale=0.05, device=device, num_splits=1)
    out, lse, ws = poisoned_buffers(T, H, 1, device)
    mla_ext.sparse_mla_decode(q.to(device), cache, idx.to(device), kv_format=fn_fmt, softmax_scale=0.05, output=out,
                              workspace=ws, lse=lse, num_splits=1)
    ref_o, _ = reference.sparse_mla_decode(q, cache.cpu() if not _is_v4(fnuz_fmt) else _cpu_v4(cache), idx,
                                           kv_format=fnuz_fmt, softmax_scale=0.05)
    err = ((out.double().cpu() - ref_o).abs().max() / ref_o.abs().max()).item()
    assert not err <= 0.2, err  # NaN counts as different


def _every_byte_rows(fmt, n_regular, g, v32_exponents=None):
    """Rows whose FP8 value bytes take every value: n_regular rows of all non-NaN bytes (each row a
    different permutation, so every byte meets several scale tiles), then one row per NaN code of
    the flavour (a regular row with that code at one position). Scales are chosen so that every
    value x scale is exact in bf16; v32_exponents (V3.2 only): scale (row, group) is
    m x 2^k with k the list's entries in turn and m in {1, 1.25, 1.5, 1.75}. Returns (latent uint8
    [n, nlat], scales, scale_f64 [n, nlat], rope bf16 [n, 64], nan_row bool [n])."""
    fnuz = formats.is_fnuz(fmt)
    v32 = formats.kv_layout(fmt) == "fp8_ds_mla"
    nlat, tile = (512, 128) if v32 else (448, 64)
    nan_codes = [0x80] if fnuz else [0x7F, 0xFF]
    regular = torch.tensor([b for b in range(256) if b not in nan_codes])
    j = torch.arange(nlat)
    rows = [regular[(j * (2 * r + 1) + 53 * r) % regular.numel()] for r in range(n_regular)]
    for k, code in enumerate(nan_codes):
        row = rows[k].clone()
        row[37 + 150 * k] = code
        rows.append(row)
    latent = torch.stack(rows).to(torch.uint8)
    n = latent.shape[0]
    if v32 and v32_exponents is not None:
        k = torch.tensor(v32_exponents)[torch.arange(4 * n) % len(v32_exponents)].view(n, 4)
        m = 1 + 0.25 * torch.randint(0, 4, (n, 4), generator=g)
        scales = torch.ldexp(m, k).float()
        scale_f = scales.double()
    elif v32:  # fp32 scales with <= 3 significant bits: e4m3 (4 bits) x scale fits bf16's 8
        base = torch.tensor([0.75, 3.0 * 2 ** -5, 40.0, 1.25])
        scales = base[torch.randint(0, 4, (n, 4), generator=g)] * 2.0 ** torch.randint(-3, 4, (n, 4), generator=g)
        scale_f = scales.double()
    else:
        scales = torch.randint(100, 150, (n, 7), generator=g).to(torch.uint8)
        scale_f = formats.ue8m0_to_float(scales).double()
    rope = torch.randn(n, 64, generator=g).to(torch.bfloat16)
    nan_row = torch.zeros(n, dtype=torch.bool)
    nan_row[n_regular:] = True
    return latent, scales, scale_f.repeat_interleave(tile, dim=1), rope, nan_row


def _write_raw_rows(cache, fmt, slots, latent, scales, rope):
    ps = cache.shape[1]
    page, off = slots // ps, slots % ps
    if formats.kv_layout(fmt) == "fp8_ds_mla":
        cache[page, off, :512] = latent
        cache[page, off, 512:528] = scales.to(torch.float32).contiguous().view(torch.uint8)
        cache[page, off, 528:] = rope.contiguous().view(torch.uint8)
    else:
        data, sc = formats._v4_views(cache)
        data[page, off, :448] = latent
        data[page, off, 448:] = rope.contiguous().view(torch.uint8)
        sc[page, off, :7] = scales
        sc[page, off, 7] = 0


def check_every_byte_value(device, fmt, d_qk, num_splits, num_heads=16, v32_exponents=None):
    """The op on a cache whose FP8 bytes take all 256 values. Each query token selects exactly one
    row (amid invalid entries), so its output is that row's first 512 dims, decoded and rounded to
    bf16, for every head: compared exactly with a table built from the bit fields. Rows holding the
    flavour's NaN code give NaN outputs and lse, whatever the split count (a split that met a
    NaN score poisons the reduction, on the GPU and the CPU alike)."""
    g = torch.Generator().manual_seed(zlib.crc32(fmt.encode()) + num_splits)
    latent, scales, scale_f, rope, nan_row = _every_byte_rows(fmt, 5, g, v32_exponents)
    n = latent.shape[0]
    ps, num_pages = 4, 4
    cache = formats.alloc_kv_cache(fmt, num_pages, ps, d_qk)  # garbage everywhere else
    slots = torch.randperm(num_pages * ps, generator=g)[:n]
    _write_raw_rows(cache, fmt, slots, latent, scales, rope)
    if device != "cpu":
        cache = _to_device(cache, fmt, device)
    table = e4m3_reference_table(formats.is_fnuz(fmt))
    nlat = latent.shape[1]
    K = torch.cat([table[latent.long()] * scale_f, rope.double()], dim=1)  # [n, d_qk] float64
    assert torch.equal(torch.isnan(K[:, :nlat]).any(dim=1), nan_row)
    T, H = n, num_heads
    bad = num_pages * ps
    idx = torch.tensor([[-1, int(s), bad + 3] if t % 2 else [int(s), -5, -1] for t, s in enumerate(slots)],
                       dtype=torch.int32)
    q = (torch.randn(T, H, d_qk, generator=g) * 0.25).to(torch.bfloat16)
    scale = 1e-3
    out, lse, ws = poisoned_buffers(T, H, num_splits, device)
    mla_ext.sparse_mla_decode(q.to(device), cache, idx.to(device), kv_format=fmt, softmax_scale=scale, output=out,
                              workspace=ws, lse=lse, num_splits=num_splits)
    out, lse = out.cpu(), lse.cpu()
    ok = ~nan_row
    V = K[:, :512]
    assert torch.equal(V[ok].to(torch.bfloat16).double(), V[ok])  # chosen to be exact in bf16
    want = V[ok][:, None, :].expand(-1, H, -1)
    assert not torch.isnan(out[ok]).any()
    assert torch.equal(out[ok].double(), want), (out[ok].double() - want).abs().max()
    # lse of one row = its score
    s_ref = scale * torch.einsum("thd,td->th", q.double(), K.nan_to_num())
    s_abs = scale * torch.einsum("thd,td->th", q.double().abs(), K.nan_to_num().abs())
    err = (lse[ok].double() - s_ref[ok]).abs()
    assert bool((err <= 1e-4 * s_abs[ok] + 1e-6).all()), (err / s_abs[ok]).max()
    assert torch.isnan(out[nan_row].float()).all() and torch.isnan(lse[nan_row]).all()


def _to_device(cache, fmt, device):
    if _is_v4(fmt):
        n = cache.shape[0] * cache.stride(0)
        base = cache.as_strided((n,), (1,), 0).to(device)
        return base.as_strided(cache.shape, cache.stride(), 0)
    return cache.to(device)


@pytest.mark.parametrize("fmt,d_qk", FP8_GEOMS)
@pytest.mark.parametrize("S", [1, 2])
def test_fp8_every_byte_value(device, fmt, d_qk, S):
    check_every_byte_value(device, fmt, d_qk, S)


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_ds_mla_fnuz"])
@pytest.mark.parametrize("num_heads", [64, 128])
def test_v32_keys_exact_across_scale_exponents(device, fmt, num_heads):
    """test_fp8_every_byte_value for V3.2 rows whose fp32 group scales are m x 2^k, k from -110 to
    15. On Hopper the 64-head tile (forced here; at 128 heads two head groups, which the 2-block
    cluster kernel serves) puts value x 2^k into K with one bf16 multiply by 2^(k + 120) where all
    four groups of the row have k <= 7 and the thread's bytes hold no NaN code, and through fp32
    otherwise. Per row (4 groups each): rows 0-2 take the bf16 multiply with k = 6 and 7 among
    them, row 3 has one k = 8 among 7s (the whole row falls back), row 4 larger k; the two NaN-code
    rows (0x7f, 0xff; e4m3fnuz: 0x80) have scales the multiply would take. Every output must be its
    row exactly, and NaN-code rows NaN."""
    exps = [7, 6, -110, 5, 7, 7, 7, 7, -20, 0, 7, 6, 7, 7, 8, 7, 9, 15, 6, -110, 7, 6, 5, 0, 6, 7, -20, 7]
    with (gpu_path(head_tile=64) if device != "cpu" else contextlib.nullcontext()):
        for S in (1, 2):
            check_every_byte_value(device, fmt, 576, S, num_heads=num_heads, v32_exponents=exps)


# UE8M0 scale bytes at and near their edges: 0 is 2^-127 (an fp32 subnormal), 255 is NaN.
SCALE_EDGE_BYTES = [0, 1, 2, 64, 126, 127, 128, 129, 190, 200]


def _run_v4_one_row_per_token(g, device, fmt, d_qk, S, latent, scales, softmax_scale):
    """Rows of the given latent / scale bytes (random RoPE) in a small cache, token t selecting
    row t only (its slot first or second in a two-wide index row, beside an invalid one), at
    16 heads: (rope, q, out, lse) with out and lse on the CPU."""
    n = latent.shape[0]
    rope = torch.randn(n, 64, generator=g).to(torch.bfloat16)
    ps, num_pages = 4, 4
    cache = formats.alloc_kv_cache(fmt, num_pages, ps, d_qk)
    slots = torch.randperm(num_pages * ps, generator=g)[:n]
    _write_raw_rows(cache, fmt, slots, latent, scales, rope)
    if device != "cpu":
        cache = _to_device(cache, fmt, device)
    T, H = n, 16
    idx = torch.tensor([[int(s), -1] if t % 2 else [-3, int(s)] for t, s in enumerate(slots)], dtype=torch.int32)
    q = (torch.randn(T, H, d_qk, generator=g) * 0.25).to(torch.bfloat16)
    out, lse, ws = poisoned_buffers(T, H, S, device)
    mla_ext.sparse_mla_decode(q.to(device), cache, idx.to(device), kv_format=fmt, softmax_scale=softmax_scale,
                              output=out, workspace=ws, lse=lse, num_splits=S)
    return rope, q, out.cpu(), lse.cpu()


@pytest.mark.parametrize("fmt,d_qk", [g for g in FP8_GEOMS if _is_v4(g[0])])
@pytest.mark.parametrize("S", [1, 2])
def test_v4_scale_byte_edges(device, fmt, d_qk, S):
    """V4 rows whose groups carry the UE8M0 edge bytes (SCALE_EDGE_BYTES, every group of every row
    a different one) and one row with a 255 (NaN) group. The FP8 bytes have exponent fields 10-13,
    so every product is an fp32 / bf16 normal (>= 2^-125 at scale byte 0: no subnormal on any path)
    and exact in bf16. Each token selects one row, so its output is that row decoded exactly, for
    every head; the NaN row's token gets NaN output and lse."""
    g = torch.Generator().manual_seed(zlib.crc32(fmt.encode()) + 7 * S)
    fnuz = formats.is_fnuz(fmt)
    n_regular = 6
    n = n_regular + 1
    codes = torch.tensor([(sgn << 7) | (e << 3) | m for sgn in (0, 1) for e in range(10, 14) for m in range(8)])
    latent = codes[torch.randint(0, codes.numel(), (n, 448), generator=g)].to(torch.uint8)
    edges = torch.tensor(SCALE_EDGE_BYTES)
    scales = edges[(torch.arange(n)[:, None] * 7 + torch.arange(7)[None, :]) % edges.numel()].to(torch.uint8)
    scales[n_regular, 3] = 255
    scale = 1e-3
    rope, q, out, lse = _run_v4_one_row_per_token(g, device, fmt, d_qk, S, latent, scales, scale)
    table = e4m3_reference_table(fnuz)
    scale_f = torch.where(scales == 255, torch.tensor(float("nan"), dtype=torch.float64),
                          torch.ldexp(torch.ones(scales.shape, dtype=torch.float64), scales.long() - 127))
    assert scale_f[0, 0] == 2.0 ** -127  # byte 0 is 2^-127, not 0 or 2^-126
    K = torch.cat([table[latent.long()] * scale_f.repeat_interleave(64, dim=1), rope.double()], dim=1)
    ok = torch.arange(n) < n_regular
    V = K[:, :512]
    assert torch.equal(V[ok].to(torch.bfloat16).double(), V[ok])
    assert V[ok][:, :448].abs().min() >= 2.0 ** -125 and torch.isnan(V[~ok]).any(dim=1).all()  # fp32 normals
    want = V[ok][:, None, :].expand(-1, 16, -1)
    assert torch.equal(out[ok].double(), want), (out[ok].double() - want).abs().max()
    s_ref = scale * torch.einsum("thd,td->th", q[ok].double(), K[ok])
    s_abs = scale * torch.einsum("thd,td->th", q[ok].double().abs(), K[ok].abs())
    assert bool(((lse[ok].double() - s_ref).abs() <= 1e-4 * s_abs + 1e-30).all())
    assert torch.isnan(out[~ok].float()).all() and torch.isnan(lse[~ok]).all()


@pytest.mark.parametrize("fmt,d_qk", [g for g in FP8_GEOMS if _is_v4(g[0])])
@pytest.mark.parametrize("S", [1, 2])
def test_v4_products_rounded_once(device, fmt, d_qk, S):
    """Every non-NaN FP8 code times the smallest scales (bytes 0-6: products down to bf16
    subnormals and below half of the smallest, which round to zero) and times scales on both
    sides of 2^7 (bytes 133-136: the limit of the GPU tiles' bf16 multiply by 2^(e - 7),
    dequant4_ue8m0_fast, above which they take the fp32 path). The output of a token selecting
    one row is that row: value x scale computed exactly, then rounded once to bf16 (round to
    nearest even, subnormals kept)."""
    g = torch.Generator().manual_seed(zlib.crc32(fmt.encode()) + 11 * S)
    fnuz = formats.is_fnuz(fmt)
    table = e4m3_reference_table(fnuz)
    codes = torch.tensor([b for b in range(256) if not torch.isnan(table[b])])
    scale_bytes = [0, 1, 2, 3, 4, 5, 6, 133, 134, 135, 136]
    n = 8
    latent = torch.stack([codes[torch.randperm(codes.numel(), generator=g)].repeat(2)[:448] for _ in range(n)])
    latent = latent.to(torch.uint8)
    scales = torch.tensor(scale_bytes)[torch.randint(0, len(scale_bytes), (n, 7), generator=g)].to(torch.uint8)
    scales[0] = torch.tensor([0, 1, 2, 3, 4, 5, 6], dtype=torch.uint8)  # every small byte at once
    scales[1] = torch.tensor([133, 134, 135, 136, 0, 134, 135], dtype=torch.uint8)
    rope, _, out, _ = _run_v4_one_row_per_token(g, device, fmt, d_qk, S, latent, scales, 1e-3)
    scale_f = torch.ldexp(torch.ones(scales.shape, dtype=torch.float64), scales.long() - 127)
    exact = table[latent.long()] * scale_f.repeat_interleave(64, dim=1)  # exact in fp32 too
    assert torch.equal(exact.float().double(), exact)
    V = torch.cat([exact.float().to(torch.bfloat16), rope], dim=1)  # one rounding, fp32 -> bf16
    tiny = exact.abs() < 2.0 ** -126
    assert bool((tiny & (exact != 0)).any()) and bool((V[:, :448][tiny] == 0).any())  # subnormals, zeros
    assert bool((V[:, :448][tiny] != 0).any())
    want = V[:, None, :].expand(-1, 16, -1)
    diff = out.double() != want.double()  # (the sum of one term drops -0's sign: values compared)
    assert not bool(diff.any()), (out[diff].double(), want[diff].double())


@pytest.mark.parametrize("fmt,d_qk", [g for g in FP8_GEOMS if _is_v4(g[0])])
def test_v4_nan_code_in_a_selected_row(device, fmt, d_qk):
    """A NaN code (e4m3fn 0x7f / 0xff, e4m3fnuz 0x80) anywhere in a selected V4 row makes its
    token's output and lse NaN for every head; tokens of rows without one get their row exactly."""
    g = torch.Generator().manual_seed(zlib.crc32(fmt.encode()) + 3)
    fnuz = formats.is_fnuz(fmt)
    table = e4m3_reference_table(fnuz)
    codes = torch.tensor([(sgn << 7) | (e << 3) | m for sgn in (0, 1) for e in range(4, 12) for m in range(8)])
    n = 6
    latent = codes[torch.randint(0, codes.numel(), (n, 448), generator=g)].to(torch.uint8)
    nan_codes = [0x80] if fnuz else [0x7F, 0xFF]
    bad = {1: 0, 2: 447, 4: 200}  # row -> dim: the first, last and a middle FP8 group
    for i, (row, dim) in enumerate(bad.items()):
        latent[row, dim] = nan_codes[i % len(nan_codes)]
    scales = torch.randint(100, 135, (n, 7), generator=g).to(torch.uint8)
    rope, _, out, lse = _run_v4_one_row_per_token(g, device, fmt, d_qk, 1, latent, scales, 1e-3)
    hit = torch.tensor([r in bad for r in range(n)])
    assert torch.isnan(out[hit].float()).all() and torch.isnan(lse[hit]).all()
    scale_f = torch.ldexp(torch.ones(scales.shape, dtype=torch.float64), scales.long() - 127)
    V = torch.cat([(table[latent.long()] * scale_f.repeat_interleave(64, dim=1)).to(torch.bfloat16), rope], dim=1)
    assert torch.equal(out[~hit].double(), V[~hit][:, None, :].expand(-1, 16, -1).double())
    assert not torch.isnan(lse[~hit]).any()


# ---------------------------------------------------------------------------------------------
# workspace sizing, DecodeWorkspace, opcheck, torch.compile
# ---------------------------------------------------------------------------------------------

def test_workspace_size_monotonic_and_sufficient(device):
    for S in (0, 1, 2, 7, 64):
        prev = -1
        for T in (1, 2, 5, 33, 100):
            sizes = [ws_size(T, H, S, device) for H in (1, 8, 16, 64, 65, 128)]
            assert sizes == sorted(sizes), (S, T, sizes)
            assert sizes[-1] >= prev
            prev = sizes[-1]
    # a call with fewer tokens / heads under auto fits in the size for more
    g = torch.Generator().manual_seed(12)
    big = mla_ext.DecodeWorkspace(40, 128, device=device)
    assert big.tensor.numel() == big.nbytes == ws_size(40, 128, 0, device)
    # (1, 16, 8320) and (1, 128, 8320): tile rounding (65 splits instead of 64 on an H200)
    for T, H, W in [(1, 8, 2048), (2, 128, 700), (5, 16, 4096), (40, 64, 64), (1, 16, 8320), (1, 128, 8320)]:
        ws = big.check(T, H)
        ws.fill_(0xFF)
        idx, _ = make_indices(g, T, W, 40 * 64, "none", None)
        cache = make_cache(g, "fp8_ds_mla_v4", 512, 40, 64, idx, device)
        q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
        out, lse, _ = poisoned_buffers(T, H, 1, device)
        run_check(q, cache, idx, fmt="fp8_ds_mla_v4", scale=0.05, device=device, num_splits=0,
                  out=out, lse=lse, ws=ws, check=(T * H * W <= 2 * 128 * 700))
    with pytest.raises(ValueError):
        big.check(41, 8)
    assert ws_size(0, 8, 0, device) == 0 and ws_size(8, 8, 1, device) == 0
    # the docstring's formula for explicit counts: 2,052 bytes per (token, head, split) in two
    # sections, 8 bytes per token in a third (the token map), each rounded up to 256 bytes
    up = lambda n: (n + 255) // 256 * 256
    for T, H, S in [(4, 8, 2), (1, 1, 2), (300, 16, 5), (7, 3, 256)]:
        assert ws_size(T, H, S, device) == up(T * H * S * 2048) + up(T * H * S * 4) + up(T * 8), (T, H, S)
    with pytest.raises(RuntimeError, match="num_splits"):
        mla_ext.sparse_mla_decode_workspace_size(4, 4, num_splits=257, device=device)


def test_integer_arguments_and_workspace_errors():
    """Sizes and split counts must be integers (a float is a TypeError naming the argument, not a
    silent truncation), and DecodeWorkspace names its own arguments in its errors."""
    with pytest.raises(TypeError, match="num_tokens to be an integer"):
        mla_ext.sparse_mla_decode_workspace_size(4.5, 8, device="cpu")
    with pytest.raises(TypeError, match="max_num_tokens to be an integer"):
        mla_ext.DecodeWorkspace(4.0, 8, device="cpu")
    with pytest.raises(ValueError, match="max_num_tokens >= 0"):
        mla_ext.DecodeWorkspace(-4, 8, device="cpu")
    with pytest.raises(ValueError, match="num_splits 0 \\(automatic\\) or 1..256, got 300"):
        mla_ext.DecodeWorkspace(4, 8, num_splits=300, device="cpu")
    w = mla_ext.DecodeWorkspace(4, 8, device="cpu")
    with pytest.raises(ValueError, match="got 300"):
        w.check(4, 8, 300)
    with pytest.raises(ValueError, match="^DecodeWorkspace.check: made for .* got num_tokens=-1, num_heads=8"):
        w.check(-1, 8)
    g = torch.Generator().manual_seed(96)
    idx, _ = make_indices(g, 2, 64, 8 * 64, "none", None)
    cache = make_cache(g, "fp8_ds_mla_v4", 512, 8, 64, idx, "cpu")
    q = torch.randn(2, 8, 512, generator=g).to(torch.bfloat16)
    out, lse, ws = poisoned_buffers(2, 8, 2, "cpu")
    with pytest.raises(TypeError, match="num_splits to be an integer"):
        mla_ext.sparse_mla_decode(q, cache, idx, kv_format="fp8_ds_mla_v4", softmax_scale=0.05, output=out,
                                  workspace=ws, lse=lse, num_splits=2.5)
    assert torch.isnan(out.float()).all() and torch.isnan(lse).all()


def test_reference_reads_the_byte_dtypes_the_op_accepts():
    """An FP8 cache held as int8 or as the format's float8 type reads the same in the reference
    and the format helpers as its uint8 view (the op accepts all three)."""
    g = torch.Generator().manual_seed(97)
    idx, _ = make_indices(g, 2, 64, 8 * 64, "none", None)
    cache = make_cache(g, "fp8_ds_mla_v4", 512, 8, 64, idx, "cpu")
    q = torch.randn(2, 4, 512, generator=g).to(torch.bfloat16)
    want = reference.sparse_mla_decode(q, cache, idx, kv_format="fp8_ds_mla_v4", softmax_scale=0.05)
    for dt in (torch.int8, torch.float8_e4m3fn):
        got = reference.sparse_mla_decode(q, cache.view(dt), idx, kv_format="fp8_ds_mla_v4", softmax_scale=0.05)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ValueError, match="float8_e4m3fnuz"):  # the other flavour's type is a mix-up
        reference.sparse_mla_decode(q, cache.view(torch.float8_e4m3fn), idx, kv_format="fp8_ds_mla_v4_fnuz",
                                    softmax_scale=0.05)


def test_workspace_size_extremes_and_default_device():
    """Absurd sizes give an error (not a wrapped-around 0, not a hang); a huge head count under
    the automatic split setting returns at once; DecodeWorkspace(device=None) takes the same
    default device as sparse_mla_decode_workspace_size."""
    with pytest.raises(RuntimeError, match="num_tokens x num_heads <= 2\\^43"):
        mla_ext.sparse_mla_decode_workspace_size(2**40, 2**20, num_splits=256, device="cpu")
    t0 = time.perf_counter()
    auto = mla_ext.sparse_mla_decode_workspace_size(1, 2**40, num_splits=0, device="cpu")
    assert time.perf_counter() - t0 < 5.0
    assert auto == mla_ext.sparse_mla_decode_workspace_size(1, 2**40 - 63, num_splits=0, device="cpu")
    w = mla_ext.DecodeWorkspace(4, 8, device=None)
    want = torch.device("cuda", torch.cuda.current_device()) if HAS_GPU else torch.device("cpu")
    assert w.device == want and w.tensor.device == want
    assert w.nbytes == mla_ext.sparse_mla_decode_workspace_size(4, 8, device=None)


@pytest.mark.parametrize("device,exc,msg", [
    (True, TypeError, "expected device to be a torch.device, a string or a CUDA device index, got bool"),
    (1.0, TypeError, "expected device to be a torch.device, a string or a CUDA device index, got float"),
    (-1, ValueError, "expected a CUDA device index in 0..127, got -1"),
    (128, ValueError, "expected a CUDA device index in 0..127, got 128"),
    (256, ValueError, "expected a CUDA device index in 0..127, got 256"),
    (2**70, ValueError, f"expected a CUDA device index in 0..127, got {2**70}"),
    ("cuda:300", ValueError, "expected a CUDA device index in 0..127, got 'cuda:300'"),
    ("xyz", ValueError, "expected device to be 'cpu', 'cuda' or 'cuda:<index>', got 'xyz'"),
    ("meta", ValueError, "expected a CPU or CUDA device, got meta")])
def test_workspace_device_argument_refused(device, exc, msg):
    """Both workspace helpers take the device the same way and name it when it is wrong: a bool
    is not a CUDA index (True was cuda:1), a negative index is not the CPU, and an index past
    torch's 8-bit device index is refused instead of wrapping to another device (256 -> cuda:0,
    'cuda:300' -> cuda:44) or failing to unpack."""
    with pytest.raises(exc, match=re.escape(f"sparse_mla_decode_workspace_size: {msg}")):
        mla_ext.sparse_mla_decode_workspace_size(4, 16, device=device)
    with pytest.raises(exc, match=re.escape(f"DecodeWorkspace: {msg}")):
        mla_ext.DecodeWorkspace(4, 16, device=device)


def test_workspace_device_cpu_string_with_index():
    """A CPU device string with an index is the CPU, as torch.device takes it (the CUDA index
    range check applies to CUDA devices only)."""
    want = mla_ext.sparse_mla_decode_workspace_size(4, 16, device="cpu")
    assert mla_ext.sparse_mla_decode_workspace_size(4, 16, device="cpu:300") == want
    assert mla_ext.DecodeWorkspace(4, 16, device="cpu:0").device == torch.device("cpu")


def test_workspace_size_limit_named_by_the_constructor():
    """DecodeWorkspace refuses sizes past the query's limit in its own argument names."""
    with pytest.raises(RuntimeError, match=re.escape("DecodeWorkspace: expected max_num_tokens x num_heads <= "
                                                     f"2^43, got {2**44} x 1")):
        mla_ext.DecodeWorkspace(2**44, 1, device="cpu")
    with pytest.raises(RuntimeError, match=re.escape("sparse_mla_decode_workspace_size: expected num_tokens x "
                                                     f"num_heads <= 2^43, got {2**44} x 1")):
        mla_ext.sparse_mla_decode_workspace_size(2**44, 1, device="cpu")


@pytest.mark.skipif(HAS_GPU, reason="the CPU-only case: torch sees no CUDA device")
@pytest.mark.parametrize("device", [0, "cuda:0", torch.device("cuda", 1), "cuda"])
def test_workspace_cuda_device_without_cuda(device):
    """A CUDA device where torch has none, by index, indexed string or device, is refused in the
    helper's own words (it used to reach the op as an internal device_index), before anything is
    allocated."""
    name = f"cuda:{device}" if isinstance(device, int) else str(torch.device(device))
    want = re.escape(f"expected device 'cpu' or an available CUDA device, got '{name}' but torch "
                     f"{torch.__version__} sees no CUDA device")
    with pytest.raises(RuntimeError, match=f"^sparse_mla_decode_workspace_size: {want}$"):
        mla_ext.sparse_mla_decode_workspace_size(4, 16, device=device)
    with pytest.raises(RuntimeError, match=f"^DecodeWorkspace: {want}$"):
        mla_ext.DecodeWorkspace(4, 16, device=device)


def _opcheck_args(device, S):
    g = torch.Generator().manual_seed(13)
    T, H, W = 3, 8, 40
    idx, lengths = make_indices(g, T, W, 4 * 64, "scattered", "random")
    cache = make_cache(g, "fp8_ds_mla_v4", 512, 4, 64, idx, device)
    e_idx, e_len = make_indices(g, T, 16, 8 * 2, "none", "random")
    e_cache = make_cache(g, "fp8_ds_mla_v4", 512, 8, 2, e_idx, device)
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16).to(device)
    out = torch.zeros(T, H, 512, dtype=torch.bfloat16, device=device)
    lse = torch.zeros(T, H, device=device)
    ws = torch.zeros(ws_size(T, H, S, device), dtype=torch.uint8, device=device)
    return (q, cache, idx.to(device), "fp8_ds_mla_v4", 0.05, out, ws, lengths.to(device), e_cache,
            e_idx.to(device), e_len.to(device), torch.randn(H, generator=g).to(device), lse, S)


def test_eager_call_reaches_modes_as_the_overload(device):
    """The wrapper calls the overload's C++ callable in eager mode (host time); a torch function
    mode still sees the OpOverload itself."""
    a = _opcheck_args(device, 3)
    seen = ops_seen_by_function_mode(lambda: mla_ext.sparse_mla_decode(
        a[0], a[1], a[2], kv_format=a[3], softmax_scale=a[4], output=a[5], workspace=a[6], lengths=a[7],
        extra_kv_cache=a[8], extra_indices=a[9], extra_lengths=a[10], attn_sink=a[11], lse=a[12], num_splits=a[13]))
    assert torch.ops.mla_ext.sparse_mla_decode.default in seen


@pytest.mark.parametrize("S", [1, 3])
def test_opcheck(device, S):
    torch.library.opcheck(torch.ops.mla_ext.sparse_mla_decode.default, _opcheck_args(device, S))


@pytest.mark.parametrize("ws_mode", ["tensor", "check"])
def test_torch_compile_fullgraph(device, ws_mode):
    """A fullgraph-compiled step calling the op computes the reference result. ws_mode "check":
    the workspace is ``ws.check(T, H)`` of a DecodeWorkspace inside the compiled step (the check,
    a host-side size query, is skipped while compiling); outside compilation the same check still
    refuses a call too large for the workspace."""
    args = _opcheck_args(device, 2)
    (q, cache, idx, fmt, scale, out, ws, lengths, e_cache, e_idx, e_len, sink, lse, S) = args
    dws = mla_ext.DecodeWorkspace(q.shape[0], q.shape[1], num_splits=S, device=device)

    @torch.compile(fullgraph=True, backend="inductor" if device == "cpu" or HAS_GPU else "eager")
    def step(q, out, lse):
        workspace = ws if ws_mode == "tensor" else dws.check(q.shape[0], q.shape[1])
        mla_ext.sparse_mla_decode(q * 1, cache, idx, kv_format=fmt, softmax_scale=scale, output=out,
                                  workspace=workspace, lengths=lengths, extra_kv_cache=e_cache,
                                  extra_indices=e_idx, extra_lengths=e_len, attn_sink=sink, lse=lse, num_splits=S)
        return out.float().sum()

    poison_(out), poison_(lse)
    step(q, out, lse)
    ref_o, ref_l = reference.sparse_mla_decode(q.cpu(), _cpu_v4(cache), idx.cpu(), kv_format=fmt, softmax_scale=scale,
                                               lengths=lengths.cpu(), extra_kv_cache=_cpu_v4(e_cache),
                                               extra_indices=e_idx.cpu(), extra_lengths=e_len.cpu(),
                                               attn_sink=sink.cpu())
    assert_close_rel(out, ref_o, torch.bfloat16)
    check_lse(lse, ref_l)
    with pytest.raises(ValueError, match="DecodeWorkspace.check: made for"):
        dws.check(q.shape[0] + 1, q.shape[1])


# ---------------------------------------------------------------------------------------------
# errors: raised before anything is written
# ---------------------------------------------------------------------------------------------

def _valid(device):
    g = torch.Generator().manual_seed(14)
    T, H, W = 4, 8, 16
    idx, lengths = make_indices(g, T, W, 4 * 64, "none", "random")
    cache = make_cache(g, "fp8_ds_mla_v4", 512, 4, 64, idx, device)
    e_idx, e_len = make_indices(g, T, 8, 4 * 64, "none", "random")
    e_cache = make_cache(g, "fp8_ds_mla_v4", 512, 4, 64, e_idx, device)
    out, lse, ws = poisoned_buffers(T, H, 2, device)
    return dict(q=torch.randn(T, H, 512, generator=g).to(torch.bfloat16).to(device), kv_cache=cache,
                indices=idx.to(device), kv_format="fp8_ds_mla_v4", softmax_scale=0.05, output=out, workspace=ws,
                lengths=lengths.to(device), extra_kv_cache=e_cache, extra_indices=e_idx.to(device),
                extra_lengths=e_len.to(device), attn_sink=torch.randn(H, generator=g).to(device), lse=lse,
                num_splits=2)


def _bf16_cache(a, d):
    return torch.randn(4, 64, d, device=a["q"].device).to(torch.bfloat16)


def _overlapping(t, strides):
    """A view of t's shape with the given strides over a fresh NaN buffer just large enough."""
    n = 1 + sum((sz - 1) * st for sz, st in zip(t.shape, strides))
    return torch.full((n,), float("nan"), dtype=t.dtype, device=t.device).as_strided(t.shape, strides)


ERROR_CASES = {
    "q dtype": (lambda a: a.update(q=a["q"].float()), "expected q to be bfloat16"),
    "q not 3-D": (lambda a: a.update(q=a["q"].flatten(1)), "expected q of shape"),
    "q d_qk": (lambda a: a.update(q=a["q"][..., :256]), "d_qk"),
    "q d_qk vs format": (lambda a: a.update(q=torch.zeros(4, 8, 576, dtype=torch.bfloat16, device=a["q"].device)),
                         "d_qk to be 512"),
    "q last dim strided": (lambda a: a.update(q=torch.zeros(4, 8, 1024, dtype=torch.bfloat16,
                                                            device=a["q"].device)[..., ::2]), "q to be contiguous"),
    "kv_format unknown": (lambda a: a.update(kv_format="fp8"), "kv_format"),
    "kv_cache dtype": (lambda a: a.update(kv_cache=a["kv_cache"].float()), "kv_cache to be uint8"),
    "lengths sparse": (lambda a: a.update(lengths=a["lengths"].to_sparse()),
                       "expected lengths to be a dense \\(strided\\) tensor, got layout torch.sparse_coo"),
    "kv_cache fnuz view as fn": (lambda a: a.update(kv_cache=a["kv_cache"].view(torch.float8_e4m3fnuz)),
                                 "float8_e4m3fn viewing"),
    "kv_cache fn view as fnuz": (lambda a: a.update(kv_format="fp8_ds_mla_v4_fnuz",
                                                    kv_cache=a["kv_cache"].view(torch.float8_e4m3fn)),
                                 "float8_e4m3fnuz viewing"),
    "fnuz q d_qk": (lambda a: a.update(kv_format="fp8_ds_mla_fnuz"), "d_qk to be 576 for kv_format \"fp8_ds_mla_fnuz"),
    "kv_cache row": (lambda a: a.update(kv_cache=torch.zeros(4, 64, 656, dtype=torch.uint8, device=a["q"].device)),
                     "kv_cache rows of 584"),
    "kv_cache dims": (lambda a: a.update(kv_cache=a["kv_cache"].flatten(0, 1)), "kv_cache to be"),
    "kv_cache 4-D head 2": (lambda a: a.update(kv_cache=torch.zeros(4, 64, 2, 584, dtype=torch.uint8,
                                                                    device=a["q"].device)), "kv_cache to be"),
    "v4 page stride": (lambda a: a.update(kv_cache=torch.zeros(4 * 64 * 584, dtype=torch.uint8, device=a["q"].device)
                                          .as_strided((4, 64, 584), (64 * 576, 584, 1))), "page stride"),
    "bf16 cache width": (lambda a: a.update(kv_format="bf16", kv_cache=_bf16_cache(a, 576),
                                            extra_kv_cache=_bf16_cache(a, 512)), "kv_cache rows of d_qk"),
    "bf16 cache dtype": (lambda a: a.update(kv_format="bf16", kv_cache=_bf16_cache(a, 512).half(),
                                            extra_kv_cache=_bf16_cache(a, 512)), "kv_cache to be bfloat16"),
    "indices dtype": (lambda a: a.update(indices=a["indices"].long()), "indices to be int32, got int64"),
    "indices uint32": (lambda a: a.update(indices=a["indices"].to(torch.uint32)), "indices to be int32, got uint32"),
    "indices shape": (lambda a: a.update(indices=a["indices"][:2]), "indices of shape"),
    "output expanded": (lambda a: a.update(output=a["output"][:1].expand(a["output"].shape)),
                        "output to hold each element once"),
    "lse expanded": (lambda a: a.update(lse=a["lse"][:, :1].expand(a["lse"].shape)), "lse to hold each element once"),
    # heads 256 elements apart with head_size 512: each head's second half is the next head's first
    "output heads overlap": (lambda a: a.update(output=_overlapping(a["output"], (a["output"].shape[1] * 256, 256, 1))),
                             r"output to hold each element once, got sizes \[4, 8, 512\] with strides \[2048, 256, 1\], whose elements share"),
    "output tokens overlap": (lambda a: a.update(output=_overlapping(a["output"], (512, 512, 1))),
                              "output to hold each element once"),
    "lse overlap": (lambda a: a.update(lse=_overlapping(a["lse"], (1, 1))), "lse to hold each element once"),
    "indices stride": (lambda a: a.update(indices=a["indices"].repeat(1, 2)[:, ::2]), "indices to be contiguous"),
    "lengths dtype": (lambda a: a.update(lengths=a["lengths"].long()), "lengths to be int32"),
    "lengths shape": (lambda a: a.update(lengths=a["lengths"][:3]), "lengths of shape"),
    "extra cache alone": (lambda a: a.update(extra_indices=None, extra_lengths=None), "extra_kv_cache and extra_indices"),
    "extra indices alone": (lambda a: a.update(extra_kv_cache=None, extra_lengths=None), "extra_kv_cache and extra_indices"),
    "extra lengths alone": (lambda a: a.update(extra_kv_cache=None, extra_indices=None), "extra_lengths"),
    "extra cache format": (lambda a: a.update(extra_kv_cache=torch.zeros(4, 64, 656, dtype=torch.uint8,
                                                                         device=a["q"].device)), "extra_kv_cache rows"),
    "extra indices shape": (lambda a: a.update(extra_indices=a["extra_indices"][:1]), "extra_indices of shape"),
    "extra lengths dtype": (lambda a: a.update(extra_lengths=a["extra_lengths"].float()), "extra_lengths to be int32"),
    "sink dtype": (lambda a: a.update(attn_sink=a["attn_sink"].double()), "attn_sink to be float32"),
    "sink shape": (lambda a: a.update(attn_sink=a["attn_sink"][:3]), "attn_sink of shape"),
    "output dtype": (lambda a: a.update(output=poison_(torch.empty(4, 8, 512, device=a["q"].device))), "output to be bfloat16"),
    "output shape": (lambda a: a.update(output=poison_(torch.empty(4, 8, 448, dtype=torch.bfloat16,
                                                                   device=a["q"].device))), "output of shape"),
    "output last dim strided": (lambda a: a.update(output=poison_(torch.empty(4, 8, 1024, dtype=torch.bfloat16,
                                                                              device=a["q"].device))[..., ::2]),
                                "output to be contiguous"),
    "lse dtype": (lambda a: a.update(lse=poison_(torch.empty(4, 8, dtype=torch.float64, device=a["q"].device))),
                  "lse to be float32"),
    "lse shape": (lambda a: a.update(lse=poison_(torch.empty(8, 4, device=a["q"].device))), "lse of shape"),
    "workspace dtype": (lambda a: a.update(workspace=a["workspace"].view(torch.int8)), "workspace to be a 1-D uint8"),
    "workspace 2-D": (lambda a: a.update(workspace=a["workspace"].view(1, -1)), "workspace to be a 1-D uint8"),
    "workspace strided": (lambda a: a.update(workspace=torch.full((2 * a["workspace"].numel(),), 0xFF, dtype=torch.uint8,
                                                                  device=a["q"].device)[::2]), "workspace to be contiguous"),
    "workspace small": (lambda a: a.update(workspace=a["workspace"][:-1]), "sparse_mla_decode_workspace_size"),
    "workspace small auto": (lambda a: a.update(workspace=a["workspace"][:0], num_splits=16), "bytes"),
    "num_splits 257": (lambda a: a.update(num_splits=257), "num_splits"),
    "num_splits -1": (lambda a: a.update(num_splits=-1), "num_splits"),
    "softmax_scale nan": (lambda a: a.update(softmax_scale=float("nan")), "softmax_scale"),
    "softmax_scale inf": (lambda a: a.update(softmax_scale=INF), "softmax_scale"),
}


def _arena(a, first, second):
    """first and second carved from one uint8 arena, second starting 16 bytes before first ends."""
    n1 = first.numel() * first.element_size()
    n2 = second.numel() * second.element_size()
    arena = torch.full((n1 + n2,), 0xFF, dtype=torch.uint8, device=a["q"].device)
    one = arena[:n1].view(first.dtype).view(first.shape)
    two = arena[n1 - 16:n1 - 16 + n2].view(second.dtype).view(second.shape)
    one.copy_(first)
    two.copy_(second)
    return one, two


def _misaligned_workspace(a, num_splits):
    """The workspace one byte into a fresh 0xFF buffer; refused whatever the split count (one
    split reads none of it), so a workspace that would fail on the GPU fails on the CPU too."""
    n = a["workspace"].numel()
    a.update(workspace=torch.full((n + 16,), 0xFF, dtype=torch.uint8, device=a["q"].device)[1:n + 1],
             num_splits=num_splits)


def _ws_over_indices(a):
    ws, idx = _arena(a, a["workspace"], a["indices"])
    a.update(workspace=ws, indices=idx)


def _output_over_workspace(a):
    ws, out = _arena(a, a["workspace"], a["output"])
    a.update(workspace=ws, output=out)


def _lse_inside_output(a):
    T, H, _ = a["output"].shape
    buf = torch.full((T, H, 1024), float("nan"), dtype=torch.bfloat16, device=a["q"].device)
    a.update(output=buf[..., :512], lse=buf.view(torch.float32)[..., 8])


ERROR_CASES.update({
    "output is q": (lambda a: a.update(output=a["q"]), "output not to share memory with q"),
    "lse over sink": (lambda a: a.update(attn_sink=a["lse"][0]), "lse not to share memory with attn_sink"),
    "workspace over indices": (_ws_over_indices, "workspace not to share memory with indices"),
    "output over workspace": (_output_over_workspace, "output not to share memory with workspace"),
    "lse inside output rows": (_lse_inside_output, "output not to share memory with lse"),
    "workspace misaligned": (lambda a: _misaligned_workspace(a, 2), "workspace's data pointer to be 16-byte aligned, "
                             "got address offset 1"),
    "workspace misaligned one split": (lambda a: _misaligned_workspace(a, 1), "workspace's data pointer to be "
                                       "16-byte aligned"),
})
if HAS_GPU:
    ERROR_CASES["devices differ"] = (lambda a: a.update(attn_sink=a["attn_sink"].cpu() if a["q"].is_cuda
                                                        else a["attn_sink"].cuda()), "same device")


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_before_write(device, case):
    args = _valid(device)
    mutate, needle = ERROR_CASES[case]
    mutate(args)
    out, lse, ws = args["output"], args["lse"], args["workspace"]
    before = (out.clone(), lse.clone(), ws.clone())
    with pytest.raises(RuntimeError, match=needle):
        mla_ext.sparse_mla_decode(args.pop("q"), args.pop("kv_cache"), args.pop("indices"), **args)
    assert torch.equal(out.isnan(), before[0].isnan()) and torch.equal(lse.isnan(), before[1].isnan())
    assert torch.equal(ws, before[2])


@pytest.mark.parametrize("name", ["q", "kv_cache", "indices", "output", "workspace", "lengths", "lse"])
def test_non_tensor_argument_named(device, name):
    """A required tensor passed as None, or any tensor argument passed as a list: a TypeError that
    names the argument (torch's own message for these does not), nothing written."""
    args = _valid(device)
    out, lse, ws = args["output"], args["lse"], args["workspace"]
    before = (out.clone(), lse.clone(), ws.clone())
    args[name] = None if name in ("q", "kv_cache", "indices", "output", "workspace") else [1, 2]
    with pytest.raises(TypeError, match=f"sparse_mla_decode: expected {name} to be a torch.Tensor"):
        mla_ext.sparse_mla_decode(args.pop("q"), args.pop("kv_cache"), args.pop("indices"), **args)
    assert torch.equal(out.isnan(), before[0].isnan()) and torch.equal(lse.isnan(), before[1].isnan())
    assert torch.equal(ws, before[2])


@pytest.mark.parametrize("name", ["q", "kv_cache", "indices", "output", "workspace"])
def test_op_none_tensor_refused(device, name):
    """None for a required tensor straight into torch.ops (no Python wrapper): torch passes it as an
    undefined tensor, which the op refuses by name before touching anything (torch 2.11 crashed)."""
    args = _valid(device)
    out, lse, ws = args["output"], args["lse"], args["workspace"]
    before = (out.clone(), lse.clone(), ws.clone())
    args[name] = None
    with pytest.raises(RuntimeError, match=f"sparse_mla_decode: expected {name} to be a tensor, got None"):
        torch.ops.mla_ext.sparse_mla_decode(*args.values())
    assert torch.equal(out.isnan(), before[0].isnan()) and torch.equal(lse.isnan(), before[1].isnan())
    assert torch.equal(ws, before[2])


@pytest.mark.parametrize("which", ["kv_cache", "extra_kv_cache"])
@pytest.mark.parametrize("view", ["expanded", "strided_rows"])
def test_v4_cache_rows_must_be_packed(device, which, view):
    """A V4 page is one block of page_size * 584 bytes (data rows, then scales): the kernels read
    it at fixed pitches, never by stride(1), so a view whose rows are not packed (an expanded
    single row; rows 576 bytes apart) would be read past its own bytes. Refused by name."""
    args = _valid(device)
    out, lse, ws = args["output"], args["lse"], args["workspace"]
    before = (out.clone(), lse.clone(), ws.clone())
    c = args[which]
    P, ps = c.shape[0], c.shape[1]
    base = torch.zeros(P, 1, 584, dtype=torch.uint8, device=device)
    args[which] = (base.expand(P, ps, 584) if view == "expanded"
                   else torch.zeros(P * ps * 584, dtype=torch.uint8, device=device).as_strided(
                       (P, ps, 584), (ps * 584, 576, 1)))
    with pytest.raises(RuntimeError, match=f"expected {which} token stride \\(stride\\(1\\)\\) == 584"):
        mla_ext.sparse_mla_decode(args.pop("q"), args.pop("kv_cache"), args.pop("indices"), **args)
    assert torch.equal(out.isnan(), before[0].isnan()) and torch.equal(lse.isnan(), before[1].isnan())
    assert torch.equal(ws, before[2])


@pytest.mark.parametrize("scale", [1e39, -1e39, float("inf"), float("nan"), 10**400, -(10**400)])
def test_softmax_scale_beyond_float32_refused(device, scale):
    """The kernels use softmax_scale as a float32: 1e39 is a finite double but inf as a float (every
    output would be NaN), so it is refused like a non-finite one, nothing written; so is an integer
    beyond the double range (float() of it raises OverflowError)."""
    args = _valid(device)
    out, lse = args["output"], args["lse"]
    args["softmax_scale"] = scale
    with pytest.raises(RuntimeError, match="expected softmax_scale to be finite as a float32"):
        mla_ext.sparse_mla_decode(args.pop("q"), args.pop("kv_cache"), args.pop("indices"), **args)
    assert out.isnan().all() and lse.isnan().all()


@pytest.mark.parametrize("fmt", [None, b"fp8_ds_mla_v4", 3])
def test_kv_format_not_a_string_refused(device, fmt):
    """kv_format must be a str: None, bytes (torch's schema took b"bf16" as "bf16") or an int is a
    TypeError naming it, nothing written."""
    args = _valid(device)
    out, lse, ws = args["output"], args["lse"], args["workspace"]
    ws0 = ws.clone()
    args["kv_format"] = fmt
    with pytest.raises(TypeError, match=f"expected kv_format to be a string .*, got {type(fmt).__name__}"):
        mla_ext.sparse_mla_decode(args.pop("q"), args.pop("kv_cache"), args.pop("indices"), **args)
    assert out.isnan().all() and lse.isnan().all() and torch.equal(ws, ws0)


@pytest.mark.parametrize("scale", ["0.05", b"0.05", None, True, "tensor"])
def test_softmax_scale_not_a_real_number_refused(device, scale):
    """softmax_scale must be a real number: a string (float() would parse it), bytes, None, a bool
    or a tensor is a TypeError naming it, nothing written; an int and a numpy float work."""
    args = _valid(device)
    out, lse, ws = args["output"], args["lse"], args["workspace"]
    ws0 = ws.clone()
    args["softmax_scale"] = torch.tensor(0.05) if scale == "tensor" else scale
    q, cache, idx = args.pop("q"), args.pop("kv_cache"), args.pop("indices")
    with pytest.raises(TypeError, match="expected softmax_scale to be a real number"):
        mla_ext.sparse_mla_decode(q, cache, idx, **args)
    assert out.isnan().all() and lse.isnan().all() and torch.equal(ws, ws0)
    np = pytest.importorskip("numpy")
    args["softmax_scale"] = np.float32(0.05)
    mla_ext.sparse_mla_decode(q, cache, idx, **args)
    want = out.clone()
    args["softmax_scale"] = 1
    mla_ext.sparse_mla_decode(q, cache, idx, **args)
    assert not torch.equal(out, want) and not out.isnan().any()


def test_decode_compiled_refuses_outputs_that_require_grad():
    """Inside torch.compile (aot_eager, fullgraph) a written tensor that requires grad is refused
    as in eager, before anything is written (the check was skipped while compiling)."""
    args = _valid("cpu")
    q, cache, idx = args.pop("q"), args.pop("kv_cache"), args.pop("indices")
    args["lse"].requires_grad_(True)
    ws0 = args["workspace"].clone()
    torch._dynamo.reset()
    f = torch.compile(lambda: mla_ext.sparse_mla_decode(q, cache, idx, **args), backend="aot_eager", fullgraph=True)
    with pytest.raises(RuntimeError, match="lse requires grad; the op has no backward"):
        f()
    assert args["output"].isnan().all() and args["lse"].isnan().all() and torch.equal(args["workspace"], ws0)


@pytest.mark.parametrize("name", ["output", "lse"])
def test_decode_refuses_outputs_that_require_grad(device, name):
    """A leaf requiring grad (grad mode on) is refused by name with nothing written, as by torch's
    in-place ops, and so is a non-leaf requiring grad (the op has no backward: it would keep its
    old grad_fn and a later backward would give wrong gradients); under no_grad the same tensor
    is written. An inference tensor is written outside inference_mode too (documented), with the
    same values."""
    args = _valid(device)
    q, cache, idx = args.pop("q"), args.pop("kv_cache"), args.pop("indices")
    ws, ws0 = args["workspace"], args["workspace"].clone()
    buf = args[name]
    base = torch.ones_like(buf, requires_grad=True)
    args[name] = base * float("nan")  # NaN, requires grad, has a grad_fn
    with pytest.raises(RuntimeError, match=f"{name} requires grad"):
        mla_ext.sparse_mla_decode(q, cache, idx, **args)
    assert args[name].isnan().all() and torch.equal(ws, ws0)
    args[name] = buf
    t = args[name].requires_grad_(True)
    with pytest.raises(RuntimeError, match=f"{name} requires grad"):
        mla_ext.sparse_mla_decode(q, cache, idx, **args)
    assert args["output"].isnan().all() and args["lse"].isnan().all() and torch.equal(ws, ws0)
    with torch.no_grad():
        mla_ext.sparse_mla_decode(q, cache, idx, **args)
    assert not args["output"].isnan().any() and not args["lse"].isnan().any()
    want = t.detach().clone()
    with torch.inference_mode():
        inf = torch.full_like(want, float("nan"))
    args[name] = inf
    other = "lse" if name == "output" else "output"
    args[other] = torch.full_like(args[other].detach(), float("nan"))
    mla_ext.sparse_mla_decode(q, cache, idx, **args)
    assert torch.equal(inf, want)


def test_decode_bumps_autograd_versions(device):
    """With grad mode on the written output, lse and workspace get new version counters (as with
    torch's in-place ops); under inference_mode none are recorded."""
    args = _valid(device)
    out, lse, ws = args["output"], args["lse"], args["workspace"]
    v = (out._version, lse._version, ws._version)
    q, cache, idx = args.pop("q"), args.pop("kv_cache"), args.pop("indices")
    mla_ext.sparse_mla_decode(q, cache, idx, **args)
    assert out._version > v[0] and lse._version > v[1] and ws._version > v[2]
    assert not out.isnan().any()
    v = (out._version, lse._version, ws._version)
    with torch.inference_mode():
        mla_ext.sparse_mla_decode(q, cache, idx, **args)
    assert (out._version, lse._version, ws._version) == v


# (argument changes, words of the refusal): each made to a valid call; the fake (meta) kernel
# must refuse it with the real op's words, so that torch.compile tracing fails where the op would.
_FAKE_REFUSALS = [
    (dict(q=lambda a: a["q"].float()), "expected q to be bfloat16"),
    (dict(kv_format=lambda a: "nonsense"), "expected kv_format to be one of"),
    (dict(kv_format=lambda a: "fp8_ds_mla"), "expected q's d_qk to be 576"),
    (dict(kv_cache=lambda a: a["kv_cache"][..., :576]), "expected kv_cache rows of 584 bytes"),
    (dict(kv_cache=lambda a: a["kv_cache"][:, :0]), "expected kv_cache to have page_size >= 1"),
    # the other FP8 flavour's type: the refusal names the format that takes it
    (dict(kv_cache=lambda a: a["kv_cache"].view(torch.float8_e4m3fnuz)),
     'got float8_e4m3fnuz (float8_e4m3fnuz bytes are kv_format "fp8_ds_mla_v4_fnuz")'),
    (dict(kv_format=lambda a: "fp8_ds_mla_v4_fnuz", kv_cache=lambda a: a["kv_cache"].view(torch.float8_e4m3fn)),
     'got float8_e4m3fn (float8_e4m3fn bytes are kv_format "fp8_ds_mla_v4")'),
    (dict(indices=lambda a: a["indices"].long()), "expected indices to be int32"),
    (dict(lengths=lambda a: a["lengths"][:2]), "expected lengths of shape [num_tokens]"),
    (dict(extra_indices=lambda a: None, extra_lengths=lambda a: None),
     "expected extra_kv_cache and extra_indices to be given together"),
    (dict(attn_sink=lambda a: a["attn_sink"][:3]), "expected attn_sink of shape [num_heads]"),
    (dict(output=lambda a: a["output"][..., :256]), "expected output of shape [num_tokens, num_heads, 512]"),
    (dict(lse=lambda a: a["lse"].double()), "expected lse to be float32"),
    # q sets num_heads: fewer heads in q than in the buffers is blamed on them, naming q's sizes
    (dict(q=lambda a: a["q"][:, :2]), "(num_heads = q.size(1)), got ["),
    (dict(q=lambda a: a["q"][:, :2], attn_sink=lambda a: a["attn_sink"][:2]),
     "(num_tokens, num_heads = q.size(0), q.size(1)), got ["),
    (dict(q=lambda a: a["q"][:, :2], attn_sink=lambda a: a["attn_sink"][:2],
          output=lambda a: a["output"][:, :2]), "(any strides; num_tokens, num_heads = q.size(0), q.size(1))"),
    (dict(workspace=lambda a: a["workspace"].view(torch.int32)), "expected workspace to be a 1-D uint8 tensor"),
    (dict(softmax_scale=lambda a: 1e39), "expected softmax_scale to be finite as a float32"),
    (dict(num_splits=lambda a: 999), "expected num_splits to be 0 (automatic) or 1..256"),
]


def test_fp8_flavour_hint_only_for_fp8_formats():
    """A float8 cache under kv_format "bf16" is simply not bfloat16: neither the op nor its fake
    kernel suggests a format (there is no "bf16_fnuz"), and both say the same words."""
    args = _valid("cpu")
    q, H = args["q"], args["q"].shape[1]
    for dev in ("cpu", "meta"):
        cache = torch.zeros(4, 64, 512, dtype=torch.float8_e4m3fnuz, device=dev)
        out = torch.empty(q.shape[0], H, 512, dtype=torch.bfloat16, device=dev)
        ws = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
        with pytest.raises(RuntimeError, match='expected kv_cache to be bfloat16 for kv_format "bf16", '
                                               'got float8_e4m3fnuz$'):
            torch.ops.mla_ext.sparse_mla_decode(q.to(dev), cache, args["indices"].to(dev), "bf16", 0.05, out, ws,
                                                None, None, None, None, None, None, 1)


@pytest.mark.parametrize("i", range(len(_FAKE_REFUSALS)))
def test_fake_kernel_refuses_like_the_op(i):
    """The same bad call on CPU tensors and on meta tensors (the fake kernel torch.compile traces
    with): both refused, naming the argument the same way; the valid call passes on meta."""
    changes, words = _FAKE_REFUSALS[i]
    assert_fake_refuses_like_op(torch.ops.mla_ext.sparse_mla_decode, _valid("cpu"), changes, words)


@pytest.mark.parametrize("value", [True, 2.0, "2", "tensor", "tensor1"])
def test_num_splits_not_an_integer(device, value):
    """Refused with a TypeError naming num_splits, nothing written; a one-element integer tensor
    too (operator.index would accept it, reading it from the device: a host sync)."""
    args = _valid(device)
    if value in ("tensor", "tensor1"):
        value = torch.tensor(2, device=device) if value == "tensor" else torch.tensor([2], device=device)
    args["num_splits"] = value
    with pytest.raises(TypeError, match="expected num_splits to be an integer"):
        mla_ext.sparse_mla_decode(args.pop("q"), args.pop("kv_cache"), args.pop("indices"), **args)
    assert args["output"].isnan().all()


def test_lse_in_output_row_padding_accepted(device):
    """output rows and lse in one [T, H, 514] bf16 buffer (lse in each row's last 4 bytes): disjoint,
    accepted, and the same results as separate buffers."""
    args = _valid(device)
    T, H, _ = args["output"].shape
    buf = torch.full((T, H, 514), float("nan"), dtype=torch.bfloat16, device=args["q"].device)
    q, cache, idx = args.pop("q"), args.pop("kv_cache"), args.pop("indices")
    mla_ext.sparse_mla_decode(q, cache, idx, **args)
    ref_o, ref_l = args["output"].clone(), args["lse"].clone()
    args.update(output=buf[..., :512], lse=buf.view(torch.float32)[..., 256])
    mla_ext.sparse_mla_decode(q, cache, idx, **args)
    assert torch.equal(buf[..., :512], ref_o) and torch.equal(buf.view(torch.float32)[..., 256], ref_l)


def test_valid_args_pass(device):
    args = _valid(device)
    mla_ext.sparse_mla_decode(args.pop("q"), args.pop("kv_cache"), args.pop("indices"), **args)
    assert not args["output"].isnan().any() and not args["lse"].isnan().any()


# ---------------------------------------------------------------------------------------------
# GPU only
# ---------------------------------------------------------------------------------------------

@requires_gpu
@pytest.mark.parametrize("S", [1, 4])
def test_gpu_pending_runtime_error_left_to_the_caller(S):
    """A runtime error pending before the call (the caller's unchecked failure) is neither reported
    as a launch failure of the split kernel or the reduce nor cleared by them; the call's result is
    the same as without it, and matches the reference. The op runs once first, so this covers a
    warm call; a process's first calls of a kernel (its shared-memory opt-in) are the next test's."""
    lib = loaded_cuda_runtime()
    if lib is None:
        pytest.skip("no CUDA runtime loaded (ROCm build)")
    g = torch.Generator().manual_seed(31 + S)
    fmt, d_qk, T, H, W = "fp8_ds_mla_v4", 512, 3, 16, 300
    idx, lengths = make_indices(g, T, W, 20 * 64, "scattered", "random")
    cache = make_cache(g, fmt, d_qk, 20, 64, idx, "cuda")
    q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
    kw = dict(fmt=fmt, scale=0.07, device="cuda", num_splits=S, lengths=lengths)
    # Everything on the device first: torch's own launches (a fill, a copy) check the last error.
    out, lse, ws = poisoned_buffers(T, H, S, "cuda")
    qd, idxd, lend = q.cuda(), idx.cuda(), lengths.cuda()
    mla_ext.sparse_mla_decode(qd, cache, idxd, output=out, workspace=ws, lse=lse, kv_format=fmt, softmax_scale=0.07,
                              lengths=lend, num_splits=S)  # the process's first call (see above)
    poison_(out), poison_(lse), ws.fill_(0xFF)
    torch.cuda.synchronize()
    err = leave_runtime_error_pending(lib)
    try:
        mla_ext.sparse_mla_decode(qd, cache, idxd, output=out, workspace=ws, lse=lse, kv_format=fmt,
                                  softmax_scale=0.07, lengths=lend, num_splits=S)
        still = lib.cudaPeekAtLastError()
    finally:
        lib.cudaGetLastError()  # the caller's to clear
    assert still == err, f"the op changed the pending error: {lib.cudaGetErrorName(still)}"
    out2, lse2, _ = run_check(q, cache, idx, **kw)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


def _fresh_process_last_line(script, env=None):
    """Run `script` in a fresh Python process (environment `env`, None: this one's) with this
    mla_ext and the tests directory as its argv[1:3]; assert it exits 0 and return the last line
    it printed."""
    here = os.path.dirname(os.path.abspath(__file__))
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(mla_ext.__file__)))
    r = subprocess.run([sys.executable, "-c", script, package_root, here], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


_FIRST_CALLS_SCRIPT = r"""
import sys
sys.path[:0] = sys.argv[1:3]  # the parent's mla_ext, then the tests directory
import torch
import mla_ext
from conftest import leave_runtime_error_pending, loaded_cuda_runtime
from test_sparse_mla_decode import make_cache, make_indices, poisoned_buffers

g = torch.Generator().manual_seed(3)
a, a_lse = torch.randn(2, 4, 64, device="cuda"), torch.randn(2, 4, device="cuda")
merged = torch.empty_like(a)
results = []
# Two different split kernels (16-head tiles of d_qk 512 and 576, 96 and 115 KB of shared memory:
# each raises its limit on its first call), the second with the reduce; then V3.2 at 128 heads
# (on Hopper with an sm_90a build: the 2-block cluster kernel, whose first call also asks
# whether a cluster fits).
for fmt, d_qk, S, H in (("fp8_ds_mla_v4", 512, 1, 16), ("fp8_ds_mla", 576, 4, 16), ("fp8_ds_mla", 576, 2, 128)):
    idx, lengths = make_indices(g, 3, 300, 20 * 64, "scattered", "random")
    cache = make_cache(g, fmt, d_qk, 20, 64, idx, "cuda")
    q = torch.randn(3, H, d_qk, generator=g).to(torch.bfloat16).cuda()
    idx, lengths = idx.cuda(), lengths.cuda()
    kw = dict(kv_format=fmt, softmax_scale=0.07, lengths=lengths, num_splits=S)
    out, lse, ws = poisoned_buffers(3, H, S, "cuda")
    torch.cuda.synchronize()
    lib = loaded_cuda_runtime()
    err = leave_runtime_error_pending(lib)
    if S == 1:
        mla_ext.merge_attn_states(merged, None, a, a_lse, a, a_lse)
    mla_ext.sparse_mla_decode(q, cache, idx, output=out, workspace=ws, lse=lse, **kw)
    still = lib.cudaPeekAtLastError()
    lib.cudaGetLastError()
    again, lse2, _ = poisoned_buffers(3, H, S, "cuda")
    mla_ext.sparse_mla_decode(q, cache, idx, output=again, workspace=ws, lse=lse2, **kw)
    results.append(f"S={S}: pending {err} -> {still}, same result {torch.equal(out, again) and torch.equal(lse, lse2)}")
print("; ".join(results))
"""


@requires_gpu
def test_gpu_pending_runtime_error_kept_by_first_calls():
    """In a fresh process, the first merge call and the first calls of three decode split kernels
    (one split of the V4 16-head tile, then four of the V3.2 one with the reduce, then two of V3.2
    at 128 heads, the cluster kernel on Hopper: each kernel raises its shared-memory limit on its
    first call) leave an error the caller left pending as it was. The
    CUDA runtime's cudaFuncSetAttribute clears a pending error even when it succeeds (H200, CUDA
    13.0), so the launcher sets that attribute through the driver (compat.h, set_max_dynamic_smem;
    builds with CUDA 11.3+ headers). The results equal a second call's."""
    if loaded_cuda_runtime() is None:
        pytest.skip("no CUDA runtime loaded (ROCm build)")
    from mla_ext._load import _build_info

    cuda = _build_info().get("cuda_version") or "0.0"
    if tuple(int(x) for x in cuda.split(".")[:2]) < (11, 3):
        pytest.skip(f"built with CUDA {cuda}: the launcher keeps cudaFuncSetAttribute")
    line = _fresh_process_last_line(_FIRST_CALLS_SCRIPT)
    m = re.fullmatch(r"S=1: pending (\d+) -> (\d+), same result (\w+); S=4: pending (\d+) -> (\d+), same result (\w+); "
                     r"S=2: pending (\d+) -> (\d+), same result (\w+)", line)
    assert m, line
    assert m[1] != "0" and m[1] == m[2] and m[4] == m[5] == m[1] and m[7] == m[8] == m[1], line
    assert m[3] == m[6] == m[9] == "True", line


@requires_gpu
def test_gpu_q_fragments_in_registers_bit_identical(tmp_path, monkeypatch):
    """The 16-head V4 kernel keeps each warp's Q.K fragments of Q in registers where the split grid
    is one wave and splits span two or more 64-row tiles (decode_q_regs). In fresh processes with
    and without it (MLA_EXT_QREG=0, read once per process): the same products in the same order, so
    bit-identical outputs and lses, fully written; where the profiler names kernels, the first ran
    the Q-register instance (last template argument) and the second never did."""
    # Two or more 64-row tiles per split in one wave of 16-head blocks on the uniform split map (two
    # tokens with lengths and 3 splits of a C128 row would take the balanced map instead), partial
    # head tiles (8, 12 of 16), automatic and 1-3 splits, fnuz.
    # (kind, heads, batch, context_len, num_splits, seed, kv_format)
    cases = [("v4_c128", 8, 1, (1 << 20, 1 << 20), 0, 15, None),
             ("v4_c128", 12, 1, (1 << 20, 1 << 20), 3, 19, None),
             ("v4_c4", 16, 3, (20000, 60000), 1, 23, None),
             ("v4_c4", 12, 2, (20000, 60000), 2, 19, "fp8_ds_mla_v4_fnuz")]
    # Without the Q register kernel these calls would take Q.K from the gathered registers
    # (decode_raw_qk), whose products run in another order: both children keep the tile's.
    monkeypatch.setenv("MLA_EXT_RAWQK", "0")
    runs = _run_switch_children(tmp_path, "MLA_EXT_QREG", ("1", "0"), None, cases, "decode_split")
    assert runs["1"].keys() == runs["0"].keys()
    for key, (out, lse, _, _, names, _) in runs["1"].items():
        out0, lse0, _, _, names0, _ = runs["0"][key]
        assert not out.isnan().any() and not lse.isnan().any(), key
        assert torch.equal(out, out0) and torch.equal(lse, lse0), key
        if names and names0:  # e.g. "void ...decode_split_mma_kernel<1, 512, (...)2, false, ..., true, false, false>(...)"
            # (template arguments ..., QREG, ANCH, RAW)
            assert not any(re.search(r"decode_split_mma_kernel<.*, true, false, false>\(", n) for n in names0), (key, names0)
            assert any(re.search(r"decode_split_mma_kernel<1, 512, .*, true, false, false>\(", n) for n in names), (key, names)


@requires_gpu
@pytest.mark.parametrize("fmt,d_qk", GEOMS + FNUZ_GEOMS)
@pytest.mark.parametrize("H", [8, 16, 64, 128])
def test_gpu_portable_vs_tensor_core(fmt, d_qk, H):
    g = torch.Generator().manual_seed(20 + H)
    T, W = 7, 700
    idx, lengths = make_indices(g, T, W, 60 * 64, "scattered", "random")
    cache = make_cache(g, fmt, d_qk, 60, 64, idx, "cuda")
    q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
    sink = make_sink(g, H, "finite")
    for portable in (True, False):
        with gpu_path(portable=portable):
            for S in (1, 4):
                run_check(q, cache, idx, fmt=fmt, scale=d_qk ** -0.5, device="cuda", num_splits=S,
                          lengths=lengths, sink=sink)


@requires_gpu
@pytest.mark.parametrize("fmt,d_qk", GEOMS + FNUZ_GEOMS)
@pytest.mark.parametrize("portable", [False, True])
def test_gpu_forced_head_tiles(fmt, d_qk, portable):
    """Every head tile (16, 32, 64 heads per block, and a ragged 24) on both GPU paths, with
    head counts that leave a partial last tile; small calls pick 16- or 32-head tiles on their own
    (decode_launch_head_tile), so this keeps the 32- and 64-head kernels covered at small T."""
    g = torch.Generator().manual_seed(31 + len(fmt) + d_qk)
    T, W = 3, 300
    idx, lengths = make_indices(g, T, W, 20 * 64, "scattered", "random")
    cache = make_cache(g, fmt, d_qk, 20, 64, idx, "cuda")
    for H in (40, 128):
        q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
        sink = make_sink(g, H, "finite")
        for tile in (16, 24, 32, 64):
            with gpu_path(portable=portable, head_tile=tile):
                for S in (1, 5):
                    run_check(q, cache, idx, fmt=fmt, scale=d_qk ** -0.5, device="cuda", num_splits=S,
                              lengths=lengths, sink=sink)


def _wgmma_kernel_expected():
    """Whether this GPU and build run the warpgroup-MMA kernel: compute capability 9.0 and a build
    for the arch-specific sm_90a target (elsewhere its launches run the mma.sync body)."""
    from mla_ext._build_info import BUILD_INFO
    return (torch.cuda.get_device_capability() == (9, 0)
            and "9.0a" in (BUILD_INFO.get("gpu_arch_list") or ""))


# The A16 instance's demangled name (MT 1, BAL either, WG and ASYM set, the rest off).
A16_KERNEL = r"decode_split_mma_kernel<1, (?:512|576), [^>]*, (?:true|false), true, true, false, false, false, false>"


def _split_kernel_names(fn):
    """Names of the decode split kernels `fn` launches, as the profiler reports them (demangled);
    empty when the profiler records no GPU kernels on this machine."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages() if "decode_split" in e.key]


def _switch_on(var, env=None):
    """Whether a switch (MLA_EXT_ASYM, MLA_EXT_CLUSTER: both default on) is on with the
    value `env` (None: this process's environment), as the extension reads it (strtol): unset or
    empty -> yes, 0 or text that is not a number -> no, any other integer -> yes."""
    v = (os.environ.get(var, "") if env is None else env).strip()
    if v == "":
        return True
    try:
        return int(v, 0) != 0
    except ValueError:
        return False


def _asym_on(env=None):
    """Whether the 64-head warpgroup tile of the FP8 caches runs as asymmetric warpgroups under
    MLA_EXT_ASYM = `env` (_switch_on)."""
    return _switch_on("MLA_EXT_ASYM", env)


def _cluster_on(env=None):
    """Whether V3.2's asymmetric 64-head kernel runs as 2-block clusters at 65-128 heads under
    MLA_EXT_CLUSTER = `env` (_switch_on)."""
    return _switch_on("MLA_EXT_CLUSTER", env)


def _asym_expected(fmt):
    """Whether the 64-head warpgroup kernel of `fmt` runs as asymmetric warpgroups (the FP8
    formats, V4 and V3.2 rows; _asym_on)."""
    return fmt.startswith("fp8_ds_mla") and _asym_on()


def _check_64_head_kernel_kind(fn, mma_sync, asym=None):
    """Where this GPU and build run the warpgroup kernel (_wgmma_kernel_expected) and the profiler
    names kernels: the 64-head split kernel `fn` launches is the warpgroup one (fifth template
    argument of decode_split_mma_kernel) exactly when mma_sync is False, and (asym not None) its
    sixth argument, the asymmetric warpgroups, is `asym`."""
    if not _wgmma_kernel_expected():
        return
    names = _split_kernel_names(fn)
    if names:
        # template arguments MT, DQK, F, BAL, WG, ASYM, TWO, QREG, ANCH, RAW; V3.2 rows at 65-128 heads
        # run the asymmetric kernel as 2-block clusters by default (decode_split_cluster_kernel)
        pat = (r"decode_split_mma_kernel<4, [^,]+, [^,]+, (?:true|false), true, (true|false), (?:true|false), "
               r"(?:true|false), false, false>")
        wg = [re.search(pat, n) for n in names if re.search(pat, n)]
        cl = [n for n in names if "decode_split_cluster_kernel" in n]
        assert bool(wg or cl) == (not mma_sync), names
        if wg and asym is not None:
            assert all(m.group(1) == ("true" if asym else "false") for m in wg), names
        if cl and asym is not None:
            assert asym, names


# Every format on both kernels (V3.2's fp32 scales are applied after the products on both).
MMA_KIND_CASES = [(f, d, m) for f, d in (("bf16", 576), ("bf16", 512), ("fp8_ds_mla", 576), ("fp8_ds_mla_fnuz", 576),
                                         ("fp8_ds_mla_v4", 512), ("fp8_ds_mla_v4_fnuz", 512))
                  for m in (False, True)]


@requires_gpu
@pytest.mark.parametrize("fmt,d_qk,mma_sync", MMA_KIND_CASES)
def test_gpu_64_head_tile_mma_kinds(fmt, d_qk, mma_sync):
    """The 64-head tile on both tensor-core kernels (on Hopper with an sm_90a build: warpgroup MMAs
    for every format, or mma.sync when forced; elsewhere mma.sync either way): partial
    head tiles (72, 100 heads), splits ending inside a tile (lengths), invalid rows and a sink.
    Where the warpgroup kernel is expected, the profiler's kernel names show which one ran (the
    last template argument of decode_split_mma_kernel). The balanced map's 64-head kernels run in
    test_gpu_balanced_split_map_head_tiles (default path)."""
    g = torch.Generator().manual_seed(211 + len(fmt) + d_qk)
    T, W = 4, 700
    idx, lengths = make_indices(g, T, W, 30 * 64, "scattered", "random")
    lengths[0] = W
    cache = make_cache(g, fmt, d_qk, 30, 64, idx, "cuda")
    for H in (64, 72, 100):
        q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
        sink = make_sink(g, H, "finite")
        with gpu_path(head_tile=64, mma_sync=mma_sync):
            for S in (0, 1, 3):
                run_check(q, cache, idx, fmt=fmt, scale=d_qk ** -0.5, device="cuda", num_splits=S,
                          lengths=lengths, sink=sink)
            _check_64_head_kernel_kind(lambda: run_check(q, cache, idx, fmt=fmt, scale=d_qk ** -0.5, device="cuda",
                                                         num_splits=1, check=False), mma_sync, _asym_expected(fmt))


@requires_gpu
@pytest.mark.parametrize("fmt,d_qk", FP8_GEOMS)
@pytest.mark.parametrize("align", [16, 4, 2])
def test_gpu_head_tile_output_views(fmt, d_qk, align):
    """The tensor-core kernels' epilogue (for FP8 caches they stage the output tile in shared
    memory and write 16-byte chunks when the output allows them, else bf16 pairs or single
    elements; fp32 partials with splits) on output views whose rows start 16-, 4- or 2-byte
    aligned, in 16-, 32- and 64-head blocks (partial: 20, 40 and 100 heads), one and three splits,
    and for V4 also a long row set with lengths (the balanced map's kernels): the reference
    result, nothing outside the view written, and (where the profiler names kernels) the 64-head
    block ran the warpgroup kernel."""
    g = torch.Generator().manual_seed(431 + align + d_qk + len(fmt))
    T = 3
    widths = (300, 4200) if fmt.startswith("fp8_ds_mla_v4") else (300,)
    off = {16: 8, 4: 2, 2: 1}[align]  # element offset of the view in its buffer
    pitch = 512 + (8 if align == 16 else 6)  # head stride: a multiple of 8 elements only for 16
    for W in widths:
        num_pages = -(-(W + 64) // 64) + 2
        idx, lengths = make_indices(g, T, W, num_pages * 64, "scattered", "random")
        lengths[0] = W
        cache = make_cache(g, fmt, d_qk, num_pages, 64, idx, "cuda")
        cache_ref = _cpu_v4(cache) if fmt.startswith("fp8_ds_mla_v4") else cache.cpu()
        for H, tile in ((100, 64), (20, 16), (40, 32)):
            q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
            sink = make_sink(g, H, "finite")
            scale = d_qk ** -0.5
            ref_o, ref_l = reference.sparse_mla_decode(q, cache_ref, idx, kv_format=fmt, softmax_scale=scale,
                                                       lengths=lengths, attn_sink=sink)

            def call(S, out, lse):
                ws = torch.full((ws_size(T, H, S, "cuda"),), 0xFF, dtype=torch.uint8, device="cuda")
                mla_ext.sparse_mla_decode(q.cuda(), cache, idx.cuda(), kv_format=fmt, softmax_scale=scale,
                                          output=out, workspace=ws, lse=lse, num_splits=S, lengths=lengths.cuda(),
                                          attn_sink=sink.cuda())

            with gpu_path(head_tile=tile):
                for S in (1, 3):
                    buf = poison_(torch.empty(T * H * pitch + 16, dtype=torch.bfloat16, device="cuda"))
                    out = buf[off:off + T * H * pitch].view(T, H, pitch)[..., :512]
                    lse = poison_(torch.empty(T, H, device="cuda"))
                    call(S, out, lse)
                    check_out(out, ref_o, fmt)
                    check_lse(lse, ref_l, kv_format=fmt)
                    mask = torch.ones(buf.shape, dtype=torch.bool, device="cuda")
                    mask[off:off + T * H * pitch].view(T, H, pitch)[..., :512] = False
                    assert buf[mask].isnan().all(), f"W={W} H={H} S={S}: written outside the output view"
                if tile == 64:
                    _check_64_head_kernel_kind(lambda: call(1, out, lse), False, _asym_expected(fmt))


def test_gpu_path_restores_after_a_refused_setting():
    """gpu_path (the tests' switch helper) puts back the settings it made when a later one is
    refused, so one bad value cannot leak a forced mode into the following tests."""
    with pytest.raises(RuntimeError, match="head_tile"):
        with gpu_path(two_token=1, portable=False, head_tile=65):
            pass
    assert torch.ops.mla_ext._set_two_token(0) == 0
    assert torch.ops.mla_ext._set_head_tile(0) == 0


@requires_gpu
@pytest.mark.parametrize("fmt", ["fp8_ds_mla_v4", "fp8_ds_mla_v4_fnuz"])
def test_gpu_two_token_blocks(fmt):
    """On Hopper, one-split V4 calls with more than one wave of 64-head blocks may walk two
    tokens per block through one pipeline (the second token's Q copied during the first's last
    tile, the first's output written at the boundary); forced here (mode 2), since the automatic
    choice takes only short rows. Window + compressed sets with lengths that give the first or
    the second token of a block no rows, one row, whole and partial tiles; an odd token count (a
    last block of one token); 64 heads and 100 (a partial second head group); a sink and lse:
    the reference result, every element written, and bit for bit the one-token kernel's."""
    g = torch.Generator().manual_seed(523 + len(fmt))
    T, W, W2 = 301, 128, 512
    idx, lengths = make_indices(g, T, W, 2 * 256, "scattered", "random")
    e_idx, e_len = make_indices(g, T, W2, 40 * 64, "scattered", "random")
    # (window, compressed) lengths; rows 12 and 13: a block with both tokens empty
    pattern = torch.tensor([[0, 0], [0, 5], [7, 0], [1, 1], [64, 0], [0, 64], [128, 512], [65, 63],
                            [128, 0], [0, 512], [3, 200], [128, 129], [0, 0], [0, 0], [1, 0], [0, 1]],
                           dtype=torch.int32)
    n = len(pattern)
    lengths[:n] = pattern[:, 0]
    e_len[:n] = pattern[:, 1]
    lengths[n:2 * n] = pattern[:, 0].roll(1)  # the same pairs at odd offsets
    e_len[n:2 * n] = pattern[:, 1].roll(1)
    cache = make_cache(g, fmt, 512, 2, 256, idx, "cuda")
    e_cache = make_cache(g, fmt, 512, 40, 64, e_idx, "cuda")
    for H in (64, 100):
        q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
        sink = make_sink(g, H, "finite")
        extra = dict(cache=e_cache, indices=e_idx, lengths=e_len)
        got = {}
        for mode in (2, 1):
            with gpu_path(two_token=mode):
                out, lse, ws = run_check(q, cache, idx, fmt=fmt, scale=512 ** -0.5, device="cuda", num_splits=1,
                                         lengths=lengths, extra=extra, sink=sink)
                got[mode] = (out.clone(), lse.clone())
                # the kernel that ran (template arguments ..., ASYM, TWO): one more call, profiled
                # alone (the reference check above stays outside the profiler)
                names = _split_kernel_names(lambda: mla_ext.sparse_mla_decode(
                    q.cuda(), cache, idx.cuda(), kv_format=fmt, softmax_scale=512 ** -0.5, output=out,
                    workspace=ws, lse=lse, num_splits=1, lengths=lengths.cuda(), extra_kv_cache=e_cache,
                    extra_indices=e_idx.cuda(), extra_lengths=e_len.cuda(), attn_sink=sink.cuda()))
            if _wgmma_kernel_expected() and _asym_on() and names:
                two = "true" if mode == 2 else "false"
                assert all(re.search(rf"decode_split_mma_kernel<4, 512, [^>]*, true, true, {two}, false, false, false>", n)
                           for n in names), names
        assert torch.equal(got[2][0], got[1][0]) and torch.equal(got[2][1], got[1][1])


@requires_gpu
@pytest.mark.parametrize("fmt", ["fp8_ds_mla_v4", "fp8_ds_mla_v4_fnuz"])
def test_gpu_balanced_64_head_tile_counts(fmt):
    """The balanced map's 64-head kernel over splits of 1-6 key tiles of 64 rows, full and partial:
    on Hopper its warpgroup kernels keep two K stages (tile j + 1 dequantised while tile j's
    products run; row addresses two tiles ahead in the symmetric kernel, three in the asymmetric
    one, the default), and the asymmetric one's named barriers are skipped at the first and last
    tiles, so every tile count and both stage parities must give the reference result. C128-like
    widths (4096) with short lengths and one full row, invalid slots in every row, a sink, 64 and
    72 heads (a partial second head tile), 2 and 3 splits."""
    g = torch.Generator().manual_seed(307 + len(fmt))
    lengths = torch.tensor([1, 63, 64, 65, 128, 129, 191, 192, 250, 320, 383, 4096], dtype=torch.int32)
    T, W, ps = lengths.numel(), 4096, 2
    idx, _ = make_indices(g, T, W, 2500 * ps, "scattered", None)
    cache = make_cache(g, fmt, 512, 2500, ps, idx, "cuda")
    for H in (64, 72):
        q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
        sink = make_sink(g, H, "finite")
        with gpu_path(head_tile=64):
            for S in (2, 3):
                run_check(q, cache, idx, fmt=fmt, scale=0.05, device="cuda", num_splits=S, lengths=lengths,
                          sink=sink)
            _check_64_head_kernel_kind(lambda: run_check(q, cache, idx, fmt=fmt, scale=0.05, device="cuda",
                                                         num_splits=2, lengths=lengths, check=False), False,
                                       _asym_expected(fmt))


# GPUs with less shared memory per block than the 64-head kernels take (Cfg in
# sparse_mla_decode.cuh: mma.sync kernels, bytes): 64 heads 162304 (V4) / 178688 (bf16 576) /
# 207360 (V3.2); 32 heads 115456 / 127744 / 151296; 16 heads 96384 / 106624 / 114560; the
# portable kernels <= 48640. Emulated on any GPU with _set_smem_limit plus mma.sync (A100 and
# sm_86 / sm_89 have no warpgroup MMAs): (limit, format) -> the split kernel expected.
SMEM_FALLBACK_CASES = [
    (166912, "fp8_ds_mla_v4", 512, "mma 4"),  # A100: 163 KB
    (166912, "bf16", 576, "mma 2"),
    (166912, "fp8_ds_mla", 576, "mma 2"),
    (101376, "fp8_ds_mla_v4", 512, "mma 1"),  # sm_86 / sm_89: 99 KB
    (101376, "bf16", 576, "portable"),
    (101376, "fp8_ds_mla", 576, "portable"),
]


@requires_gpu
@pytest.mark.parametrize("limit,fmt,d_qk,expect", SMEM_FALLBACK_CASES)
def test_gpu_smem_limit_falls_back_to_smaller_tiles(limit, fmt, d_qk, expect):
    """A device whose blocks cannot have a head tile's shared memory gets smaller head tiles, then
    the portable kernels, instead of a failed launch: correct results at 64 and 128 heads with 1
    and 3 splits, and (where the profiler names kernels) the expected split kernel ran."""
    g = torch.Generator().manual_seed(311 + limit % 97 + d_qk)
    T, W = 3, 300
    idx, lengths = make_indices(g, T, W, 12 * 64, "scattered", "random")
    cache = make_cache(g, fmt, d_qk, 12, 64, idx, "cuda")
    for H in (64, 128):
        q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
        with gpu_path(head_tile=64, mma_sync=True, smem_limit=limit):
            for S in (1, 3):
                run_check(q, cache, idx, fmt=fmt, scale=d_qk ** -0.5, device="cuda", num_splits=S, lengths=lengths)
            names = _split_kernel_names(lambda: run_check(q, cache, idx, fmt=fmt, scale=d_qk ** -0.5, device="cuda",
                                                          num_splits=1, check=False))
        if names and torch.cuda.get_device_capability()[0] >= 8:
            kinds = {("portable" if "portable" in n else "mma " + re.search(r"decode_split_mma_kernel<(\d+),", n).group(1))
                     for n in names}
            assert kinds == {expect}, names


@requires_gpu
@pytest.mark.parametrize("fmt,d_qk", [("fp8_ds_mla_v4", 512), ("fp8_ds_mla", 576)])
def test_gpu_smem_limit_above_the_device_counts_as_the_device(fmt, d_qk):
    """A shared-memory limit larger than the device's per-block opt-in maximum is taken as that
    maximum: the call runs the kernels the device's own limit picks (no launch failure) and gives
    bit-identical results to the automatic limit."""
    g = torch.Generator().manual_seed(17 + d_qk)
    T, W, H = 3, 300, 128
    idx, lengths = make_indices(g, T, W, 12 * 64, "scattered", "random")
    cache = make_cache(g, fmt, d_qk, 12, 64, idx, "cuda")
    q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
    kw = dict(fmt=fmt, scale=d_qk ** -0.5, device="cuda", num_splits=3, lengths=lengths)
    ref = run_check(q, cache, idx, **kw)
    with gpu_path(smem_limit=1 << 30):
        got = run_check(q, cache, idx, **kw)
    assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])


def test_set_smem_limit_range():
    with pytest.raises(RuntimeError, match="expected bytes 0 \\(the device's limit\\) or > 0, got -1"):
        torch.ops.mla_ext._set_smem_limit(-1)
    assert torch.ops.mla_ext._set_smem_limit(0) == 0


@pytest.mark.parametrize("setter,too_big,message", [
    ("_set_head_tile", 65, "expected head_tile 0 \\(automatic\\) or 1..64, got 65"),
    ("_set_two_token", 3, "expected mode 0 \\(automatic\\), 1 \\(never\\) or 2 \\(wherever allowed\\), got 3")])
def test_set_switch_range(setter, too_big, message):
    """The GPU path switches refuse values out of range (above and below), naming the range, and
    return the previous setting (0, automatic, after the reset)."""
    fn = getattr(torch.ops.mla_ext, setter)
    with pytest.raises(RuntimeError, match=message):
        fn(too_big)
    with pytest.raises(RuntimeError, match="got -1"):
        fn(-1)
    assert fn(0) == 0
    assert fn(0) == 0


@requires_gpu
@pytest.mark.parametrize("mma_sync", [False, True])
@pytest.mark.parametrize("fmt,d_qk", FP8_GEOMS)
def test_gpu_fp8_every_byte_value_64_head_tile(fmt, d_qk, mma_sync):
    """test_fp8_every_byte_value through the 64-head tile on both tensor-core kernels (on Hopper
    with an sm_90a build the default one multiplies with warpgroup MMAs; for V3.2 both apply the
    fp32 scales to per-group partial products and per-group P copies, keys entering exactly).
    Where the warpgroup kernel is expected, the profiler's kernel names show which one ran."""
    with gpu_path(head_tile=64, mma_sync=mma_sync):
        for S in (1, 2):
            check_every_byte_value("cuda", fmt, d_qk, S, num_heads=64)
        _check_64_head_kernel_kind(lambda: check_every_byte_value("cuda", fmt, d_qk, 1, num_heads=64), mma_sync)


@requires_gpu
@pytest.mark.parametrize("head_tile,mma_sync", [(64, False), (64, True), (16, None), (32, None)])
def test_gpu_v32_keys_enter_exactly(head_tile, mma_sync):
    """V3.2 (fp32 scales, 64 heads; the 64-head tile on both tensor-core kernels, and the 16- and
    32-head mma.sync tiles, whose warps each multiply half of the dims) on the benchmark's
    DeepSeek-like inputs, whose scores span ~60 (softmax_scale 0.135): keys must enter the
    products exactly (e4m3 value, scale applied after). Rounding value x scale to bf16 instead
    gives lse errors ~0.1 and output errors ~0.02 of max |ref| on these inputs (float64
    emulation), so the lse bound below (the CPU's 1e-3) fails for a kernel that rounds keys. Where
    the profiler names kernels, they show which one ran."""
    inp = builders.build_decode_inputs("v32", batch=2, num_heads=64, context_len=(3000, 5000), device="cuda",
                                       seed=41)
    T, H = inp.num_tokens, 64
    ref_o, ref_l = inp.reference(dtype=torch.float64)
    with gpu_path(head_tile=head_tile, mma_sync=mma_sync):
        for S in (1, 3):
            out, lse, ws = poisoned_buffers(T, H, S, "cuda")
            mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, inp.indices, output=out, workspace=ws, lse=lse,
                                      num_splits=S, **inp.op_kwargs())
            check_out(out, ref_o, inp.kv_format)
            err = (lse.double().cpu() - ref_l.cpu()).abs().max().item()
            assert err <= 1e-3, f"lse error {err:.3g} (splits {S})"
        run = lambda: mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, inp.indices, output=out, workspace=ws,
                                                lse=lse, num_splits=1, **inp.op_kwargs())
        # (V3.2's 16- and 32-head mma.sync tiles take 114560 / 151296 bytes of shared memory per
        # block: sm_86 / sm_89 GPUs, 101376, run smaller tiles or the portable kernel instead.)
        optin = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()),
                        "shared_memory_per_block_optin", 0)
        if head_tile == 64:
            _check_64_head_kernel_kind(run, mma_sync)
        elif torch.cuda.get_device_capability()[0] >= 8 and optin >= {16: 114560, 32: 151296}[head_tile]:
            names = _split_kernel_names(run)
            mt = str(head_tile // 16)
            assert all(re.search(r"decode_split_mma_kernel<" + mt + ",", n) for n in names), names


@requires_gpu
@pytest.mark.parametrize("fmt,d_qk", FP8_GEOMS)
def test_gpu_fp8_every_byte_value_portable(fmt, d_qk):
    """test_fp8_every_byte_value on the portable (no tensor-core) GPU path, the one HIP builds use;
    the plain test covers the tensor-core path on NVIDIA sm_80+ (packed cvt on sm_89+)."""
    with gpu_path(portable=True):
        for S in (1, 2):
            check_every_byte_value("cuda", fmt, d_qk, S)


@requires_gpu
def test_gpu_c128_8192_entries():
    g = torch.Generator().manual_seed(21)
    T, H = 2, 64
    idx, lengths = make_indices(g, T, 128, 256 * 2, "none", "random")
    cache = make_cache(g, "fp8_ds_mla_v4", 512, 2, 256, idx, "cuda")
    e_idx = torch.arange(8192, dtype=torch.int32).repeat(T, 1)
    e_len = torch.tensor([8192, 5000], dtype=torch.int32)
    e_cache = make_cache(g, "fp8_ds_mla_v4", 512, 4096 + 2, 2, e_idx, "cuda")
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    for S in (0, 1, 64):
        run_check(q, cache, idx, fmt="fp8_ds_mla_v4", scale=512 ** -0.5, device="cuda", num_splits=S,
                  lengths=lengths, extra=dict(cache=e_cache, indices=e_idx, lengths=e_len),
                  sink=make_sink(g, H, "finite"))


@requires_gpu
@pytest.mark.parametrize("kind", ["v4_c4", "v32"])
def test_gpu_many_tokens(kind):
    inp = builders.build_decode_inputs(kind, batch=256, num_heads=16, context_len=(100, 3000), mtp=1,
                                       device="cuda", seed=22)
    assert inp.num_tokens == 512
    out, lse, ws = poisoned_buffers(512, 16, 0, "cuda")
    mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, inp.indices, output=out, workspace=ws, lse=lse, **inp.op_kwargs())
    ref_o, ref_l = inp.reference(dtype=torch.float64)
    check_out(out, ref_o, inp.kv_format)
    check_lse(lse, ref_l.cpu(), kv_format=inp.kv_format)


@requires_gpu
@pytest.mark.parametrize("kind,heads", [("v4_c4", 16), ("v32", 128)])
def test_gpu_neighbouring_kernels_ordered(kind, heads):
    """Launch order with the kernels around the decode (on sm_90+ the split kernel and the reduce
    are programmatic dependent launches that may start before the previous kernel ends): every
    round a kernel writes q and the indices just before the call (read after write) and a kernel
    reads the output and lse just before the next call overwrites them (write after read), with no
    host sync in between. The oracle is the same calls one at a time with a device sync around
    each (bit-identical: the op is deterministic); the first call is also checked against the
    float64 reference. These neighbours do not trigger early, so a missing wait only races with
    their memory flush (a build without it passed here); test_gpu_waits_for_an_early_triggering_kernel
    is the one that fails then."""
    inp = builders.build_decode_inputs(kind, batch=1, num_heads=heads, context_len=(3000, 5000),
                                       device="cuda", seed=31)
    T, H = inp.num_tokens, heads
    kw = inp.op_kwargs()
    g = torch.Generator().manual_seed(32)
    rounds = 24
    qs = [inp.q] + [torch.randn(inp.q.shape, generator=g).to(torch.bfloat16).cuda() for _ in range(rounds - 1)]
    perms = [inp.indices, inp.indices.flip(1).contiguous()]  # same rows, another order
    out, lse, ws = poisoned_buffers(T, H, 0, "cuda")
    q, idx = torch.empty_like(inp.q), torch.empty_like(inp.indices)
    if kw["lengths"] is not None:
        assert int(kw["lengths"].min()) == inp.indices.shape[1]  # full rows: the flip keeps the set
    expected = []
    for i in range(rounds):
        q.copy_(qs[i]); idx.copy_(perms[i % 2])
        torch.cuda.synchronize()
        mla_ext.sparse_mla_decode(q, inp.kv_cache, idx, output=out, workspace=ws, lse=lse, **kw)
        torch.cuda.synchronize()
        expected.append((out.clone(), lse.clone()))
    ref_o, ref_l = inp.reference(dtype=torch.float64)
    check_out(expected[0][0], ref_o, inp.kv_format)
    poison_(out); poison_(lse)
    seen = []
    torch.cuda.synchronize()
    for i in range(rounds):
        torch.mul(qs[i], 1.0, out=q)  # kernels, not copy-engine memcpys
        torch.add(perms[i % 2], 0, out=idx)
        seen.append((out * 1.0, lse * 1.0))
        mla_ext.sparse_mla_decode(q, inp.kv_cache, idx, output=out, workspace=ws, lse=lse, **kw)
    seen.append((out * 1.0, lse * 1.0))
    torch.cuda.synchronize()
    assert torch.isnan(seen[0][0]).all() and torch.isnan(seen[0][1]).all()
    for i in range(rounds):
        assert torch.equal(seen[i + 1][0], expected[i][0]), f"round {i}: output"
        assert torch.equal(seen[i + 1][1], expected[i][1]), f"round {i}: lse"


@requires_gpu
def test_gpu_waits_for_an_early_triggering_kernel():
    """The kernel before the decode lets it launch at once (griddepcontrol.launch_dependents) and
    writes the sink only 200 us later (torch.ops.mla_ext._test_late_fill): a split kernel that read
    before waiting would fold in the old sink (+-40: all weight on the sink, or none). Oracle: the
    same call with the sink written and synchronised first (bit-identical)."""
    inp = builders.build_decode_inputs("v4_c4", batch=1, num_heads=16, context_len=(3000, 5000),
                                       device="cuda", seed=35)
    kw = inp.op_kwargs()
    sink = torch.empty(16, device="cuda")
    kw["attn_sink"] = sink
    out, lse, ws = poisoned_buffers(inp.num_tokens, 16, 0, "cuda")
    expected = {}
    for v in (40.0, -40.0):
        sink.fill_(v)
        mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, inp.indices, output=out, workspace=ws, lse=lse, **kw)
        torch.cuda.synchronize()
        expected[v] = (out.clone(), lse.clone())
    assert not torch.equal(expected[40.0][0], expected[-40.0][0])
    for v in (40.0, -40.0, 40.0, -40.0):
        sink.fill_(-v)
        poison_(out); poison_(lse)
        torch.cuda.synchronize()
        torch.ops.mla_ext._test_late_fill(sink, v, 200000)
        mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, inp.indices, output=out, workspace=ws, lse=lse, **kw)
        torch.cuda.synchronize()
        assert torch.equal(out, expected[v][0]), f"sink {v}: output"
        assert torch.equal(lse, expected[v][1]), f"sink {v}: lse"


_PDL_CHILD = """
import sys, torch, mla_ext
from mla_ext import builders
# 2 tokens x 16 heads: 40 split blocks, few enough to trigger the reduce early (compat.h)
inp = builders.build_decode_inputs("v4_c4", batch=2, num_heads=16, context_len=(3000, 5000), device="cuda", seed=33)
out = torch.empty(inp.num_tokens, 16, 512, dtype=torch.bfloat16, device="cuda")
lse = torch.empty(inp.num_tokens, 16, device="cuda")
ws = torch.empty(mla_ext.sparse_mla_decode_workspace_size(inp.num_tokens, 16, device="cuda"), dtype=torch.uint8, device="cuda")
mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, inp.indices, output=out, workspace=ws, lse=lse, **inp.op_kwargs())
m = torch.empty(3, 128, 512, dtype=torch.bfloat16, device="cuda")
ml = torch.empty(3, 128, device="cuda")
g = torch.Generator(device="cuda").manual_seed(34)
a, b = (torch.randn(3, 128, 512, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
la, lb = (torch.randn(3, 128, device="cuda", generator=g) for _ in range(2))
mla_ext.merge_attn_states(m, ml, a, la, b, lb)
torch.save(dict(out=out.cpu(), lse=lse.cpu(), m=m.cpu(), ml=ml.cpu()), sys.argv[1])
"""


@requires_gpu
def test_gpu_pdl_switch_same_results(tmp_path):
    """MLA_EXT_PDL=0 (ordinary launches), 7 (programmatic launches, no early trigger) and the
    default (programmatic launches on sm_90+, small grids triggering early) give bit-identical
    decode and merge results (each run in its own process: the switch is read once)."""
    results = []
    for pdl in ("0", "7", None):
        env = dict(os.environ)
        env.pop("MLA_EXT_PDL", None)
        if pdl is not None:
            env["MLA_EXT_PDL"] = pdl
        path = tmp_path / f"pdl_{pdl}.pt"
        subprocess.run([sys.executable, "-c", _PDL_CHILD, str(path)], check=True, env=env)
        results.append(torch.load(path))
    for key in ("out", "lse", "m", "ml"):
        assert not torch.isnan(results[0][key]).any(), key
        for other in results[1:]:
            assert torch.equal(results[0][key], other[key]), key


_SWITCH_CHILD = """
import json, sys, torch, mla_ext
from mla_ext import builders
from torch.profiler import ProfilerActivity, profile
cfg = json.loads(sys.argv[3])
if cfg["head_tile"]:
    torch.ops.mla_ext._set_head_tile(cfg["head_tile"])
res = {}
for kind, heads, batch, ctx, splits, seed, *fmt in cfg["cases"]:  # (an optional kv_format last)
    inp = builders.build_decode_inputs(kind, batch=batch, num_heads=heads, context_len=tuple(ctx), device="cuda",
                                       seed=seed, kv_format=fmt[0] if fmt else None)
    T = inp.num_tokens
    out = torch.full((T, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((T, heads), float("nan"), device="cuda")
    ws = torch.full((mla_ext.sparse_mla_decode_workspace_size(T, heads, num_splits=splits, device="cuda"),), 255,
                    dtype=torch.uint8, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, inp.indices, output=out, workspace=ws, lse=lse,
                                  num_splits=splits, **inp.op_kwargs())
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages() if cfg["kernel"] in e.key]
    # The float64 reference (the same seeded inputs in every child) only where the parent asks.
    ref_o, ref_l = ([r.cpu() for r in inp.reference(dtype=torch.float64)] if sys.argv[2] == "ref"
                    else (None, None))
    res[f"{kind}_{heads}_{batch}" + "".join(f"_{f}" for f in fmt if f)] = (out.cpu(), lse.cpu(), ref_o, ref_l, names,
                                                                   inp.kv_format)
torch.save(res, sys.argv[1])
"""


def _run_switch_children(tmp_path, var, values, ref_value, cases, kernel, head_tile=0):
    """_SWITCH_CHILD once per value of the environment variable ``var`` ("" = unset; switches are
    read once per process): {value: {case: (out, lse, ref_out, ref_lse, kernel names, kv_format)}},
    the float64 reference computed only in the ``ref_value`` child (none for a value no child has).
    A case is (kind, heads, batch, context_len range, num_splits, seed[, kv_format])."""
    cfg = json.dumps(dict(cases=cases, kernel=kernel, head_tile=head_tile))
    results = {}
    for value in values:
        env = dict(os.environ)
        env.pop(var, None)
        if value:
            env[var] = value
        path = tmp_path / f"{var}_{value or 'default'}.pt"
        subprocess.run([sys.executable, "-c", _SWITCH_CHILD, str(path), "ref" if value == ref_value else "-", cfg],
                       check=True, env=env)
        results[value] = torch.load(path)
    return results


@requires_gpu
def test_gpu_asym_switch_both_kernels(tmp_path):
    """The 64-head tile of the FP8 caches (V4 and V3.2 rows) with MLA_EXT_ASYM=0 (the symmetric
    warpgroup kernel: both warpgroups split Q.K's dims, S through shared memory), MLA_EXT_ASYM=1
    and unset (the default: asymmetric warpgroups on Hopper, Q.K and the softmax in warpgroup 0's
    registers; V3.2's keys as value x 2^k with the scales' mantissas multiplied in between the
    groups' products): each against the
    float64 reference on both split maps, and the kernels within rounding of each other (the Q.K
    sums run in another order, so not bit-identical). Each in its own process: the switch is read
    once. Where the profiler names kernels and this GPU and build run the warpgroup kernel, the
    kernel's ASYM argument shows which one ran."""
    # The V4 64-head tile (forced) on both split maps: window and C4 layers (uniform map) at 64-128
    # heads, C128 layers with rows of up to ~7800 entries (balanced map: 2-512 tokens this wide);
    # 1-40 tokens, sinks, lse; splits of 1-2 key tiles (window rows of 128; C4 rows of 640 over 8
    # splits) and of many; and the anchored map (the automatic count at 264 tokens: both kernels'
    # anchored instances); V3.2 rows (uniform map) at 64-128 heads, index sets of 2048 entries and
    # short ones (contexts from 300). (kind, heads, batch, context_len, num_splits, seed)
    cases = [(kind, heads, batch, (300, ctx), splits, heads + batch)
             for kind, heads, batch, ctx, splits in (("v4_swa", 128, 8, 3000, 1), ("v4_c4", 100, 20, 3000, 2),
                                                     ("v4_c4", 72, 1, 3000, 8), ("v4_c4", 64, 40, 3000, 1),
                                                     ("v4_c128", 128, 2, 10**6, 4), ("v4_c128", 72, 8, 10**6, 3),
                                                     ("v4_c128", 64, 264, 10**6, 0), ("v32", 128, 6, 5000, 1),
                                                     ("v32", 72, 3, 5000, 3), ("v32", 64, 24, 5000, 0))]
    results = _run_switch_children(tmp_path, "MLA_EXT_ASYM", ("0", "1", ""), "1", cases, "decode_split", head_tile=64)
    for key, (out, lse, ref_o, ref_l, names, fmt) in results["1"].items():
        for asym in ("0", "1", ""):
            o, l_, _, _, nm, _ = results[asym][key]
            check_out(o, ref_o, fmt)
            check_lse(l_, ref_l, kv_format=fmt)
            if _wgmma_kernel_expected() and nm:
                flag = "true" if _asym_on(asym) else "false"
                pat = rf"decode_split_mma_kernel<4, (?:512|576), [^>]*, true, {flag}, (?:true|false), false, (?:true|false), false>"
                if _asym_on(asym) and key.startswith("v32_") and int(key.split("_")[1]) > 64 and _cluster_on():
                    pat = r"decode_split_cluster_kernel<576, "  # (V3.2 at 65-128 heads: 2-block clusters)
                assert any(re.search(pat, n) for n in nm), nm
        o0, l0 = results["0"][key][0].double(), results["0"][key][1].double()
        assert ((out.double() - o0).abs().max() / o0.abs().max()).item() < 1e-2, key
        assert (lse.double() - l0).abs().max().item() < 1e-3, key


@requires_gpu
def test_gpu_asym16_switch(tmp_path):
    """The 16-head tile of the FP8 caches with MLA_EXT_ASYM16=1 (asymmetric warpgroups with the
    products transposed, S^T = K Q^T and O^T = V^T P^T as wgmma m64n16k16; decode_body's A16) and
    0 (the mma.sync tile): each against the float64 reference, and within rounding of each other
    (other summation orders, so not bit-identical). Each in its own process: the switch is read
    once. Where the profiler names kernels and this GPU and build run the warpgroup kernel, the
    first ran the A16 instance (MT 1, WG and ASYM set) and the second never did. Unset (the
    default launch rule, = 2): within rounding of the reference, and A16 ran for exactly the V3.2
    calls whose splits span >= 320 of the 2048 index entries (explicit counts; the automatic
    count's case is only checked against the reference)."""
    # V4 window, C4 and C128 rows at 1-16 heads (partial head tiles: 5, 9, 12): the uniform map
    # (window, C4, C128 at one token) and the balanced map (C128 rows of up to ~1e6 context, 3-6
    # tokens); one split, several, and automatic (splits of one 64-row tile and of many); V3.2
    # rows (uniform map) with index sets of 2048 entries and short ones, and the fnuz twins.
    # (kind, heads, batch, context_len, num_splits, seed[, kv_format])
    cases = [("v4_swa", 16, 8, (300, 3000), 1, 3), ("v4_c4", 12, 5, (300, 3000), 2, 5),
             ("v4_c4", 16, 40, (300, 3000), 0, 7), ("v4_c4", 9, 3, (100, 900), 3, 9, "fp8_ds_mla_v4_fnuz"),
             ("v4_c128", 16, 1, (10**6, 10**6), 0, 11), ("v4_c128", 16, 6, (300, 10**6), 0, 13),
             ("v4_c128", 5, 3, (300, 10**6), 4, 15), ("v32", 16, 6, (300, 5000), 1, 17),
             ("v32", 12, 3, (300, 5000), 3, 19), ("v32", 16, 24, (300, 5000), 0, 21),
             ("v32", 9, 4, (300, 5000), 2, 23, "fp8_ds_mla_fnuz"), ("v32", 16, 4, (300, 5000), 8, 25),
             ("v32", 14, 4, (300, 5000), 6, 27), ("v32", 16, 5, (300, 5000), 7, 29)]
    results = _run_switch_children(tmp_path, "MLA_EXT_ASYM16", ("1", "0", ""), "1", cases, "decode_split")
    splits = {f"{c[0]}_{c[1]}_{c[2]}" + (f"_{c[6]}" if len(c) > 6 else ""): c[4] for c in cases}
    for key, (out, lse, ref_o, ref_l, names, fmt) in results["1"].items():
        o0, l0, _, _, names0, _ = results["0"][key]
        o2, l2, _, _, names2, _ = results[""][key]
        for o, l_ in ((out, lse), (o0, l0), (o2, l2)):
            check_out(o, ref_o, fmt)
            check_lse(l_, ref_l, kv_format=fmt)
        if _wgmma_kernel_expected() and names and names0:
            assert any(re.search(A16_KERNEL, n) for n in names), (key, names)
            assert not any(re.search(A16_KERNEL, n) for n in names0), (key, names0)
        if _wgmma_kernel_expected() and names2 and splits[key] > 0:
            want = key.startswith("v32_") and 2048 >= 320 * splits[key]
            assert any(re.search(A16_KERNEL, n) for n in names2) == want, (key, names2)
        assert ((out.double() - o0.double()).abs().max() / o0.double().abs().max()).item() < 1e-2, key
        assert (lse.double() - l0.double()).abs().max().item() < 1e-3, key


@requires_gpu
def test_gpu_raw_qk_switch(tmp_path, monkeypatch):
    """The 16-head V4 tile with MLA_EXT_RAWQK=1 (Q.K's key fragments straight from the gathered
    registers wherever it applies: every map, not the Q-register instance; decode_body's
    kRawQK), 0 (Q.K from the dequantised tile) and unset (the default rule: splits of >= 128
    index entries): each against the float64 reference, and within rounding of each other (Q.K
    sums its dims in another order, so not bit-identical). Each in its own process: the switch
    is read once. Where the profiler names kernels, some call of the first ran the RAW instance
    (the last template argument) and no call of the second did, and the anchored-map case ran the
    anchored RAW instance under the first and the default (MLA_EXT_QREG=0 in all three keeps
    the Q-register kernel, which would take the one-wave calls, out of this test)."""
    # Window, C4 and C128 rows at 5-16 heads: the uniform map (window, C4, C128 at one token) and
    # the balanced map (C128 rows up to ~1e6 context at 3-6 tokens) and its anchored form (264
    # tokens, automatic count: decode_active_slack); splits of one partial tile,
    # of one or two tiles and of many, automatic counts; the fnuz twin; sinks and invalid rows as
    # the builders make them. (kind, heads, batch, context_len, num_splits, seed[, kv_format])
    cases = [("v4_swa", 16, 8, (300, 3000), 1, 31), ("v4_swa", 12, 5, (300, 3000), 4, 33),
             ("v4_c4", 16, 5, (300, 3000), 2, 35), ("v4_c4", 9, 3, (100, 900), 3, 37, "fp8_ds_mla_v4_fnuz"),
             ("v4_c4", 16, 40, (300, 3000), 0, 39), ("v4_c128", 16, 1, (10**6, 10**6), 0, 41),
             ("v4_c128", 16, 6, (300, 10**6), 0, 43), ("v4_c128", 5, 3, (300, 10**6), 4, 45),
             ("v4_c128", 16, 2, (10**6, 10**6), 65, 47), ("v4_c128", 16, 264, (300, 10**6), 0, 49)]
    monkeypatch.setenv("MLA_EXT_QREG", "0")
    results = _run_switch_children(tmp_path, "MLA_EXT_RAWQK", ("1", "0", ""), "1", cases, "decode_split")
    raw = r"decode_split_mma_kernel<1, 512, [^>]*, false, false, false, false, (?:true|false), true>"
    raw_anchored = r"decode_split_mma_kernel<1, 512, [^>]*, true, false, false, false, false, true, true>"
    any_raw = False
    for key, (out, lse, ref_o, ref_l, names, fmt) in results["1"].items():
        o0, l0, _, _, names0, _ = results["0"][key]
        o2, l2, _, _, names2, _ = results[""][key]
        for o, l_ in ((out, lse), (o0, l0), (o2, l2)):
            assert not o.isnan().any() and not l_.isnan().any(), key
            check_out(o, ref_o, fmt)
            check_lse(l_, ref_l, kv_format=fmt)
        assert ((out.double() - o0.double()).abs().max() / o0.double().abs().max()).item() < 1e-2, key
        assert (lse.double() - l0.double()).abs().max().item() < 1e-3, key
        if names0:
            assert not any(re.search(raw, n) for n in names0), (key, names0)
        any_raw = any_raw or any(re.search(raw, n) for n in names)
        if key == "v4_c128_16_264" and names and torch.cuda.get_device_capability()[0] >= 8:
            for nm in (names, names2):
                assert nm and any(re.search(raw_anchored, n) for n in nm), (key, nm)
    if any(results["1"][k][4] for k in results["1"]) and torch.cuda.get_device_capability()[0] >= 8:
        assert any_raw, "MLA_EXT_RAWQK=1 never ran the RAW instance"


@requires_gpu
def test_gpu_cluster_switch_bit_identical(tmp_path):
    """V3.2 rows (fp8_ds_mla and its fnuz twin) at 65-128 heads with MLA_EXT_CLUSTER=0 (two
    independent 64-head blocks per (token, split), each gathering every row), =1 and unset (the
    default: the two blocks as a 2-block cluster, each gathering half of every tile and copying
    it into the other's shared memory): each against the float64 reference, and the cluster
    kernel bit-identical to the other (the same products in the same order; only who stores each row
    differs). Splits of 1-32 tiles, short index sets (contexts from 300: tiles of invalid rows
    and partial tiles), partial second head groups (65, 100 heads), 1-40 tokens. Each in its own
    process: the switch is read once. Where the profiler names kernels, the kernel's name shows
    which ran."""
    cases = [("v32", heads, batch, (300, ctx), splits, heads + batch + splits, fmt)
             for heads, batch, ctx, splits in ((128, 1, 5000, 0), (128, 6, 5000, 1), (100, 3, 5000, 3),
                                               (65, 40, 5000, 0), (128, 17, 3000, 7), (72, 8, 800, 2))
             for fmt in ("fp8_ds_mla", "fp8_ds_mla_fnuz")]
    results = _run_switch_children(tmp_path, "MLA_EXT_CLUSTER", ("0", "1", ""), "1", cases, "decode_split",
                                   head_tile=64)
    for key, (out, lse, ref_o, ref_l, names, fmt) in results["1"].items():
        for v in ("0", "1", ""):
            o, l_, _, _, nm, _ = results[v][key]
            check_out(o, ref_o, fmt)
            check_lse(l_, ref_l, kv_format=fmt)
            if _wgmma_kernel_expected() and _asym_on() and nm:
                assert any("decode_split_cluster_kernel" in n for n in nm) == _cluster_on(v), (v, nm)
        o0, l0 = results["0"][key][0], results["0"][key][1]
        assert torch.equal(out.view(torch.int16), o0.view(torch.int16)), key
        assert torch.equal(lse.view(torch.int32), l0.view(torch.int32)), key


def _cluster_edge_cases(fmt, H):
    """V3.2 rows at 65-128 heads with the 64-head tile (on Hopper with an sm_90a build, unless
    MLA_EXT_CLUSTER=0: the 2-block cluster kernel) where splits walk no tile at all (lengths 0,
    or all rows past a split's end), one partial tile (1, 63 rows), exactly one or two tiles
    (64, 128) and one row more (65, 129), with invalid rows inside, against the float64
    reference on poisoned outputs and workspace: automatic and 1-7 splits. Where the profiler
    names kernels, the cluster kernel ran exactly where it is expected (_cluster_on)."""
    g = torch.Generator().manual_seed(H + len(fmt))
    T, W, ps = 12, 700, 64
    num_pages = -(-W * T // ps) + 2
    idx, _ = make_indices(g, T, W, num_pages * ps, "scattered", None)
    lengths = torch.tensor([0, 1, 63, 64, 65, 128, 129, 0, 700, 300, 2, 0], dtype=torch.int32)
    cache = make_cache(g, fmt, 576, num_pages, ps, idx, "cuda")
    q = torch.randn(T, H, 576, generator=g).to(torch.bfloat16)
    sink = make_sink(g, H, "random")
    memo = {}
    for S in (0, 1, 3, 7):
        with gpu_path(head_tile=64):
            names = _split_kernel_names(lambda: run_check(q, cache, idx, fmt=fmt, scale=576 ** -0.5, device="cuda",
                                                          num_splits=S, lengths=lengths, sink=sink, memo=memo))
        if names and _wgmma_kernel_expected() and _asym_on():
            assert any("decode_split_cluster_kernel" in n for n in names) == _cluster_on(), (S, names)


@requires_gpu
@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_ds_mla_fnuz"])
@pytest.mark.parametrize("H", [100, 128])
def test_gpu_short_and_empty_splits_at_two_head_groups(fmt, H):
    """_cluster_edge_cases in this process (the default: the 2-block cluster kernel, unless
    MLA_EXT_CLUSTER=0 is set)."""
    _cluster_edge_cases(fmt, H)


@requires_gpu
def test_gpu_one_block_kernel_short_and_empty_splits():
    """_cluster_edge_cases for both V3.2 formats at 100 and 128 heads in a fresh process with
    MLA_EXT_CLUSTER=0 (the switch is read once per process): two independent 64-head blocks."""
    code = ("import sys; sys.path[:0] = sys.argv[1:3]; import test_sparse_mla_decode as m; "
            "[m._cluster_edge_cases(f, h) for f in ('fp8_ds_mla', 'fp8_ds_mla_fnuz') for h in (100, 128)]; "
            "print('done')")
    assert _fresh_process_last_line(code, env=dict(os.environ, MLA_EXT_CLUSTER="0")) == "done"


@requires_gpu
def test_gpu_reduce_column_chunks(tmp_path):
    """One-token calls with fewer token x head rows than processors and more than 32 splits
    reduce each row in 2-4 column chunks by default and in one block with
    MLA_EXT_REDUCE_CHUNKS=1 (20 splits: one block either way): both
    against the float64 reference, and within rounding of each other (the weight sum's order
    differs with the block size). Each in its own process: the switch is read once. Where the
    profiler names kernels, the reduce kernel's last template argument shows the chunk count."""
    # Fewer (token, head) rows than processors and more than 32 splits: each row's columns over 2-4
    # blocks (decode_reduce_chunks); sinks and lse on the V4 layers. The last case (20 splits)
    # keeps one block per row either way. (kind, heads, batch, context_len, num_splits, seed)
    cases = [(kind, heads, batch, (2000, ctx), splits, heads + batch + 7)
             for kind, heads, batch, ctx, splits in (("v4_c128", 16, 1, 10**6, 65), ("v4_c4", 64, 1, 3000, 64),
                                                     ("v32", 8, 1, 5000, 48), ("v4_c128", 3, 1, 10**6, 40),
                                                     ("v4_c4", 8, 1, 3000, 0))]
    results = _run_switch_children(tmp_path, "MLA_EXT_REDUCE_CHUNKS", ("1", ""), "1", cases, "decode_reduce")
    for key, (out, lse, ref_o, ref_l, names, fmt) in results["1"].items():
        o, l_, _, _, nm, _ = results[""][key]
        for got_o, got_l in ((out, lse), (o, l_)):
            check_out(got_o, ref_o, fmt)
            check_lse(got_l, ref_l, kv_format=fmt)
        assert ((o.double() - out.double()).abs().max() / out.double().abs().max()).item() < 1e-2, key
        assert (l_.double() - lse.double()).abs().max().item() < 1e-4, key
        if names and nm:  # template arguments BLOCK_SCAN, BATCH, GROUPED, CH, HB
            assert all(re.search(r"decode_reduce_kernel<true, 8, (?:true|false), 1, 1>", n) for n in names), names
            chunked = any(re.search(r"decode_reduce_kernel<true, 8, true, [24], 1>", n) for n in nm)
            if key == "v4_c4_8_1":
                assert not chunked, nm
            elif torch.cuda.get_device_properties(0).multi_processor_count >= 2 * 64:
                assert chunked, nm


@requires_gpu
def test_gpu_pdl_chain_of_small_grids():
    """Decode and merge calls back to back with no host sync, each reading the previous one's
    output and overwriting what the one before it read: a one-token, 16-head decode's split
    grid is small enough to trigger its reduce early (compat.h), so the reduce is resident
    while the split kernel runs, and every kernel is launched programmatically. Every result
    must equal the same chain with a device sync between the calls."""
    H = 16
    inp = builders.build_decode_inputs("v4_c4", batch=1, num_heads=H, context_len=(3000, 5000), device="cuda",
                                       seed=41)
    kw = inp.op_kwargs()
    g = torch.Generator(device="cuda").manual_seed(42)
    qs = [torch.randn(inp.q.shape, device="cuda", generator=g).to(torch.bfloat16) for _ in range(6)]
    b = torch.randn(1, H, 512, device="cuda", generator=g).to(torch.bfloat16)
    lb = torch.randn(1, H, device="cuda", generator=g)
    ws = torch.empty(mla_ext.sparse_mla_decode_workspace_size(1, H, device="cuda"), dtype=torch.uint8, device="cuda")

    def chain(sync):
        out = torch.empty(1, H, 512, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(1, H, device="cuda")
        ms = [poison_(torch.empty(1, H, 512, dtype=torch.bfloat16, device="cuda")) for _ in qs]
        mls = [poison_(torch.empty(1, H, device="cuda")) for _ in qs]
        torch.cuda.synchronize()
        for q, m, ml in zip(qs, ms, mls):
            mla_ext.sparse_mla_decode(q, inp.kv_cache, inp.indices, output=out, workspace=ws, lse=lse, **kw)
            if sync:
                torch.cuda.synchronize()
            mla_ext.merge_attn_states(m, ml, out, lse, b, lb)  # reads out; the next decode rewrites it
            if sync:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        return ms, mls

    ref_m, ref_ml = chain(sync=True)
    for _ in range(3):
        got_m, got_ml = chain(sync=False)
        for i in range(len(qs)):
            assert not torch.isnan(ref_m[i]).any()
            assert torch.equal(got_m[i], ref_m[i]), i
            assert torch.equal(got_ml[i], ref_ml[i]), i
    assert not torch.equal(ref_m[0], ref_m[1])  # the calls really differ


def capture_decode_graph(q, cache, idx, kw):
    """A CUDA graph of one sparse_mla_decode call, captured on a side stream after a warm-up call."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mla_ext.sparse_mla_decode(q, cache, idx, **kw)  # warm-up
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            mla_ext.sparse_mla_decode(q, cache, idx, **kw)
    torch.cuda.current_stream().wait_stream(side)
    return graph


_GRAPH_FIRST_CALL_SCRIPT = r"""
import sys
sys.path[:0] = sys.argv[1:3]  # the parent's mla_ext, then the tests directory
import torch
import mla_ext
from test_sparse_mla_decode import make_cache, make_indices, poisoned_buffers

g = torch.Generator().manual_seed(5)
T, H, W, fmt, ps, num_pages = 6, 128, 700, "fp8_ds_mla", 64, 80
idx, lengths = make_indices(g, T, W, num_pages * ps, "scattered", "random")
cache = make_cache(g, fmt, 576, num_pages, ps, idx, "cuda")
q = torch.randn(T, H, 576, generator=g).to(torch.bfloat16).cuda()
idx, lengths = idx.cuda(), lengths.cuda()
out, lse, ws = poisoned_buffers(T, H, 0, "cuda")
kw = dict(kv_format=fmt, softmax_scale=576 ** -0.5, lengths=lengths)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
graph = torch.cuda.CUDAGraph()
with torch.cuda.stream(side):
    with torch.cuda.graph(graph, stream=side):  # the process's first decode call
        mla_ext.sparse_mla_decode(q, cache, idx, output=out, workspace=ws, lse=lse, **kw)
torch.cuda.current_stream().wait_stream(side)
graph.replay()
again, lse2, ws2 = poisoned_buffers(T, H, 0, "cuda")
mla_ext.sparse_mla_decode(q, cache, idx, output=again, workspace=ws2, lse=lse2, **kw)
torch.cuda.synchronize()
print(f"same result {torch.equal(out, again) and torch.equal(lse, lse2)}, nan {bool(out.isnan().any())}")
"""


@requires_gpu
def test_gpu_first_call_inside_graph_capture():
    """In a fresh process, the first decode call is captured into a CUDA graph (no warm-up call):
    V3.2 at 128 heads, which on Hopper runs the 2-block cluster kernel, whose first call sets its
    shared-memory limit and asks whether a cluster fits. The replayed graph writes what an eager
    call writes, bit for bit, and every output element."""
    line = _fresh_process_last_line(_GRAPH_FIRST_CALL_SCRIPT)
    assert line == "same result True, nan False", line


@requires_gpu
def test_gpu_cuda_graph_replay_with_new_indices():
    g = torch.Generator().manual_seed(23)
    T, H, W, fmt = 8, 64, 512, "fp8_ds_mla_v4"
    num_pages, ps = 40, 64
    idx, lengths = make_indices(g, T, W, num_pages * ps, "none", "random")
    all_slots = torch.arange(num_pages * ps)
    cache = make_cache(g, fmt, 512, num_pages, ps, all_slots, "cuda")
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16).cuda()
    idx_d, len_d = idx.cuda(), lengths.cuda()
    out, lse, ws = poisoned_buffers(T, H, 0, "cuda")
    sink = torch.randn(H, generator=g).cuda()
    kw = dict(kv_format=fmt, softmax_scale=0.05, output=out, workspace=ws, lse=lse, lengths=len_d, attn_sink=sink)
    graph = capture_decode_graph(q, cache, idx_d, kw)
    for rep in range(3):
        new_idx, new_len = make_indices(g, T, W, num_pages * ps, ["scattered", "trailing", "all_rows"][rep], "random")
        idx_d.copy_(new_idx)
        len_d.copy_(new_len)
        poison_(out), poison_(lse), ws.fill_(0xFF)
        graph.replay()
        torch.cuda.synchronize()
        ref_o, ref_l = reference.sparse_mla_decode(q.cpu(), _cpu_v4(cache), new_idx, kv_format=fmt, softmax_scale=0.05,
                                                   lengths=new_len, attn_sink=sink.cpu())
        assert_close_rel(out, ref_o, torch.bfloat16)
        check_lse(lse, ref_l)


def _gpu_v4_long_rows(g, T, H, W, num_pages, invalid):
    """Random V4 FP8 rows in a GPU cache of num_pages pages of 2 slots (a C128 set's page size),
    [T, W] indices with invalid entries as make_indices places them, and a bf16 q on the GPU:
    (indices on the CPU, the same on the GPU, cache, q)."""
    idx, _ = make_indices(g, T, W, num_pages * 2, invalid, None)
    cache = make_cache(g, "fp8_ds_mla_v4", 512, num_pages, 2, torch.arange(num_pages * 2), "cuda")
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16).cuda()
    return idx, idx.cuda(), cache, q


@requires_gpu
def test_gpu_cuda_graph_replay_balanced_map():
    """A captured call on the balanced split map (V4, W >= 4096, lengths) replays correctly after
    the lengths go from equal (the uniform map) to one straggler and back to mixed."""
    g = torch.Generator().manual_seed(29)
    T, H, W, fmt = 12, 16, 4608, "fp8_ds_mla_v4"
    idx, idx_d, cache, q = _gpu_v4_long_rows(g, T, H, W, 3000, "scattered")
    len_d = torch.full((T,), W, dtype=torch.int32, device="cuda")
    out, lse, ws = poisoned_buffers(T, H, 0, "cuda")
    kw = dict(kv_format=fmt, softmax_scale=0.05, output=out, workspace=ws, lse=lse, lengths=len_d)
    graph = capture_decode_graph(q, cache, idx_d, kw)
    straggler = torch.full((T,), 40, dtype=torch.int32)
    straggler[3] = W
    for new_len in (torch.full((T,), W, dtype=torch.int32), straggler,
                    torch.randint(0, W + 1, (T,), generator=g, dtype=torch.int32)):
        len_d.copy_(new_len)
        poison_(out), poison_(lse), ws.fill_(0xFF)
        graph.replay()
        torch.cuda.synchronize()
        ref_o, ref_l = reference.sparse_mla_decode(q.cpu(), _cpu_v4(cache), idx, kv_format=fmt, softmax_scale=0.05,
                                                   lengths=new_len)
        assert_close_rel(out, ref_o, torch.bfloat16)
        check_lse(lse, ref_l)


def _active_map(costs, S):
    """The active splits' slots (sparse_mla_decode.h, decode_active_slots) in Python for S' = S:
    (first slot, count) per token, count = ceil(S' T c_t / C_T) up to 256 tokens and
    ceil(4 S' T c_t / (5 C_T)) above, in token order."""
    T, total = len(costs), sum(costs)
    num, den = (4, 5) if T > 256 else (1, 1)
    n = [max(1, min(256, -(-S * T * c * num // (total * den)))) for c in costs]
    return [(sum(n[:t]), n[t]) for t in range(T)]


@requires_gpu
@pytest.mark.parametrize("T,grid,full_pick", [(72, 8, 7), (300, 5, 4), (384, 4, 2), (512, 3, 1)])
def test_gpu_active_splits_follow_the_lengths(T, grid, full_pick):
    """An automatic count on the balanced map with a C128-wide set (8 heads x 72 / 300 / 384 / 512
    tokens x 8320 entries, lengths given) is a grid of 8 / 5 / 4 / 3 slots per token (on an H200),
    of which the kernels use as many as the rows' mean length asks for
    (decode_active_splits_table): token t takes ceil(S' T c_t / C_T) slots (ceil(4 S' T c_t /
    (5 C_T)) above 256 tokens, where a token of one slot is finished by its split block and writes
    no cell: the anchored map). Full rows, rows of ~550 entries with one full straggler and rows of
    0-2, and rows of 5,500-6,500 each match the float64 reference in the workspace the size query
    gives (NaN-poisoned), and the workspace cells written, and those holding an empty split's -inf,
    are exactly those of that map for one S' in 1..grid - 1 (full rows: the count the model picks
    for them, and then bit-identical to that explicit count, where that is more than one; within
    rounding above 256 tokens where Q.K may come from the gathered registers, decode_raw_qk). The same lengths replayed in a graph captured once give bit-identical
    results."""
    g = torch.Generator().manual_seed(35 + T)
    H, W, fmt = 8, 8320, "fp8_ds_mla_v4"
    _, idx_d, cache, q = _gpu_v4_long_rows(g, T, H, W, 6000, "none")
    sink = torch.randn(H, generator=g).cuda()
    short = torch.randint(450, 651, (T,), generator=g, dtype=torch.int32)
    short[5] = W
    short[7], short[9], short[11] = 0, 1, 2  # empty slots (-inf partial lse) where a row is short
    cases = {"full": torch.full((T,), W, dtype=torch.int32), "short": short,
             "long": torch.randint(5500, 6501, (T,), generator=g, dtype=torch.int32)}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    eager = {}
    for name, lengths in cases.items():
        len_d = lengths.cuda()
        out, lse, ws = poisoned_buffers(T, H, 0, "cuda")
        kw = dict(kv_format=fmt, softmax_scale=0.05, lengths=len_d, attn_sink=sink)
        mla_ext.sparse_mla_decode(q, cache, idx_d, output=out, workspace=ws, lse=lse, **kw)
        ref_o, ref_l = reference.sparse_mla_decode(q, cache, idx_d, **kw)
        assert_close_rel(out, ref_o, torch.bfloat16)
        check_lse(lse, ref_l.cpu())
        eager[name] = (out, lse)
        if sms == 132:  # decode_active_grid: min(8, 1024 / T) slots per token to 256 tokens, 1536 / T above
            N = T * grid
            out_bytes = (H * N * 512 * 4 + 255) // 256 * 256
            cells = ws[out_bytes:out_bytes + H * N * 4].view(torch.float32).view(H, N).cpu()
            written = ~torch.isnan(cells)
            costs = [max(1, min(int(n), W)) for n in lengths]
            maps = {}
            for s_active in range(1, grid):
                want = torch.zeros(N, dtype=torch.bool)
                for f, n in _active_map(costs, s_active):
                    # above 256 tokens (the anchored map) a token of one slot is finished by
                    # its split block: no cell written
                    want[f:f + n] = T <= 256 or n > 1
                maps[s_active] = want
            used = [s_active for s_active, want in maps.items() if (written == want).all()]
            assert len(used) == 1, (name, written.sum(1))
            # Each token's own slots (idle slots write nothing, so `written` is a prefix).
            empty = _empty_slots(_active_map(costs, used[0]), [max(0, min(int(x), W)) for x in lengths], N)
            assert (torch.isneginf(cells) == (empty & maps[used[0]])).all(), name
            # the partials of the cells not written stay poisoned too (the token map has a
            # section of its own after the lse cells)
            parts = ws[:H * N * 512 * 4].view(torch.float32).view(H, N, 512).cpu()
            assert torch.isnan(parts[(~maps[used[0]]).expand(H, N)]).all(), name
            if T > 256 and name == "short":  # tokens of one slot (rows of 0-2), finished without the reduce
                assert any(n == 1 for _, n in _active_map(costs, used[0]))
            if name == "full":  # the model's count for full rows (at 72 tokens: RESULTS.md, thirty-fifth session)
                assert used == [full_pick]
            if name == "full" and full_pick > 1:  # (one explicit split takes no reduce: not bitwise the same)
                out2, lse2, ws2 = poisoned_buffers(T, H, full_pick, "cuda")
                mla_ext.sparse_mla_decode(q, cache, idx_d, output=out2, workspace=ws2, lse=lse2,
                                          num_splits=full_pick, **kw)
                # Above 256 tokens the automatic count runs the anchored map. Its 16-head tile took
                # Q.K from the dequantised tile until a350e86, while the explicit count's kernel
                # took it from the gathered registers (decode_raw_qk: splits of >= 128 entries
                # unless MLA_EXT_RAWQK=0); both run RAW now, but the comparison stays within
                # rounding (the same values up to the order of Q.K's sums).
                if T > 256 and os.environ.get("MLA_EXT_RAWQK", "2") != "0" and W >= 128 * full_pick:
                    assert_close_rel(out2, out, torch.bfloat16)
                    assert (lse2.double() - lse.double()).abs().max().item() < 1e-3
                else:
                    assert torch.equal(out.view(torch.int16), out2.view(torch.int16))
                    assert torch.equal(lse.view(torch.int32), lse2.view(torch.int32))
    len_d = cases["full"].cuda()
    out, lse, ws = poisoned_buffers(T, H, 0, "cuda")
    graph = capture_decode_graph(q, cache, idx_d, dict(kv_format=fmt, softmax_scale=0.05, output=out, workspace=ws,
                                                       lse=lse, lengths=len_d, attn_sink=sink))
    for name in ("short", "full", "long", "short"):
        len_d.copy_(cases[name])
        poison_(out), poison_(lse), ws.fill_(0xFF)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), eager[name][0].view(torch.int16)), name
        assert torch.equal(lse.view(torch.int32), eager[name][1].view(torch.int32)), name


@requires_gpu
@pytest.mark.parametrize("batch,S", [(8, 16), (1, 64)])  # (1, 64): the reduce in column groups
def test_gpu_deterministic_with_poisoned_workspace(batch, S):
    inp = builders.build_decode_inputs("v4_c4", batch=batch, num_heads=64, device="cuda", seed=24)
    T, H = inp.num_tokens, inp.num_heads
    results = []
    for _ in range(2):
        out, lse, ws = poisoned_buffers(T, H, S, "cuda")
        mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, inp.indices, output=out, workspace=ws, lse=lse,
                                  num_splits=S, **inp.op_kwargs())
        results.append((out.clone(), lse.clone()))
    assert torch.equal(results[0][0].view(torch.int16), results[1][0].view(torch.int16))
    assert torch.equal(results[0][1].view(torch.int32), results[1][1].view(torch.int32))
    ref_o, _ = inp.reference()
    assert_close_rel(results[0][0], ref_o, torch.bfloat16)


@requires_gpu
@pytest.mark.parametrize("kind,topk,heads,batch,h200_splits,hopper_splits",
                         [("v32", 2048, 8, 96, 8, 4), ("v32", 2048, 16, 64, 4, 2), ("v32", 2048, 16, 28, 9, 4),
                          ("v4_c4", 1024, 16, 140, 3, 3)])
def test_gpu_balance_model_counts(kind, topk, heads, batch, h200_splits, hopper_splits):
    """Calls whose automatic split count comes from the policy's balance model
    (decode_balance_splits: V3.2 8 heads x 96 tokens and C4 Pro 16 heads x 140 tokens take 8 and
    3 splits on a 132-processor GPU, where the wave count took 2 and 1; on Hopper, where V3.2's
    wide 16-head splits run one block per processor, decode_wide16_splits gives V3.2 4, 2 and 4 at
    8 x 96, 16 x 64 and 16 x 28, the last below the balance model's range, where the wave count
    gives 9) fit the workspace the size query gives for their shape (poisoned) and
    match the float64 reference; on a 132-processor GPU the result is bit-identical to the
    explicit count the policy is meant to pick there, and with the mma.sync tile forced (no
    one-block tile) to the balance model's count. Where the profiler names kernels on an sm_90a
    build, the V3.2 calls ran the one-block tile (A16) the counts are made for, unless forced off."""
    inp = builders.build_decode_inputs(kind, batch=batch, num_heads=heads, context_len=(4096, 8192), topk=topk,
                                       device="cuda", seed=34)
    T = inp.num_tokens
    props = torch.cuda.get_device_properties(0)
    hopper = props.major == 9 and asym16_env_mode() != 0
    forced = (False, True) if props.multi_processor_count == 132 else (False,)
    ref_o, ref_l = inp.reference(dtype=torch.float64)
    for force_mma_sync in forced:
        with gpu_path(mma_sync=force_mma_sync):
            out, lse, ws = poisoned_buffers(T, heads, 0, "cuda")
            names = _split_kernel_names(lambda: mla_ext.sparse_mla_decode(
                inp.q, inp.kv_cache, inp.indices, output=out, workspace=ws, lse=lse, num_splits=0, **inp.op_kwargs()))
            check_out(out, ref_o.cpu(), inp.kv_format)
            check_lse(lse, ref_l.cpu(), kv_format=inp.kv_format)
            if names and _wgmma_kernel_expected():
                want = hopper and not force_mma_sync and kind == "v32"
                assert any(re.search(A16_KERNEL, n) for n in names) == want, (force_mma_sync, names)
            if props.multi_processor_count == 132:
                S = hopper_splits if hopper and not force_mma_sync else h200_splits
                out2, lse2, ws2 = poisoned_buffers(T, heads, S, "cuda")
                mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, inp.indices, output=out2, workspace=ws2, lse=lse2,
                                          num_splits=S, **inp.op_kwargs())
                assert torch.equal(out.view(torch.int16), out2.view(torch.int16)), (force_mma_sync, S)
                assert torch.equal(lse.view(torch.int32), lse2.view(torch.int32)), (force_mma_sync, S)


def asym16_env_mode() -> int:
    """MLA_EXT_ASYM16 as the library reads it (env_int: strtol with base 0, so 0x hex and 0-led
    octal; unset, empty or not an integer: the default 2)."""
    v = os.environ.get("MLA_EXT_ASYM16", "").strip()
    for pattern, base in ((r"[+-]?0[xX][0-9a-fA-F]+", 16), (r"[+-]?0[0-7]*", 8), (r"[+-]?[1-9][0-9]*", 10)):
        if re.fullmatch(pattern, v):
            return int(v, base)
    return 2


@requires_gpu
def test_gpu_cache_over_2gib():
    free, _ = torch.cuda.mem_get_info()
    ps = 64
    page_bytes = formats.default_v4_page_stride(ps)
    num_pages = (2**31 + 2**28) // page_bytes + 1
    if free < num_pages * page_bytes + 2**30:
        pytest.skip("not enough GPU memory for a > 2 GiB cache")
    g = torch.Generator().manual_seed(25)
    T, H = 3, 16
    num_slots = num_pages * ps
    idx = torch.randint(num_slots - 3 * ps, num_slots, (T, 100), generator=g, dtype=torch.int32)
    idx[:, :3] = torch.tensor([0, 1, num_slots - 1], dtype=torch.int32)
    buf = torch.full((num_pages * page_bytes,), 0xFF, dtype=torch.uint8, device="cuda")
    cache = buf.as_strided((num_pages, ps, 584), (page_bytes, 584, 1), 0)
    slots = torch.unique(idx.reshape(-1).long())
    formats.write_kv_rows(cache, "fp8_ds_mla_v4", slots.cuda(), torch.randn(slots.numel(), 512, generator=g).cuda())
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    out, lse, ws = poisoned_buffers(T, H, 0, "cuda")
    mla_ext.sparse_mla_decode(q.cuda(), cache, idx.cuda(), kv_format="fp8_ds_mla_v4", softmax_scale=0.05,
                              output=out, workspace=ws, lse=lse)
    # reference on the selected rows only (gathered on the GPU)
    ref_o, ref_l = reference.sparse_mla_decode(q.cuda(), cache, idx.cuda(), kv_format="fp8_ds_mla_v4",
                                               softmax_scale=0.05)
    assert_close_rel(out, ref_o, torch.bfloat16)
    check_lse(lse, ref_l.cpu())


@pytest.mark.parametrize("name", ["output", "workspace", "lse", "q"])
def test_meta_and_real_tensors_mixed_raise(name):
    """A meta tensor among real ones dispatches to the fake implementation: it must raise too."""
    a = _valid("cpu")
    a[name] = a[name].to("meta")
    out, lse = a["output"], a["lse"]
    with pytest.raises(RuntimeError, match=f"{name}.*same device|same device.*{name}"):
        mla_ext.sparse_mla_decode(**a)
    for t in (out, lse):
        if t.device.type == "cpu":
            assert t.isnan().all()


@pytest.mark.parametrize("num_splits", [0, 1])
def test_cpu_lse_of_a_very_wide_row_stays_exact(num_splits):
    """300,000 entries of one token (four cache rows, each selected ~75,000 times): the CPU
    kernel sums each chunk's weights (and P.V) on their own before adding them to the running
    values, so the lse stays within a few 1e-6 of float64 (summed row by row into the running
    value it drifted to 3e-4 here, and 1.2e-3 over 1024 such tokens)."""
    g = torch.Generator().manual_seed(131)
    cache = torch.randn(2, 2, 512, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 4, (1, 300_000), generator=g, dtype=torch.int32)
    q = torch.randn(1, 2, 512, generator=g).to(torch.bfloat16)
    out, lse = torch.full((1, 2, 512), float("nan"), dtype=torch.bfloat16), torch.full((1, 2), float("nan"))
    ws = torch.empty(ws_size(1, 2, num_splits, "cpu"), dtype=torch.uint8)
    mla_ext.sparse_mla_decode(q, cache, idx, kv_format="bf16", softmax_scale=0.05, output=out, workspace=ws,
                              lse=lse, num_splits=num_splits)
    K = cache.view(4, 512).double()
    count = torch.bincount(idx[0].long(), minlength=4).double()
    s = 0.05 * (q[0].double() @ K.T)
    m = s.max(1).values
    p = (s - m[:, None]).exp() * count
    want_out, want_lse = (p @ K) / p.sum(1)[:, None], m + p.sum(1).log()
    assert (lse[0].double() - want_lse).abs().max().item() < 5e-5
    assert_close_rel(out[0], want_out, torch.bfloat16)
