"""The GPU launchers and portable kernels run on the CPU through the SIMT emulator
(tests/simt/simt_emu.h, bound by tests/simt_capi.py): with 64-lane wavefronts, the code an AMD
GPU runs (compat.h's HIP branch), and with 32-lane warps, NVIDIA's portable kernels. Without a
GPU these paths were only compiled before. Each call is checked against the float64 reference
on poisoned outputs and a NaN-filled workspace, and repeated with the threads of every block in
reverse and shuffled order: a result that changes with the order is a race (shared or global
memory read without a barrier after another thread's write). The emulator's own checks
(divergent collectives, races, unwritten shared memory) are tested on small kernels of their own
(tests/simt/selftest.cpp). Last, the warp-64 cases run again in a child process with
AddressSanitizer (a read or write outside the caller's tensors or the workspace stops it).

A kernel that crashes on the CPU (a read past a guard page, an integer division by zero, which a
GPU does not trap) takes the test process down with it: the run fails without a report.

Needs a host C++17 compiler (CXX, default g++); each library builds once per source state
(~10 s) into the temporary directory.
"""
import ctypes as C
import os
import subprocess
import sys

import pytest
import torch

from mla_ext import reference
from conftest import assert_close_rel, poison_
from test_sparse_mla_decode import check_inf_score_case, make_cache, make_indices, make_inf_score_case, make_sink
import simt_capi

pytestmark = pytest.mark.skipif(simt_capi.compiler() is None, reason="needs a host C++ compiler (CXX / g++)")

INF = float("inf")
WARPS = [64, 32]
# (order, seed) besides the forward order: reversed; shuffled. Not again under AddressSanitizer
# (the memcheck run below), where the order does not change what is read.
ORDERS = [] if simt_capi.ASAN else [(1, 1), (2, 7)]


@pytest.fixture(scope="module", params=WARPS, ids=lambda w: f"warp{w}")
def lib(request):
    return simt_capi.library(request.param)


@pytest.fixture(scope="module", params=WARPS, ids=lambda w: f"warp{w}")
def selftest(request):
    return request.param, simt_capi.selftest_library(request.param)


# ---------------------------------------------------------------------------------------------
# the emulator's own checks
# ---------------------------------------------------------------------------------------------

def test_collectives_match_hip_semantics(selftest):
    warp, st = selftest
    threads = 4 * warp
    out = torch.full((2 * 4,), float("nan"))
    out64 = torch.zeros(4, dtype=torch.int64)
    simt_capi.configure(st, 0)
    assert st.simt_collectives(C.c_void_p(out.data_ptr()), C.c_void_p(out64.data_ptr()), threads) == 0
    assert out[:4].tolist() == [warp * (warp - 1) / 2] * 4  # the butterfly sums every lane
    assert out[4:].tolist() == [50.0] * 4  # lane 5's value, broadcast
    want = sum(1 << lane for lane in range(warp) if lane % 3 == 0)
    got = [int(x) & ((1 << 64) - 1) for x in out64.tolist()]
    assert got == [want] * 4


@pytest.mark.parametrize("kernel", ["simt_divergent_shuffle", "simt_divergent_barrier", "simt_split_sites"])
def test_divergent_collectives_are_refused(selftest, kernel):
    warp, st = selftest
    out = torch.zeros(2 * warp)
    simt_capi.configure(st, 0)
    assert getattr(st, kernel)(C.c_void_p(out.data_ptr()), 2 * warp) == 3  # kLaunchFailed
    assert b"divergent" in st.mla_ext_simt_last_error()


def test_a_missing_barrier_shows_as_order_dependence(selftest):
    warp, st = selftest
    blocks, threads = 3, 2 * warp
    results = {}
    for race in (0, 1):
        for order, seed in [(0, 1), *ORDERS]:
            out = torch.full((blocks * threads,), float("nan"))
            simt_capi.configure(st, order, seed)
            assert st.simt_neighbour(C.c_void_p(out.data_ptr()), blocks, threads, race) == 0
            results[(race, order)] = out
    want = torch.tensor([float((t + 1) % threads + 1000 * b) for b in range(blocks) for t in range(threads)])
    for order in (0, 1, 2):
        assert torch.equal(results[(0, order)], want)
    assert not all(torch.equal(results[(1, 0)], results[(1, o)]) for o in (1, 2))


def test_a_race_between_warps_across_a_shuffle_shows(selftest):
    """Warps run one at a time between barriers, so a collective does not hide a race between
    warps (lane 0 of warp w reads what lane 0 of warp w + 1 writes, a reduction in between)."""
    warp, st = selftest
    threads = 4 * warp
    results = {}
    for race in (0, 1):
        for order, seed in [(0, 1), *ORDERS]:
            out = torch.full((4,), float("nan"))
            simt_capi.configure(st, order, seed)
            assert st.simt_cross_warp(C.c_void_p(out.data_ptr()), threads, race) == 0
            results[(race, order)] = out
    for order in (0, 1, 2):
        assert results[(0, order)].tolist() == [2.0, 3.0, 4.0, 1.0]
    assert not all(torch.equal(results[(1, 0)], results[(1, o)]) for o in (1, 2))


def test_static_shared_memory_is_poisoned_per_block(selftest):
    warp, st = selftest
    blocks, threads = 3, warp
    out = torch.zeros(blocks * threads)
    simt_capi.configure(st, 0)
    assert st.simt_static_smem(C.c_void_p(out.data_ptr()), blocks, threads) == 0
    assert (out[:threads] == 7).all() and torch.isnan(out[threads:]).all()


def test_a_read_past_dynamic_shared_memory_faults(selftest):
    warp, _ = selftest
    code = ("import ctypes as C, torch, simt_capi; st = simt_capi.selftest_library(%d); "
            "out = torch.zeros(%d); st.simt_dynamic_smem_overrun(C.c_void_p(out.data_ptr()), %d)" % (warp, warp, warp))
    r = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.abspath(__file__)),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == -11, (r.returncode, r.stderr[-2000:])  # SIGSEGV at the guard page


def test_unwritten_shared_memory_reads_as_nan(selftest):
    warp, st = selftest
    out = torch.zeros(warp)
    simt_capi.configure(st, 0)
    assert st.simt_unwritten_smem(C.c_void_p(out.data_ptr()), warp) == 0
    assert (out[0::2] == 1).all() and torch.isnan(out[1::2]).all()


# ---------------------------------------------------------------------------------------------
# sparse_mla_decode
# ---------------------------------------------------------------------------------------------

# fmt, d_qk, H, T, W, invalid, lengths, sink, splits (0 = automatic), extra (width, page size),
# head_tile (0 = automatic), CUs. Chosen to reach every portable head tile (16 / 32 / 64 heads),
# each reduce form (per-thread scan with batches of 2 / 4 / 8, block scan, column groups in 1, 2
# and, with 32-lane warps, 4 column chunks), both geometries, all five cache formats, main-only
# and two-set calls, sinks of every kind, empty rows, and the CU counts of a small GPU and of an
# MI300X (304). EXPECT: the kernels a case must launch, where the launcher's choice is not left
# to the policy (forced head tiles, explicit split counts); {chunks} is the reduce's most column
# chunks (4 with 32-lane warps, 2 with 64).
DECODE_CASES = [
    ("fp8_ds_mla_v4", 512, 1, 3, 70, "scattered", "random", "random", 0, (64, 2), 0, 8),
    ("fp8_ds_mla_v4", 512, 16, 2, 128, "trailing", None, None, 2, None, 0, 8),
    ("fp8_ds_mla_v4", 512, 17, 2, 64, "leading", "zeros", "mixed", 3, (40, 64), 0, 8),
    ("fp8_ds_mla_v4", 512, 64, 1, 96, "middle", "random", "-inf", 4, None, 0, 8),
    ("fp8_ds_mla_v4", 512, 128, 1, 64, "all_rows", None, "+inf", 1, (64, 2), 0, 304),
    ("fp8_ds_mla_v4", 512, 40, 2, 80, "scattered", "random", "random", 2, None, 16, 8),
    ("fp8_ds_mla_v4", 512, 40, 2, 80, "scattered", "random", "random", 2, None, 32, 8),
    ("fp8_ds_mla_v4", 512, 40, 2, 80, "scattered", "random", "random", 2, None, 64, 8),
    ("fp8_ds_mla_v4_fnuz", 512, 8, 4, 80, "scattered", "random", "random", 0, (64, 64), 0, 8),
    ("fp8_ds_mla", 576, 16, 2, 128, "scattered", None, None, 0, None, 0, 8),
    ("fp8_ds_mla", 576, 5, 3, 100, "middle", "random", None, 3, None, 0, 8),
    ("fp8_ds_mla", 576, 32, 1, 64, "leading", "zeros", None, 20, None, 0, 8),
    ("fp8_ds_mla", 576, 128, 2, 64, "scattered", None, None, 0, None, 0, 304),
    ("fp8_ds_mla", 576, 64, 1, 70, "scattered", "random", None, 2, None, 64, 8),
    ("fp8_ds_mla_fnuz", 576, 16, 2, 90, "trailing", None, None, 2, None, 0, 8),
    ("bf16", 576, 3, 5, 50, "scattered", "random", None, 0, None, 0, 8),
    ("bf16", 576, 40, 2, 64, "middle", None, None, 2, None, 32, 8),
    ("bf16", 512, 3, 1, 200, None, None, "random", 40, None, 0, 8),
    ("bf16", 512, 5, 1, 150, "trailing", "random", None, 40, None, 0, 8),
    ("bf16", 512, 1, 1, 300, "scattered", None, None, 65, None, 0, 64),
    ("bf16", 512, 64, 2, 64, "middle", "random", "random", 0, (64, 16), 0, 304),
]
_SPLIT = "decode_split_portable_kernel<{}, {}, (mla_ext::KvFormat){}, false, false>"
_REDUCE = "decode_reduce_kernel<{}>"
EXPECT = {
    1: [_REDUCE.format("false, 2, false, 1, 1")],
    3: [_REDUCE.format("false, 4, false, 1, 1")],
    5: [_SPLIT.format(1, 512, 2), _REDUCE.format("false, 2, false, 1, 1")],
    6: [_SPLIT.format(2, 512, 2)],
    7: [_SPLIT.format(4, 512, 2)],
    11: [_REDUCE.format("true, 8, false, 1, 1")],
    13: [_SPLIT.format(4, 576, 1)],
    16: [_SPLIT.format(2, 576, 0)],
    17: [_REDUCE.format("true, 8, true, 2, 1")],
    18: [_REDUCE.format("true, 8, true, 1, 1")],
    19: [_REDUCE.format("true, 8, true, {chunks}, 1")],
}


def _decode_inputs(case, seed):
    fmt, d_qk, H, T, W, invalid, lengths_mode, sink_mode, S, extra, head_tile, cus = case
    g = torch.Generator().manual_seed(seed)
    page_size, num_pages = 64, 6
    idx, lengths = make_indices(g, T, W, num_pages * page_size, invalid, lengths_mode)
    inp = dict(q=torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16),
               kv_cache=make_cache(g, fmt, d_qk, num_pages, page_size, idx, "cpu"), indices=idx,
               kv_format=fmt, softmax_scale=d_qk ** -0.5 * 1.5, lengths=lengths,
               attn_sink=make_sink(g, H, sink_mode))
    if extra is not None:
        w2, ps2 = extra
        pages2 = max(2, 256 // ps2)
        eidx, elen = make_indices(g, T, w2, pages2 * ps2, "scattered", "random")
        inp.update(extra_kv_cache=make_cache(g, fmt, d_qk, pages2, ps2, eidx, "cpu"), extra_indices=eidx,
                   extra_lengths=elen)
    return inp, S, head_tile, cus


def _decode_reference(inp):
    return reference.sparse_mla_decode(
        inp["q"], inp["kv_cache"], inp["indices"], kv_format=inp["kv_format"], softmax_scale=inp["softmax_scale"],
        lengths=inp["lengths"], extra_kv_cache=inp.get("extra_kv_cache"), extra_indices=inp.get("extra_indices"),
        extra_lengths=inp.get("extra_lengths"), attn_sink=inp["attn_sink"])


def _check_launched(lib, before, expected):
    """Each of `expected` (signature parts) names a kernel launched since `before` (kernels())."""
    after = simt_capi.kernels(lib)
    ran = [k for k, n in after.items() if n > before.get(k, 0)]
    chunks = 4 if lib.mla_ext_simt_warp_size() == 32 else 2
    for e in expected:
        e = e.format(chunks=chunks)
        assert any(e in k for k in ran), f"{e} not launched; launched: {ran}"


def _check_orders(lib, inp, S, head_tile, cus, out, lse, orders=None):
    """The call again in each of `orders` (default ORDERS): bit-identical output and lse."""
    for order, seed in ORDERS if orders is None else orders:
        o2, l2, _ = _run_decode(lib, inp, S, head_tile, cus, order, seed)
        assert torch.equal(o2.view(torch.int16), out.view(torch.int16)), f"output differs in thread order {order}"
        assert torch.equal(l2.view(torch.int32), lse.view(torch.int32)), f"lse differs in thread order {order}"


def _run_decode(lib, inp, S, head_tile, cus, order=0, seed=1):
    T, H = inp["q"].shape[:2]
    out = poison_(torch.empty(T, H, 512, dtype=torch.bfloat16))
    lse = poison_(torch.empty(T, H))
    ws = torch.full((max(16, simt_capi.decode_workspace_bytes(lib, T, H, S, cus)),), 0xFF, dtype=torch.uint8)
    simt_capi.configure(lib, order, seed, cus)
    simt_capi.sparse_mla_decode(lib, output=out, workspace=ws, lse=lse, num_splits=S, head_tile=head_tile, num_cus=cus,
                                **inp)
    return out, lse, ws


def _check_token_map(lib, inp, S, head_tile, cus, out, ws, required=False):
    """The token map a _run_decode call left in its workspace ws (the balanced map's, built
    with block-wide scans of the rows' costs) equals the host's, built with plain sums
    (tests/simt/capi_probes.cpp): a wrong scan keeps the output right and only loses balance."""
    maps = simt_capi.token_map(lib, ws, output=out, num_splits=S, head_tile=head_tile, num_cus=cus, **inp)
    assert maps is not None or not required, "the call ran no token map"
    if maps is not None:
        kernel, host = maps
        assert torch.equal(kernel, host), f"token map differs from the host's:\n{kernel.T}\n{host.T}"


def _check_decode(out, lse, ref_o, ref_l, fmt):
    out_tol, lse_tol = reference.decode_tolerances("cuda", fmt)
    assert not torch.isnan(out).any(), "output: NaN (an element not written, or a wrong one)"
    err = ((out.double() - ref_o).abs().max() / ref_o.abs().max().clamp_min(1e-30)).item()
    assert err <= out_tol, f"output: max error {err:.3g} of max |ref| > {out_tol}"
    assert not torch.isnan(lse).any(), "lse: NaN"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_l)), "lse: -inf pattern differs from the reference"
    assert reference.lse_error(lse, ref_l) <= lse_tol


@pytest.mark.parametrize("i", range(len(DECODE_CASES)),
                         ids=[f"{c[0]}-H{c[2]}-T{c[3]}-W{c[4]}-S{c[8]}-ht{c[10]}" for c in DECODE_CASES])
def test_decode(lib, i):
    inp, S, head_tile, cus = _decode_inputs(DECODE_CASES[i], seed=100 + i)
    ref_o, ref_l = _decode_reference(inp)
    before = simt_capi.kernels(lib)
    out, lse, _ = _run_decode(lib, inp, S, head_tile, cus)
    _check_decode(out, lse, ref_o, ref_l, inp["kv_format"])
    _check_launched(lib, before, EXPECT.get(i, []))
    _check_orders(lib, inp, S, head_tile, cus, out, lse)


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "bf16"])
@pytest.mark.parametrize("S,head_tile", [(1, 0), (3, 0), (5, 16)])
def test_decode_inf_scores(lib, fmt, S, head_tile):
    """The portable kernels on scores of -inf and +inf (test_sparse_mla_decode's
    make_inf_score_case): -inf rows weigh 0 wherever they sit, a row of only -inf scores gives
    output 0 and lse -inf, a +inf score NaN, as the CPU twin and the reference."""
    q, cache, idx, sink = make_inf_score_case(fmt)
    inp = dict(q=q, kv_cache=cache, indices=idx, kv_format=fmt, softmax_scale=0.05, attn_sink=sink)
    ref_o, ref_l = reference.sparse_mla_decode(q, cache, idx, kv_format=fmt, softmax_scale=0.05, attn_sink=sink)
    out, lse, _ = _run_decode(lib, inp, S, head_tile, 8)
    check_inf_score_case(out, lse, ref_o, ref_l, fmt)


@pytest.mark.parametrize("S", [0, 6], ids=["auto", "S6"])
@pytest.mark.parametrize("T", [6, 12])
def test_decode_balanced_split_map(lib, T, S):
    """A V4 C128-like call (window of 128 + 4096 compressed rows with lengths, 8 heads, automatic
    splits on 8 CUs, or 6 per token): the balanced split map deals the splits by the rows'
    lengths, one straggler with all 4096 and the rest short, so its token map and the reduce over
    a token's many splits run. Automatic counts use a grid's slots by a table of the rows'
    lengths (decode_active_splits_table), given ones the map of F(t) (sparse_mla_decode.h)."""
    g = torch.Generator().manual_seed(T)
    H, fmt = 8, "fp8_ds_mla_v4"
    idx, _ = make_indices(g, T, 128, 4 * 64, None, None)
    lengths = torch.randint(1, 129, (T,), dtype=torch.int32, generator=g)
    eidx = torch.randint(0, 2048 * 2, (T, 4096), generator=g, dtype=torch.int32)
    elen = torch.randint(0, 400, (T,), dtype=torch.int32, generator=g)
    elen[1] = 4096
    inp = dict(q=torch.randn(T, H, 512, generator=g).to(torch.bfloat16),
               kv_cache=make_cache(g, fmt, 512, 4, 64, idx, "cpu"), indices=idx, kv_format=fmt,
               softmax_scale=512 ** -0.5, lengths=lengths,
               extra_kv_cache=make_cache(g, fmt, 512, 2048, 2, eidx, "cpu"), extra_indices=eidx,
               extra_lengths=elen, attn_sink=make_sink(g, H, "random"))
    assert simt_capi.library(64).mla_ext_sparse_mla_decode_num_splits(T, H, 128 + 4096, 8) >= 2
    ref_o, ref_l = _decode_reference(inp)
    out, lse, ws = _run_decode(lib, inp, S, 0, 8)
    _check_decode(out, lse, ref_o, ref_l, fmt)
    _check_token_map(lib, inp, S, 0, 8, out, ws, required=True)
    _check_orders(lib, inp, S, 0, 8, out, lse)


@pytest.mark.parametrize("fmt,with_lengths", [("bf16", True), ("fp8_ds_mla_v4", False), ("fp8_ds_mla_v4", True)],
                         ids=["bf16", "v4-no-lengths", "v4-lengths"])
def test_decode_num_splits_for_is_the_decodes_count(lib, fmt, with_lengths):
    """mla_ext_sparse_mla_decode_num_splits_for reads the call, not only its widths: 6 tokens x 8
    heads of 128 + 4096 entries on 8 CUs take 2 splits where the call cannot use the balanced map
    (a bf16 cache, or V4 rows without lengths), while the width-only query, which assumes V4 rows
    with lengths, says 8; with lengths the two agree. Where the map is uniform, the decode with
    num_splits = 0 runs that count: output and lse bit-identical to an explicit call with it, and
    not to one with the width-only query's count."""
    g = torch.Generator().manual_seed(64)
    T, H, cus = 6, 8, 8
    idx, _ = make_indices(g, T, 128, 4 * 64, None, None)
    eidx = torch.randint(0, 2048 * 2, (T, 4096), generator=g, dtype=torch.int32)
    inp = dict(q=torch.randn(T, H, 512, generator=g).to(torch.bfloat16),
               kv_cache=make_cache(g, fmt, 512, 4, 64, idx, "cpu"), indices=idx, kv_format=fmt,
               softmax_scale=512 ** -0.5, lengths=None, extra_kv_cache=make_cache(g, fmt, 512, 2048, 2, eidx, "cpu"),
               extra_indices=eidx, extra_lengths=None, attn_sink=make_sink(g, H, "random"))
    if with_lengths:
        inp["lengths"] = torch.randint(1, 129, (T,), dtype=torch.int32, generator=g)
        inp["extra_lengths"] = torch.randint(1, 4097, (T,), dtype=torch.int32, generator=g)
    width_only = lib.mla_ext_sparse_mla_decode_num_splits(T, H, 128 + 4096, cus)
    out0 = torch.empty(T, H, 512, dtype=torch.bfloat16)
    S = simt_capi.num_splits_for(lib, num_cus=cus, output=out0, **inp)
    assert width_only == 8
    assert S == (8 if fmt == "fp8_ds_mla_v4" and with_lengths else 2)
    # given counts come back as they are; a count the decode refuses gives 0
    assert simt_capi.num_splits_for(lib, num_cus=cus, output=out0, num_splits=5, **inp) == 5
    assert simt_capi.num_splits_for(lib, num_cus=cus, output=out0, num_splits=257, **inp) == 0
    assert simt_capi.num_splits_for(lib, num_cus=1 << 17, output=out0, num_splits=5, **inp) == 0
    if S == width_only:
        return  # (the balanced map: its automatic calls use the slots the lengths ask for)
    ref_o, ref_l = _decode_reference(inp)
    out_a, lse_a, _ = _run_decode(lib, inp, 0, 0, cus)
    _check_decode(out_a, lse_a, ref_o, ref_l, fmt)
    out_s, lse_s, _ = _run_decode(lib, inp, S, 0, cus)
    assert torch.equal(out_a.view(torch.int16), out_s.view(torch.int16)) and torch.equal(lse_a, lse_s)
    out_w, lse_w, _ = _run_decode(lib, inp, width_only, 0, cus)
    assert not (torch.equal(out_a.view(torch.int16), out_w.view(torch.int16)) and torch.equal(lse_a, lse_w))


@pytest.mark.parametrize("H", [8, 18])  # 18: a last reduce block of 2 of its 4 heads
def test_decode_anchored_map(lib, H):
    """Past 256 tokens a balanced V4 call runs the anchored map (a token's first split block knows
    its token before the map's sums; a token of one split is finished in the split kernel), at
    17-128 heads with the reduce's 4 heads per block: 260 tokens of short rows and two stragglers."""
    T, fmt = 260, "fp8_ds_mla_v4"
    g = torch.Generator().manual_seed(H)
    idx = torch.randint(0, 4 * 64, (T, 8), generator=g, dtype=torch.int32)
    lengths = torch.randint(0, 9, (T,), dtype=torch.int32, generator=g)
    eidx = torch.randint(0, 2048 * 2, (T, 4096), generator=g, dtype=torch.int32)
    elen = torch.randint(0, 6, (T,), dtype=torch.int32, generator=g)
    elen[7], elen[200] = 4096, 1500
    inp = dict(q=torch.randn(T, H, 512, generator=g).to(torch.bfloat16),
               kv_cache=make_cache(g, fmt, 512, 4, 64, idx, "cpu"), indices=idx, kv_format=fmt,
               softmax_scale=512 ** -0.5, lengths=lengths,
               extra_kv_cache=make_cache(g, fmt, 512, 2048, 2, eidx, "cpu"), extra_indices=eidx,
               extra_lengths=elen, attn_sink=make_sink(g, H, "random"))
    ref_o, ref_l = _decode_reference(inp)
    before = simt_capi.kernels(lib)
    out, lse, ws = _run_decode(lib, inp, 0, 0, 8)
    _check_decode(out, lse, ref_o, ref_l, fmt)
    _check_token_map(lib, inp, 0, 0, 8, out, ws, required=True)
    _check_launched(lib, before, [", (mla_ext::KvFormat)2, true, true>"] +
                    ([_REDUCE.format("false, 8, false, 1, 4")] if H > 16 else []))
    _check_orders(lib, inp, 0, 0, 8, out, lse, ORDERS[:1])


@pytest.mark.parametrize("fmt,d_qk", [("bf16", 512), ("fp8_ds_mla", 576)])
@pytest.mark.parametrize("S", [1, 3])
def test_decode_nan_in_q_and_in_a_selected_row(lib, fmt, d_qk, S):
    """A NaN in a selected row's key makes NaN the output and lse of every head of the tokens that
    select it (and only those); a NaN in q those of its own token and head."""
    g = torch.Generator().manual_seed(S)
    T, H, W = 3, 16, 80
    idx = torch.randperm(6 * 64, generator=g)[:T * W].to(torch.int32).reshape(T, W)  # no slot in two rows
    cache = make_cache(g, fmt, d_qk, 6, 64, idx, "cpu")
    slot = int(idx[0, 50])
    if fmt == "bf16":
        cache.view(-1, d_qk)[slot, 3] = float("nan")
    else:
        cache.view(-1, cache.shape[-1])[slot, 3] = 0x7F  # an e4m3fn NaN in the latent part
    q = torch.randn(T, H, d_qk, generator=g).to(torch.bfloat16)
    q[2, 5, 7] = float("nan")
    inp = dict(q=q, kv_cache=cache, indices=idx, kv_format=fmt, softmax_scale=d_qk ** -0.5, lengths=None,
               attn_sink=None)
    ref_o, ref_l = _decode_reference(inp)
    out, lse, _ = _run_decode(lib, inp, S, 0, 8)
    nan_rows = torch.zeros(T, H, dtype=torch.bool)
    nan_rows[0] = True
    nan_rows[2, 5] = True
    assert torch.equal(torch.isnan(ref_l), nan_rows)  # the reference agrees on where NaN goes
    assert torch.isnan(out[nan_rows].float()).all() and torch.isnan(lse[nan_rows]).all()
    keep = ~nan_rows
    _check_decode(out[keep].unsqueeze(0), lse[keep].unsqueeze(0), ref_o[keep].unsqueeze(0),
                  ref_l[keep].unsqueeze(0), fmt)


def test_decode_steep_scores_in_late_splits(lib):
    """40 splits of one row whose largest score (by ~350 nats) sits in split 39: the block-scan
    reduce's max must cover every split's lse (a max over 32 lanes of a 64-lane warp would miss
    it, and exp of the difference would overflow)."""
    g = torch.Generator().manual_seed(8)
    fmt, W = "bf16", 400
    idx = torch.randperm(8 * 64, generator=g)[:W].to(torch.int32).reshape(1, W)
    cache = make_cache(g, fmt, 512, 8, 64, idx, "cpu")
    q = torch.randn(1, 1, 512, generator=g).to(torch.bfloat16)
    cache.reshape(-1, 512)[idx[0, W - 5].long()] = q[0, 0]  # its score |q|^2 ~ 500: ~350 above any other row's
    inp = dict(q=q, kv_cache=cache, indices=idx, kv_format=fmt, softmax_scale=1.0, lengths=None, attn_sink=None)
    ref_o, ref_l = _decode_reference(inp)
    before = simt_capi.kernels(lib)
    out, lse, _ = _run_decode(lib, inp, 40, 0, 8)
    _check_decode(out, lse, ref_o, ref_l, fmt)
    _check_launched(lib, before, [_REDUCE.format("true, 8, true, {chunks}, 1")])


def test_decode_bad_input_is_refused_before_any_launch(lib):
    inp, S, head_tile, cus = _decode_inputs(DECODE_CASES[1], seed=3)
    T, H = inp["q"].shape[:2]
    out = poison_(torch.empty(T, H, 512, dtype=torch.bfloat16))
    before = simt_capi.counters(lib)["launches"]
    with pytest.raises(simt_capi.SimtError, match="workspace"):
        simt_capi.sparse_mla_decode(lib, output=out, workspace=torch.empty(16, dtype=torch.uint8), num_splits=3,
                                    num_cus=cus, **inp)
    assert simt_capi.counters(lib)["launches"] == before
    assert torch.isnan(out.float()).all()


# ---------------------------------------------------------------------------------------------
# merge_attn_states, merge_attn_states_n
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("head_size", [1, 5, 48, 128, 512])
@pytest.mark.parametrize("layout", ["contiguous", "padded_strided"])
def test_merge(lib, dtype, head_size, layout):
    g = torch.Generator().manual_seed(head_size * 7 + len(layout))
    # padded_strided: token-major LSEs and 13 tokens, so the kernel takes its token tiles of 8
    # (a full tile and a partial one)
    T, H, D = (7 if layout == "contiguous" else 13), 3, head_size
    if layout == "contiguous":
        po, so = (torch.randn(T, H, D, generator=g).to(dtype) for _ in range(2))
        out_buf = poison_(torch.empty(T, H, D, dtype=dtype))
        out = out_buf
        pl, sl = (torch.randn(T, H, generator=g) * 3 for _ in range(2))
        ol = poison_(torch.empty(T, H))
    else:  # [..., :D] views of [T, H, D + 64], output a token-offset view of a [T + 2, H * D] buffer,
        # LSEs as transposed views of [H, T] buffers (vLLM's layout)
        po, so = (torch.randn(T, H, D + 64, generator=g).to(dtype)[..., :D] for _ in range(2))
        out_buf = poison_(torch.empty(T + 2, H * D, dtype=dtype))
        out = out_buf[1:T + 1].view(T, H, D)
        pl, sl = (torch.randn(H, T, generator=g).mul(3).t() for _ in range(2))
        ol_buf = poison_(torch.empty(H, T + 3))
        ol = ol_buf[:, 1:T + 1].t()
    # token 0: prefix empty (+inf) with NaN values; token 1: suffix empty (-inf) with NaN values;
    # token 2: both empty; token 3: NaN LSE on the prefix
    pl[0, :] = INF
    po[0] = float("nan")
    sl[1, :] = -INF
    so[1] = float("nan")
    pl[2, :], sl[2, :] = -INF, INF
    pl[3, 1] = float("nan")
    ref_o, ref_l = reference.merge_attn_states(po, pl, so, sl)
    simt_capi.configure(lib, 0)
    simt_capi.merge_attn_states(lib, out, ol, po, pl, so, sl)
    nan_rows = torch.isnan(ref_o)
    assert torch.equal(torch.isnan(out.double()), nan_rows)
    assert_close_rel(out.masked_fill(nan_rows, 0), ref_o.masked_fill(nan_rows, 0), dtype)
    assert torch.equal(torch.isnan(ol), torch.isnan(ref_l))
    fin = torch.isfinite(ref_l)
    assert torch.equal(ol[~fin & ~torch.isnan(ref_l)], ref_l[~fin & ~torch.isnan(ref_l)].float())
    assert (ol[fin].double() - ref_l[fin]).abs().max() <= 1e-5 * ref_l[fin].abs().max().clamp_min(1)
    assert torch.equal(out[0].view(torch.uint8), so[0].contiguous().view(torch.uint8))  # selected, not weighted
    if layout == "padded_strided":
        assert torch.isnan(ol_buf[:, 0]).all() and torch.isnan(ol_buf[:, T + 1:]).all()
    if layout == "padded_strided":  # nothing outside the views written
        assert torch.isnan(out_buf[0].float()).all() and torch.isnan(out_buf[T + 1].float()).all()
    for order, seed in ORDERS:
        o2 = poison_(torch.empty_like(out))
        simt_capi.configure(lib, order, seed)
        simt_capi.merge_attn_states(lib, o2, None, po, pl, so, sl)
        assert torch.equal(torch.isnan(o2), torch.isnan(out))
        assert torch.equal(o2.nan_to_num(), out.nan_to_num())


def test_merge_in_place_on_the_prefix(lib):
    g = torch.Generator().manual_seed(5)
    T, H, D = 9, 4, 128
    po, so = (torch.randn(T, H, D, generator=g).to(torch.bfloat16) for _ in range(2))
    pl, sl = (torch.randn(T, H, generator=g) for _ in range(2))
    ref_o, _ = reference.merge_attn_states(po, pl, so, sl)
    simt_capi.configure(lib, 0)
    simt_capi.merge_attn_states(lib, po, None, po, pl, so, sl)
    assert_close_rel(po, ref_o, torch.bfloat16)


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz], ids=str)
def test_merge_fp8_output_and_prefill_tokens(lib, fp8_dtype):
    """The FP8 output (OCP e4m3fn on NVIDIA and gfx950, fnuz on gfx942) scaled by 1 / output_scale
    and saturated, and tokens from prefill_tokens_with_context on copying the suffix."""
    g = torch.Generator().manual_seed(21)
    T, H, D, P = 6, 4, 128, 4
    po, so = (torch.randn(T, H, D, generator=g).mul(200).to(torch.bfloat16) for _ in range(2))
    pl, sl = (torch.randn(T, H, generator=g) for _ in range(2))
    scale = torch.tensor([0.75])
    ref_o, ref_l = reference.merge_attn_states(po, pl, so, sl, prefill_tokens_with_context=P, output_scale=0.75,
                                               fp8_dtype=fp8_dtype)
    out = torch.full((T, H, D), 0x55, dtype=torch.uint8).view(fp8_dtype)
    ol = poison_(torch.empty(T, H))
    simt_capi.configure(lib, 0)
    simt_capi.merge_attn_states(lib, out, ol, po, pl, so, sl, output_scale=scale, prefill_tokens_with_context=P)
    want = ref_o.to(fp8_dtype)  # round to nearest even, as the kernel does
    assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))
    assert (out.float().abs() == torch.finfo(fp8_dtype).max).any()  # some saturated
    assert torch.equal(ol[P:], sl[P:])
    assert (ol[:P].double() - ref_l[:P]).abs().max() <= 1e-5


@pytest.mark.parametrize("sink", [False, True])
def test_merge_n(lib, sink):
    g = torch.Generator().manual_seed(11 + sink)
    S, T, H, D = 3, 5, 4, 512
    values = torch.randn(S, T, H, D + 16, generator=g).to(torch.bfloat16)[..., :D]
    lses = torch.randn(S, T, H, generator=g) * 2
    lses[0, 0] = INF  # token 0: state 0 empty (NaN values)
    values[0, 0] = float("nan")
    lses[:, 1] = -INF  # token 1: all empty
    lses[1:, 2] = -INF  # token 2: state 0 alone (with a sink: scaled, not copied)
    lses[1, 3, 0] = float("nan")  # token 3, head 0: NaN
    attn_sink = torch.randn(H, generator=g) if sink else None
    ref_o, ref_l = reference.merge_attn_states_n(values, lses, attn_sink=attn_sink)
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16))
    ol = poison_(torch.empty(T, H))
    simt_capi.configure(lib, 0)
    simt_capi.merge_attn_states_n(lib, out, ol, values, lses, attn_sink)
    nan = torch.isnan(ref_o)
    assert nan[3, 0].all() and torch.equal(torch.isnan(out), nan)
    assert_close_rel(out.masked_fill(nan, 0), ref_o.masked_fill(nan, 0), torch.bfloat16)
    assert (out[1] == 0).all()
    fin = torch.isfinite(ref_l)
    assert torch.equal(torch.isneginf(ol), torch.isneginf(ref_l)) and torch.equal(torch.isnan(ol), torch.isnan(ref_l))
    assert (ol[fin].double() - ref_l[fin]).abs().max() <= 1e-5 * max(1.0, ref_l[fin].abs().max().item())


# ---------------------------------------------------------------------------------------------
# memcheck: the warp-64 cases again under AddressSanitizer
# ---------------------------------------------------------------------------------------------

def _asan_env():
    return dict(os.environ, LD_PRELOAD=simt_capi.asan_runtime(), MLA_EXT_SIMT_ASAN="1",
                ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=0")


def _overrun():
    """A decode told its main index set is twice as wide as the indices tensor: reads past it."""
    lib = simt_capi.library(64)
    inp, S, head_tile, cus = _decode_inputs(DECODE_CASES[1], seed=3)
    inp["indices"] = inp["indices"][:, :64].clone()
    orig = simt_capi._kv_set

    def wide(cache, fmt, indices, lengths):
        s = orig(cache, fmt, indices, lengths)
        s.width = 128
        return s

    simt_capi._kv_set = wide
    _run_decode(lib, inp, S, head_tile, cus)


ASAN_SKIP = pytest.mark.skipif(simt_capi.ASAN or simt_capi.compiler() is None or simt_capi.asan_runtime() is None,
                               reason="needs the compiler's AddressSanitizer runtime (and not already under it)")


@ASAN_SKIP
def test_memcheck_under_address_sanitizer():
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", __file__,
                        "-k", "warp64 and (test_decode or test_merge)"],
                       env=_asan_env(), cwd=here, capture_output=True, text=True, timeout=1800)
    report = r.stdout[-3000:] + r.stderr[-6000:]
    assert "ERROR: AddressSanitizer" not in r.stderr, report
    assert r.returncode == 0, report
    assert " passed" in r.stdout and " deselected" in r.stdout, report


@ASAN_SKIP
def test_memcheck_catches_an_overrun():
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", "import test_simt_emu; test_simt_emu._overrun()"],
                       env=_asan_env(), cwd=here, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in r.stderr and "READ of size 4" in r.stderr, r.stderr[-3000:]
