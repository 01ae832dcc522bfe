"""merge_attn_states against a float64 reference on fresh random inputs (CPU always, GPU when present)."""
import re
import shutil
import subprocess

import pytest
import torch

import mla_ext
from mla_ext import reference
from conftest import (assert_close_rel, assert_fake_refuses_like_op, leave_runtime_error_pending,
                      loaded_cuda_runtime, ops_seen_by_function_mode, poison_, requires_gpu)
from conftest import make_merge_case as make_case

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INF = float("inf")


def run_and_check(out, out_lse, pa, la, pb, lb, dtype):
    ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu())
    magnitude, _ = reference.merge_attn_states(pa.cpu().abs(), la.cpu(), pb.cpu().abs(), lb.cpu())
    mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb)
    assert_close_rel(out, ref_o, dtype, magnitude=magnitude)
    if out_lse is not None:
        assert torch.allclose(out_lse.double().cpu(), ref_l, rtol=1e-6, atol=1e-5, equal_nan=True)


# A covering subset of tokens x heads x head_size x dtype (not the full product).
SHAPES = [
    (1, 1, 1), (1, 3, 5), (7, 16, 48), (7, 3, 192), (613, 3, 128), (613, 16, 5),
    (1, 128, 512), (4096, 1, 128), (4096, 16, 48), (7, 128, 1), (613, 1, 512),
    (7, 96, 512), (7, 128, 512), (7, 256, 512), (3, 5, 576), (2, 7, 2), (2, 7, 3),
    (2, 7, 4), (2, 7, 6), (2, 7, 7),
]


@pytest.mark.parametrize("T,H,D", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_contiguous(device, T, H, D, dtype):
    pa, la, pb, lb = make_case(T, H, D, dtype, device)
    out = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    run_and_check(out, out_lse, pa, la, pb, lb, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,H", [(7, 16), (613, 3), (1, 128)])
def test_padded_mla_views(device, dtype, T, H):
    """Inputs are [..., :128] of [T,H,192]; output is a [T, H*128] buffer viewed at a token offset."""
    D, off = 128, 5
    pa, la, pb, lb = make_case(T, H, D, dtype, device, pad_to=192)
    buf = poison_(torch.empty(T + 2 * off, H * D, dtype=dtype, device=device))
    sentinel = buf.clone()
    out = buf[off:off + T].view(T, H, D)
    # vLLM-style [H, T] LSE buffers passed transposed.
    lse_buf = poison_(torch.empty(H, T + 3, device=device))
    out_lse = lse_buf[:, 1:T + 1].T
    run_and_check(out, out_lse, pa, la, pb, lb, dtype)
    # Nothing outside the views was written (NaN == NaN compared bitwise).
    assert torch.equal(buf[:off].view(torch.int16 if dtype != torch.float32 else torch.int32),
                       sentinel[:off].view(torch.int16 if dtype != torch.float32 else torch.int32))
    assert torch.equal(buf[off + T:].isnan(), sentinel[off + T:].isnan())
    assert lse_buf[:, 0].isnan().all() and lse_buf[:, T + 1:].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_independent_strides(device, dtype):
    """prefix, suffix and output each with their own token and head strides."""
    T, H, D = 33, 6, 64
    g = torch.Generator().manual_seed(1)
    pa = torch.randn(H, T, D + 8, generator=g).to(dtype).to(device).transpose(0, 1)[..., :D]
    pb = torch.randn(T, 2 * H, D, generator=g).to(dtype).to(device)[:, ::2]
    la = torch.randn(H, T, generator=g).to(device).T
    lb = torch.randn(T, H, 3, generator=g).to(device)[..., 1]
    outbuf = poison_(torch.empty(T, H, 2, D, dtype=dtype, device=device))
    out = outbuf[:, :, 1]
    out_lse = poison_(torch.empty(T, H, device=device))
    run_and_check(out, out_lse, pa, la, pb, lb, dtype)
    assert outbuf[:, :, 0].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_narrow_alignment_path(device, dtype):
    """Pointers not 16-byte aligned: the kernel must fall back to narrower accesses."""
    T, H, D = 9, 4, 64
    g = torch.Generator().manual_seed(2)
    base = torch.randn(T * H * D + 1, generator=g).to(dtype).to(device)
    pa = base[1:].view(T, H, D)  # element offset 1: misaligned for any vector width
    pb = torch.randn(T, H, D, generator=g).to(dtype).to(device)
    la, lb = torch.randn(T, H, generator=g).to(device), torch.randn(T, H, generator=g).to(device)
    out = poison_(torch.empty(T * H * D + 3, dtype=dtype, device=device))[3:].view(T, H, D)
    out_lse = poison_(torch.empty(T, H, device=device))
    run_and_check(out, out_lse, pa, la, pb, lb, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_sides_and_nan(device, dtype):
    T, H, D = 8, 4, 40
    pa, la, pb, lb = make_case(T, H, D, dtype, device, gen_seed=3)
    pa, pb = pa.clone(), pb.clone()
    # token 0: prefix +inf (empty), prefix values NaN -> suffix exactly
    la[0] = INF; pa[0] = float("nan")
    # token 1: suffix -inf (empty), suffix values NaN -> prefix exactly
    lb[1] = -INF; pb[1] = float("nan")
    # token 2: both empty -> 0, -inf
    la[2] = -INF; lb[2] = INF; pa[2] = float("nan"); pb[2] = float("nan")
    # token 3: NaN LSE -> NaN
    la[3] = float("nan")
    # token 4: prefix -inf, suffix +inf (both empty)
    la[4] = -INF; lb[4] = INF
    out = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb)
    assert torch.equal(out[0], pb[0]) and torch.equal(out_lse[0], lb[0])
    assert torch.equal(out[1], pa[1]) and torch.equal(out_lse[1], la[1])
    for t in (2, 4):
        assert (out[t] == 0).all() and torch.isneginf(out_lse[t]).all()
    assert out[3].isnan().all() and out_lse[3].isnan().all()
    ref_o, ref_l = reference.merge_attn_states(pa[5:].cpu(), la[5:].cpu(), pb[5:].cpu(), lb[5:].cpu())
    assert_close_rel(out[5:], ref_o, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alias", ["prefix", "suffix"])
def test_output_aliases_input(device, dtype, alias):
    T, H, D = 613, 8, 128
    pa, la, pb, lb = make_case(T, H, D, dtype, device)
    pa, pb = pa.clone(), pb.clone()
    ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu())
    out = pa if alias == "prefix" else pb
    mla_ext.merge_attn_states(out, None, pa, la, pb, lb)
    assert_close_rel(out, ref_o, dtype)


def test_output_overlap_refused(device):
    """In place means the very same view: an output shifted by one head over prefix_output, a
    transposed view of it, or one sharing memory with an input LSE is refused before anything
    is written; two disjoint fields of one interleaved buffer are accepted."""
    T, H, D = 4, 3, 16
    pa, la, pb, lb = make_case(T, H, D, torch.float32, device, gen_seed=7)
    buf = torch.cat([pa.flatten(), poison_(torch.empty(D, device=device))])
    before = buf.clone()
    prefix = buf[:T * H * D].view(T, H, D)
    shifted = buf[D:].view(T, H, D)
    with pytest.raises(RuntimeError, match="output to be either the very same view as prefix_output"):
        mla_ext.merge_attn_states(shifted, None, prefix, la, pb, lb)
    x = pb.transpose(0, 1).contiguous()  # [H, T, D] holding suffix values
    x_before = x.clone()
    with pytest.raises(RuntimeError, match="very same view as suffix_output"):
        # the same memory read as [T, H, D] (contiguous) and written through a transposed view
        mla_ext.merge_attn_states(x.transpose(0, 1), None, pa, la, x.view(T, H, D), lb)
    assert torch.equal(x, x_before)
    lbuf = torch.cat([la.flatten(), poison_(torch.empty(T * H * D, device=device))])
    with pytest.raises(RuntimeError, match="output not to share memory with prefix_lse"):
        mla_ext.merge_attn_states(lbuf[T * H - 1:T * H - 1 + T * H * D].view(T, H, D), None, pa,
                                  lbuf[:T * H].view(T, H), pb, lb)
    assert torch.equal(buf.isnan(), before.isnan()) and lbuf[T * H:].isnan().all()
    # disjoint fields of one [T, H, 2, D] buffer: output in field 0, prefix in field 1
    both = poison_(torch.empty(T, H, 2, D, device=device))
    both[:, :, 1] = pa
    mla_ext.merge_attn_states(both[:, :, 0], None, both[:, :, 1], la, pb, lb)
    ref_o, _ = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu())
    assert_close_rel(both[:, :, 0], ref_o, torch.float32)
    assert torch.equal(both[:, :, 1], pa)
    # disjoint fields of one [T, F, H, D] buffer (their gap is a multiple of every stride's gcd,
    # so only the exact test clears them): output in field 0, prefix in field 2
    fields = poison_(torch.empty(T, 3, H, D, device=device))
    fields[:, 2] = pa
    mla_ext.merge_attn_states(fields[:, 0], None, fields[:, 2], la, pb, lb)
    assert_close_rel(fields[:, 0], ref_o, torch.float32)
    assert torch.equal(fields[:, 2], pa) and fields[:, 1].isnan().all()


def test_overlap_rows_of_different_lengths(device):
    """An LSE inside each output row is refused; an LSE in the padding right after each output
    row (one [T, H, D + 1] buffer) is accepted and correct; output_lse over prefix_output is
    refused. (Rows and LSE elements of one buffer share a period but not a length.)"""
    T, H, D = 6, 1, 16
    pa, la, pb, lb = make_case(T, H, D, torch.float32, device, gen_seed=9)
    buf = poison_(torch.empty(T, 2 * D, device=device))
    with pytest.raises(RuntimeError, match="output not to share memory with prefix_lse"):
        mla_ext.merge_attn_states(buf[:, :D].view(T, H, D), None, pa, buf[:, 4:5], pb, lb)
    assert buf.isnan().all()
    packed = poison_(torch.empty(T, 3, D + 1, device=device))  # H = 3 rows of D values + their LSE
    pa3, la3, pb3, lb3 = make_case(T, 3, D, torch.float32, device, gen_seed=10)
    mla_ext.merge_attn_states(packed[..., :D], packed[..., D], pa3, la3, pb3, lb3)
    ref_o, ref_l = reference.merge_attn_states(pa3.cpu(), la3.cpu(), pb3.cpu(), lb3.cpu())
    assert_close_rel(packed[..., :D], ref_o, torch.float32)
    assert torch.allclose(packed[..., D].double().cpu(), ref_l, rtol=1e-6, atol=1e-5)
    out = poison_(torch.empty(T, H, D, device=device))
    pbuf = pa.clone()
    with pytest.raises(RuntimeError, match="output_lse not to share memory with prefix_output"):
        mla_ext.merge_attn_states(out, pbuf[:, :, 0], pbuf, la, pb, lb)
    assert torch.equal(pbuf, pa) and out.isnan().all()


def _byte_set(t):
    """The byte addresses a tensor's elements cover (small tensors only)."""
    es = t.element_size()
    idx = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride()):
        idx = (idx.unsqueeze(-1) + torch.arange(size) * stride).flatten()
    base = t.data_ptr()
    return {base + int(i) * es + b for i in idx.tolist() for b in range(es)}


def test_overlap_check_never_misses_random_views():
    """Random strided output / LSE views of one float32 buffer: the op refuses exactly when they
    truly share a byte (small views are decided exactly), an output whose own elements share
    bytes is refused as such and no disjoint one is, and a refused call writes nothing."""
    g = torch.Generator().manual_seed(21)
    buf = torch.zeros(4096)
    refused = accepted = self_refused = 0
    for i in range(400):
        T, H, D = (int(x) for x in torch.randint(1, 4, (3,), generator=g))
        # Strides that are multiples of one period P (in elements) half of the time, so that the
        # check's modular test (not only its range test) decides.
        P = int(torch.randint(4, 17, (1,), generator=g)) if i % 2 else 1
        r = [int(x) for x in torch.randint(1, 9, (4,), generator=g)]
        out = buf.as_strided((T, H, D), (P * r[0] * 4, P * r[1], 1), int(torch.randint(0, 300, (1,), generator=g)))
        lse = buf.as_strided((T, H), (P * r[2] * 2, P * r[3]), int(torch.randint(0, 400, (1,), generator=g)))
        shares = bool(_byte_set(out) & _byte_set(lse))
        self_overlap = len(_byte_set(out)) < out.numel() * 4  # output elements sharing bytes
        pa = torch.randn(T, H, D, generator=g)
        pb = torch.randn(T, H, D, generator=g)
        lb = torch.randn(T, H, generator=g)
        buf.copy_(torch.arange(4096, dtype=torch.float32))
        before = buf.clone()
        try:
            mla_ext.merge_attn_states(out, None, pa, lse, pb, lb)
            assert not shares and not self_overlap, (T, H, D, out.stride(), out.storage_offset(), lse.stride(),
                                                     lse.storage_offset())
            accepted += 1
        except RuntimeError as e:
            if "output to hold each element once" in str(e):
                assert self_overlap, (T, H, D, out.stride())  # the self-overlap test never refuses a disjoint view
                self_refused += 1
            else:
                assert "not to share memory with prefix_lse" in str(e)
                assert shares, (T, H, D, out.stride(), out.storage_offset(), lse.stride(), lse.storage_offset())
                refused += 1
            assert torch.equal(buf, before)
    assert refused > 10 and accepted > 20 and self_refused > 20  # every outcome exercised


def test_overlap_check_views_sharing_a_token_stride():
    """Random output / prefix_output views of one buffer with the same token stride (the case the
    check decides by peeling that dim) and random head strides and offsets: refused exactly when
    they share an element without being the same view (brute force), or when the output's own
    elements overlap; nothing written when refused."""
    g = torch.Generator().manual_seed(31)
    rnd = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))
    buf = torch.zeros(2000)
    seen = set()
    for _ in range(400):
        T, H, D, S0 = rnd(1, 6), rnd(1, 4), rnd(1, 5), rnd(1, 40)
        so, sp, oo, op = rnd(1, 12), rnd(1, 12), rnd(0, 200), rnd(0, 200)
        out = buf.as_strided((T, H, D), (S0, so, 1), oo)
        pre = buf.as_strided((T, H, D), (S0, sp, 1), op)
        elems = lambda o, s: {o + a * S0 + b * s + c for a in range(T) for b in range(H) for c in range(D)}
        eo, ep = elems(oo, so), elems(op, sp)
        self_overlap = len(eo) < T * H * D
        same = oo == op and (so == sp or H == 1)
        shares = bool(eo & ep) and not same
        buf.copy_(torch.arange(2000, dtype=torch.float32))
        before = buf.clone()
        try:
            mla_ext.merge_attn_states(out, None, pre, torch.randn(T, H, generator=g), torch.randn(T, H, D, generator=g),
                                      torch.randn(T, H, generator=g))
            assert not shares and not self_overlap, (T, H, D, S0, so, sp, oo, op)
            seen.add("accepted")
        except RuntimeError as e:
            assert (self_overlap if "hold each element once" in str(e) else shares), (T, H, D, S0, so, sp, oo, op)
            assert torch.equal(buf, before)
            seen.add("refused")
    assert seen == {"accepted", "refused"}


def test_overlap_check_fields_of_large_buffers():
    """Output and prefix_output as fields of one [T, F, H, D] buffer with more token x head rows
    (76800) than the check enumerates, each shifted by a random number of elements: refused
    exactly when they share an element (brute force over the element indices), accepted and
    correct otherwise; the decode's q / output pair the same (disjoint fields accepted)."""
    g = torch.Generator().manual_seed(29)
    T, F, H, D = 600, 3, 128, 4
    buf = torch.empty(T * F * H * D + 3 * H * D, dtype=torch.float16)
    la, lb = torch.randn(T, H, generator=g), torch.randn(T, H, generator=g)
    pb = torch.randn(T, H, D, generator=g).half()
    outcomes = set()
    for i in range(24):
        fo, fp = (int(x) for x in torch.randperm(F, generator=g)[:2])
        shift = int(torch.randint(-H * D - 2 * D, H * D + 2 * D, (1,), generator=g)) if i % 3 else 0
        off_o, off_p = fo * H * D + H * D + 2 * D, fp * H * D + H * D + 2 * D + shift
        strides = (F * H * D, D, 1)
        out = buf.as_strided((T, H, D), strides, off_o)
        pre = buf.as_strided((T, H, D), strides, off_p)
        elems = lambda off: (torch.arange(T)[:, None, None] * F * H * D + torch.arange(H)[None, :, None] * D
                             + torch.arange(D)[None, None, :] + off).flatten()
        shares = bool(torch.isin(elems(off_o), elems(off_p)).any())
        buf.copy_(torch.randn(buf.shape, generator=g).half())
        pa = pre.clone()
        before = buf.clone()
        try:
            mla_ext.merge_attn_states(out, None, pre, la, pb, lb)
        except RuntimeError as e:
            assert shares and "very same view as prefix_output" in str(e), (fo, fp, shift, str(e)[:200])
            assert torch.equal(buf, before)
            outcomes.add("refused")
            continue
        assert not shares, (fo, fp, shift)
        ref_o, _ = reference.merge_attn_states(pa, la, pb, lb)
        assert_close_rel(out, ref_o, torch.float16)
        outcomes.add("accepted")
    assert outcomes == {"refused", "accepted"}
    # decode: q and output as the two fields of one [T, 2, H, 512] buffer
    qo = torch.randn(520, 2, 128, 512, generator=g).bfloat16()
    cache = torch.randn(2, 4, 512, generator=g).bfloat16()
    idx = torch.randint(0, 8, (520, 2), generator=g, dtype=torch.int32)
    q = qo[:, 0].clone()
    mla_ext.sparse_mla_decode(qo[:, 0], cache, idx, kv_format="bf16", softmax_scale=0.04, output=qo[:, 1],
                              workspace=torch.empty(0, dtype=torch.uint8), num_splits=1)
    ref_o, _ = reference.sparse_mla_decode(q, cache, idx, kv_format="bf16", softmax_scale=0.04)
    assert torch.equal(qo[:, 0], q)
    assert (qo[:, 1].double() - ref_o).abs().max() <= 2 ** -7 * ref_o.abs().max() + 1e-3


def test_empty_batch(device):
    for shape in [(0, 4, 64), (4, 0, 64)]:
        z = torch.empty(*shape, dtype=torch.bfloat16, device=device)
        lse = torch.empty(shape[:2], device=device)
        mla_ext.merge_attn_states(z, lse, z, lse, z, lse)


def test_lse_optional_and_vllm_compat(device):
    T, H, D = 17, 16, 512
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, device)
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16, device=device))
    # vLLM layout: LSE [num_heads, num_tokens]
    la_v, lb_v = la.T.contiguous(), lb.T.contiguous()
    out_lse_v = poison_(torch.empty(H, T, device=device))
    mla_ext.compat.vllm.merge_attn_states(out, pa, la_v, pb, lb_v, output_lse=out_lse_v)
    ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu())
    assert_close_rel(out, ref_o, torch.bfloat16)
    assert torch.allclose(out_lse_v.T.double().cpu(), ref_l, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("T,H,D", [(8, 3, 128), (613, 3, 48), (45, 128, 5), (4096, 16, 128), (9, 2, 512)])
@pytest.mark.parametrize("with_lse,P", [(True, None), (False, None), (True, 21)])
def test_lse_token_stride_one(device, T, H, D, with_lse, P):
    """LSEs with token stride 1 (vLLM's [num_heads, num_tokens] buffers, passed transposed): on the
    GPU rows then go in tiles of 8 tokens of one head, the last tile partial unless T % 8 == 0.
    Every element written, values and LSE against float64, prefill_tokens_with_context inside a
    tile."""
    dtype = torch.bfloat16
    pa, la, pb, lb = make_case(T, H, D, dtype, device, gen_seed=T + H + D)
    la, lb = la.T.contiguous().T, lb.T.contiguous().T
    assert la.stride(0) == 1 and lb.stride(0) == 1
    kw = {} if P is None else {"prefill_tokens_with_context": P}
    ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu(), **kw)
    out = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    out_lse = poison_(torch.empty(H, T, device=device)).T if with_lse else None
    mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb, **kw)
    assert not out.isnan().any()
    assert_close_rel(out, ref_o, dtype)
    if with_lse:
        assert torch.allclose(out_lse.double().cpu(), ref_l, rtol=1e-6, atol=1e-5)


def test_output_lse_sharing_an_input_lse(device):
    """output_lse may not share elements with prefix_lse / suffix_lse (the GPU kernel writes a row's
    output LSE while other threads still read its input LSEs): a clear error, nothing written.
    Disjoint fields of one interleaved buffer are fine."""
    T, H, D = 9, 4, 512
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, device, gen_seed=21)
    for alias in ("prefix", "suffix", "prefix_T"):
        la2, lb2 = la.clone(), lb.clone()
        out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16, device=device))
        if alias == "prefix_T":  # the same elements through another view: [H, T] buffer seen twice
            buf = la.T.contiguous()
            la2, ol = buf.T, buf.T
        else:
            ol = la2 if alias == "prefix" else lb2
        before = (la2.clone(), lb2.clone())
        name = "suffix_lse" if alias == "suffix" else "prefix_lse"
        with pytest.raises(RuntimeError, match=f"output_lse not to share memory with {name}"):
            mla_ext.merge_attn_states(out, ol, pa, la2, pb, lb2)
        assert out.isnan().all()
        assert torch.equal(la2, before[0]) and torch.equal(lb2, before[1])
    # three LSE fields of one [T, H, 3] buffer: disjoint elements, accepted
    buf = poison_(torch.empty(T, H, 3, device=device))
    buf[..., 0], buf[..., 1] = la, lb
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16, device=device))
    run_and_check(out, buf[..., 2], pa, buf[..., 0], pb, buf[..., 1], torch.bfloat16)


# ---- errors: raised before anything is written ----

def _valid(device, T=4, H=3, D=16, dtype=torch.bfloat16):
    pa, la, pb, lb = make_case(T, H, D, dtype, device, gen_seed=4)
    out = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    return dict(output=out, output_lse=out_lse, prefix_output=pa, prefix_lse=la,
                suffix_output=pb, suffix_lse=lb)


ERROR_CASES = {
    "value dtypes differ": (lambda a: a.update(suffix_output=a["suffix_output"].float()), "suffix_output"),
    "value dtype unsupported": (lambda a: a.update(output=a["output"].double(), prefix_output=a["prefix_output"].double(),
                                                   suffix_output=a["suffix_output"].double()), "float32, float16 or bfloat16"),
    "lse not fp32": (lambda a: a.update(prefix_lse=a["prefix_lse"].double()), "prefix_lse"),
    "lse sparse": (lambda a: a.update(prefix_lse=a["prefix_lse"].to_sparse()),
                   "expected prefix_lse to be a dense \\(strided\\) tensor, got layout torch.sparse_coo"),
    "shape mismatch": (lambda a: a.update(suffix_output=a["suffix_output"][:, :2]), "suffix_output"),
    "lse shape": (lambda a: a.update(suffix_lse=a["suffix_lse"][:2]), "suffix_lse"),
    "output_lse shape": (lambda a: a.update(output_lse=poison_(torch.empty(3, 4, device=a["output"].device))), "output_lse"),
    "last dim not contiguous": (lambda a: a.update(prefix_output=torch.randn(4, 3, 32, device=a["output"].device).to(torch.bfloat16)[..., ::2]), "prefix_output"),
    "output not 3-D": (lambda a: a.update(output=a["output"].flatten(1)), "output"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_before_write(device, case):
    args = _valid(device)
    mutate, needle = ERROR_CASES[case]
    mutate(args)
    out, out_lse = args["output"], args["output_lse"]
    before = (out.clone(), out_lse.clone())
    with pytest.raises(RuntimeError, match=needle):
        mla_ext.merge_attn_states(**args)
    assert torch.equal(out.isnan(), before[0].isnan()) and out.isnan().all()
    assert out_lse.isnan().all()


def test_error_head_size_too_large(device):
    # Zero tokens: no storage, but the head_size limit (32-bit in-row offsets) still applies.
    T, H, D = 0, 2, 2**31
    v = torch.empty(T, H, D, dtype=torch.bfloat16, device=device)
    lse = torch.empty(T, H, device=device)
    with pytest.raises(RuntimeError, match="head_size below 2\\^31"):
        mla_ext.merge_attn_states(v, lse, v, lse, v, lse)
    ok = torch.empty(T, H, D - 1, dtype=torch.bfloat16, device=device)
    mla_ext.merge_attn_states(ok, lse, ok, lse, ok, lse)  # one below the limit: accepted (nothing to do)


def test_fake_kernel_refuses_head_size_too_large():
    # Meta tensors (no storage, so one token of 2^31 elements costs nothing): the fake kernel that
    # torch.compile traces with refuses the head_size the op refuses, and accepts one below it.
    def call(D):
        v = torch.empty(1, 2, D, dtype=torch.bfloat16, device="meta")
        lse = torch.empty(1, 2, device="meta")
        torch.ops.mla_ext.merge_attn_states(v, lse, v.clone(), lse.clone(), v.clone(), lse.clone(), None, None)
    with pytest.raises(RuntimeError, match="merge_attn_states: expected head_size below 2\\^31 elements, got 2147483648"):
        call(2**31)
    call(2**31 - 1)


@requires_gpu
def test_error_mixed_devices():
    args = _valid("cuda")
    args["suffix_lse"] = args["suffix_lse"].cpu()
    with pytest.raises(RuntimeError, match="suffix_lse.*same device"):
        mla_ext.merge_attn_states(**args)
    assert args["output"].isnan().all()


# ---- torch integration ----

def test_eager_calls_reach_modes_as_the_overload(device):
    """The wrappers call the overload's C++ callable in eager mode (host time); a torch function
    mode still sees the OpOverload itself, and fake tensors still reach the fake kernel's checks."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = _valid(device, T=3, H=2, D=16)
    seen = ops_seen_by_function_mode(lambda: mla_ext.merge_attn_states(**args))
    assert torch.ops.mla_ext.merge_attn_states.default in seen
    values = torch.randn(2, 3, 2, 16, device=device)
    seen = ops_seen_by_function_mode(lambda: mla_ext.merge_attn_states_n(
        torch.empty(3, 2, 16, device=device), None, values, torch.randn(2, 3, 2, device=device)))
    assert torch.ops.mla_ext.merge_attn_states_n.default in seen
    with FakeTensorMode():
        out = torch.empty(3, 2, 8)
        with pytest.raises(RuntimeError, match="merge_attn_states: expected output and prefix_output to have the "
                                               "same shape"):
            mla_ext.merge_attn_states(out, None, torch.empty(3, 2, 16), torch.empty(3, 2), torch.empty(3, 2, 16),
                                      torch.empty(3, 2))


def test_opcheck(device):
    args = _valid(device, T=5, H=4, D=64)
    torch.library.opcheck(torch.ops.mla_ext.merge_attn_states.default, tuple(args.values()))


def test_torch_compile_fullgraph(device):
    T, H, D = 9, 4, 64
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, device, gen_seed=5)

    @torch.compile(fullgraph=True)
    def f(pa, la, pb, lb):
        out = torch.empty_like(pa)
        out_lse = torch.empty_like(la)
        mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb)
        return out * 2, out_lse

    out, out_lse = f(pa, la, pb, lb)
    ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu())
    assert_close_rel(out / 2, ref_o, torch.bfloat16)


def test_stable_abi_symbols():
    """The built library references no mangled at::/c10:: C++ symbols (LibTorch stable ABI only)."""
    nm, cxxfilt = shutil.which("nm"), shutil.which("c++filt")
    if not (nm and cxxfilt):
        pytest.skip("nm/c++filt not available")
    syms = subprocess.run([nm, "-D", "--undefined-only", mla_ext._LIBRARY_PATH], check=True,
                          capture_output=True, text=True).stdout
    demangled = subprocess.run([cxxfilt], input=syms, check=True, capture_output=True, text=True).stdout
    bad = [line for line in demangled.splitlines() if "at::" in line or "c10::" in line]
    assert not bad, "non-stable torch symbols referenced:\n" + "\n".join(bad[:20])
    assert "aoti_torch" in syms or "torch_" in syms  # it does use the stable C shim


# ---- GPU only ----

@requires_gpu
def test_cuda_graph_capture_side_stream_replay():
    T, H, D = 64, 16, 512
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, "cuda")
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16, device="cuda"))
    out_lse = poison_(torch.empty(T, H, device="cuda"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb)  # warm-up
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb)
    for _ in range(2):
        n = make_case(T, H, D, torch.bfloat16, "cuda")
        for dst, src in zip((pa, la, pb, lb), n):
            dst.copy_(src)
        poison_(out); poison_(out_lse)
        g.replay()
        torch.cuda.synchronize()
        ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu())
        assert_close_rel(out, ref_o, torch.bfloat16)
        assert torch.allclose(out_lse.double().cpu(), ref_l, rtol=1e-6, atol=1e-5)


@requires_gpu
def test_gpu_neighbouring_kernels_ordered():
    """Launch order with the kernels around the merge (on sm_90+ the merge is a programmatic
    dependent launch that may start before the previous kernel ends): every round a kernel writes
    the merge's inputs just before it (read after write) and a kernel reads its output just before
    the next merge overwrites it (write after read); no host sync in between. These neighbours do
    not trigger early, so a merge without its wait only races with their memory flush: a build
    without the wait passed this test (H200) and failed the early-trigger test below."""
    T, H, D, rounds = 1, 128, 512, 40
    srcs = [make_case(T, H, D, torch.bfloat16, "cuda") for _ in range(rounds)]
    pa, la, pb, lb = (torch.empty_like(x) for x in srcs[0])
    out = torch.full((T, H, D), 7.0, dtype=torch.bfloat16, device="cuda")
    out_lse = torch.empty(T, H, device="cuda")
    seen = []  # seen[i]: the output as the kernel after round i - 1 read it
    torch.cuda.synchronize()
    for src in srcs:
        for dst, x in zip((pa, la, pb, lb), src):
            torch.mul(x, 1.0, out=dst)  # exact; a kernel, not a copy-engine memcpy
        seen.append(out * 1.0)
        mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb)
    seen.append(out * 1.0)
    torch.cuda.synchronize()
    assert torch.equal(seen[0].cpu(), torch.full((T, H, D), 7.0, dtype=torch.bfloat16))
    for i, src in enumerate(srcs):
        ref_o, _ = reference.merge_attn_states(*(x.cpu() for x in src))
        assert_close_rel(seen[i + 1], ref_o, torch.bfloat16, what=f"round {i}")


@requires_gpu
def test_gpu_waits_for_an_early_triggering_kernel():
    """The kernel before the merge lets it launch at once (griddepcontrol.launch_dependents) and
    writes the merge's prefix LSE only 200 us later (torch.ops.mla_ext._test_late_fill): a merge
    that read before waiting for it would use the old LSE, which weights the other side."""
    T, H, D = 1, 128, 512
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, "cuda")
    out = torch.empty(T, H, D, dtype=torch.bfloat16, device="cuda")
    out_lse = torch.empty(T, H, device="cuda")
    for v in (40.0, -40.0, 40.0, -40.0):  # prefix dominant / negligible against |lb| <~ 12
        la.fill_(-v)
        poison_(out)
        torch.cuda.synchronize()
        torch.ops.mla_ext._test_late_fill(la, v, 200000)
        mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb)
        torch.cuda.synchronize()
        ref_o, ref_l = reference.merge_attn_states(pa.cpu(), torch.full((T, H), v), pb.cpu(), lb.cpu())
        assert_close_rel(out, ref_o, torch.bfloat16, what=f"prefix lse {v}")
        assert torch.allclose(out_lse.double().cpu(), ref_l, rtol=1e-6, atol=1e-5)


@requires_gpu
def test_gpu_pending_runtime_error_left_to_the_caller():
    """A runtime error the caller left pending before the call (an unchecked failure of its own) is
    not reported as this op's launch failure, and stays pending for the caller: the launch is judged
    by the launch call's return code, not by the runtime's last-error slot. The op runs once first
    (a process's first call through torch may clear it in first-use work: test_sparse_mla_decode.py's
    twin of this test says more)."""
    lib = loaded_cuda_runtime()
    if lib is None:
        pytest.skip("no CUDA runtime loaded (ROCm build)")
    T, H, D = 3, 16, 128
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, "cuda")
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16, device="cuda"))
    out_lse = poison_(torch.empty(T, H, device="cuda"))
    mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb)  # the process's first call (see above)
    poison_(out), poison_(out_lse)
    torch.cuda.synchronize()
    err = leave_runtime_error_pending(lib)
    try:
        mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb)
        still = lib.cudaPeekAtLastError()
    finally:
        lib.cudaGetLastError()  # the caller's to clear
    assert still == err, f"the op changed the pending error: {lib.cudaGetErrorName(still)}"
    torch.cuda.synchronize()
    ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu())
    assert_close_rel(out, ref_o, torch.bfloat16)
    assert torch.allclose(out_lse.double().cpu(), ref_l, rtol=1e-6, atol=1e-5)


@requires_gpu
def test_offsets_past_2_pow_32():
    """Element offsets beyond 2^32 (64-bit indexing): a huge token stride on the output."""
    T, H, D = 3, 2, 64
    stride_t = (1 << 31) + 64  # elements; token 2 starts past 2^32
    if torch.cuda.get_device_properties(0).total_memory < 12 * (1 << 30):
        pytest.skip("needs ~9 GiB of device memory")
    big = torch.empty(stride_t * (T - 1) + H * D, dtype=torch.bfloat16, device="cuda")
    out = big.as_strided((T, H, D), (stride_t, D, 1))
    out.fill_(float("nan"))
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, "cuda")
    out_lse = poison_(torch.empty(T, H, device="cuda"))
    run_and_check(out, out_lse, pa, la, pb, lb, torch.bfloat16)
    del big
    torch.cuda.empty_cache()


@requires_gpu
def test_more_than_2_pow_31_chunks():
    """A call over 2^31 + 1 chunks: the launcher cuts it into launches of < 2^31 chunks, the second
    starting mid-token (head 1). Inputs are token-broadcast (stride 0) so only the output is large
    (4 GiB); head_size 1 takes the one-element path, one chunk per row. The last token is past
    prefill_tokens_with_context, so it copies the suffix, across the launch boundary."""
    if torch.cuda.get_device_properties(0).total_memory < 16 * (1 << 30):
        pytest.skip("needs ~5 GiB of device memory")
    H, D = 3, 1
    T = (2**31 + 1) // H  # T * H = 2^31 + 1 rows
    assert T * H == 2**31 + 1
    pa1, la1, pb1, lb1 = make_case(1, H, D, torch.bfloat16, "cuda", gen_seed=11)
    pa, pb = pa1.expand(T, H, D), pb1.expand(T, H, D)
    la, lb = la1.expand(T, H), lb1.expand(T, H)
    out = torch.full((T, H, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    mla_ext.merge_attn_states(out, None, pa, la, pb, lb, prefill_tokens_with_context=T - 1)
    one = poison_(torch.empty(1, H, D, dtype=torch.bfloat16, device="cuda"))
    run_and_check(one, None, pa1, la1, pb1, lb1, torch.bfloat16)  # the one-token call, against float64
    want = one.view(H)
    flat = out.view(T, H)
    step = 1 << 26
    for t0 in range(0, T - 1, step):  # every merged token equals the one-token call, bit for bit
        blk = flat[t0:min(t0 + step, T - 1)]
        assert torch.equal(blk, want.expand_as(blk)), f"tokens from {t0}"
    assert torch.equal(flat[T - 1], pb1.view(H)), "last token must copy the suffix"
    del out, flat
    torch.cuda.empty_cache()


def test_meta_and_real_tensors_mixed_raise():
    """A meta tensor among real ones dispatches to the fake implementation: it must raise too."""
    args = _valid("cpu")
    args["suffix_output"] = args["suffix_output"].to("meta")
    with pytest.raises(RuntimeError, match="suffix_output.*same device"):
        mla_ext.merge_attn_states(**args)


def test_vllm_compat_lse_shape_message():
    T, H, D = 5, 3, 16
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, "cpu", gen_seed=6)
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match=r"prefix_lse of shape \[num_heads, num_tokens\] = \[3, 5\]"):
        mla_ext.compat.vllm.merge_attn_states(out, pa, la, pb, lb.T)  # prefix_lse given as [T, H]
    assert out.isnan().all()


def test_vllm_compat_lse_not_2d_message():
    """LSEs that are not 2-D give the documented RuntimeError (not an IndexError from the
    transposition), whatever output's shape."""
    with pytest.raises(RuntimeError, match="prefix_lse to be 2-D"):
        mla_ext.compat.vllm.merge_attn_states(torch.zeros(3, 8), torch.zeros(3, 8), torch.zeros(3),
                                              torch.zeros(3, 8), torch.zeros(3))


@pytest.mark.parametrize("name", ["output", "prefix_output", "prefix_lse", "suffix_output", "suffix_lse"])
def test_vllm_compat_non_tensor_named(name):
    """The vLLM-layout wrapper names a None / non-tensor argument (a TypeError, as the main
    wrapper), instead of failing on the transposition with an AttributeError."""
    T, H, D = 5, 3, 16
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, "cpu", gen_seed=6)
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16))
    args = dict(output=out, prefix_output=pa, prefix_lse=la.T, suffix_output=pb, suffix_lse=lb.T)
    args[name] = None
    with pytest.raises(TypeError, match=f"expected {name} to be a torch.Tensor, got NoneType"):
        mla_ext.compat.vllm.merge_attn_states(**args)
    assert out.isnan().all()


@pytest.mark.parametrize("n_way", [False, True])
def test_written_tensors_bump_autograd_versions(n_way):
    """With grad mode on, the outputs' version counters move as with torch's in-place ops, so a
    backward through a tensor the merge overwrote fails instead of using the new values; under
    no_grad nothing is recorded (and the merge is still correct)."""
    T, H, D = 4, 3, 8
    pa, la, pb, lb = make_case(T, H, D, torch.float32, "cpu", gen_seed=21)
    merge = ((lambda o, ol: mla_ext.merge_attn_states_n(o, ol, torch.stack([pa, pb]), torch.stack([la, lb])))
             if n_way else (lambda o, ol: mla_ext.merge_attn_states(o, ol, pa, la, pb, lb)))
    a = torch.randn(T, H, D, requires_grad=True)
    saved = torch.randn(T, H, D)  # no grad of its own, saved by the product for a's gradient
    y = (a * saved).sum()
    out_lse = torch.empty(T, H)
    v0, l0 = saved._version, out_lse._version
    merge(saved, out_lse)
    assert saved._version > v0 and out_lse._version > l0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    with torch.no_grad():
        out = torch.empty(T, H, D)
        v0 = out._version
        merge(out, None)
        assert out._version == v0
    want, _ = reference.merge_attn_states(pa, la, pb, lb)
    assert_close_rel(out, want, torch.float32)


@pytest.mark.parametrize("api", ["two", "n_way", "vllm"])
def test_refuses_outputs_that_require_grad(api):
    """A leaf requiring grad (grad mode on) is refused by name with nothing written, as torch's own
    in-place ops refuse it, and so is a non-leaf requiring grad (with no backward the op would
    leave it its old grad_fn: a later backward would run with wrong gradients); under no_grad the
    same tensor is written and correct. An inference tensor is written outside inference_mode too
    (documented: no host-time check for it)."""
    T, H, D = 4, 3, 8
    pa, la, pb, lb = make_case(T, H, D, torch.float32, "cpu", gen_seed=22)
    want, want_lse = reference.merge_attn_states(pa, la, pb, lb)
    if api == "two":
        merge = lambda o, ol: mla_ext.merge_attn_states(o, ol, pa, la, pb, lb)
    elif api == "n_way":
        merge = lambda o, ol: mla_ext.merge_attn_states_n(o, ol, torch.stack([pa, pb]), torch.stack([la, lb]))
    else:  # vLLM's [num_heads, num_tokens] LSE buffers: output_lse passed transposed
        merge = lambda o, ol: mla_ext.compat.vllm.merge_attn_states(
            o, pa, la.T.contiguous(), pb, lb.T.contiguous(), None if ol is None else ol.T)
    lse_buf = lambda **kw: torch.full((H, T), float("nan"), **kw).T if api == "vllm" else \
        torch.full((T, H), float("nan"), **kw)
    for name in ("output", "output_lse"):
        out, out_lse = torch.full((T, H, D), float("nan")), lse_buf()
        base = torch.full((T, H, D) if name == "output" else (T, H), 1.0, requires_grad=True)
        nonleaf = base * float("nan")  # NaN, requires grad, has a grad_fn
        if name == "output":
            args = (nonleaf, out_lse)
        else:
            args = (out, nonleaf.T.contiguous().T if api == "vllm" else nonleaf)
        with pytest.raises(RuntimeError, match=f"{name} requires grad"):
            merge(*args)
        assert args[0].isnan().all() and args[1].isnan().all()
        leaf = (out if name == "output" else out_lse).requires_grad_(True)
        with pytest.raises(RuntimeError, match=f"{name} requires grad"):
            merge(out, out_lse)
        assert out.isnan().all() and out_lse.isnan().all()
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            leaf.add_(1)  # torch's own refusal of the same write
        with torch.no_grad():
            merge(out, out_lse)
        assert_close_rel(out.detach(), want, torch.float32)
        assert torch.allclose(out_lse.detach().double(), want_lse, rtol=1e-5, atol=1e-5)
        with torch.inference_mode():
            out, out_lse = torch.full((T, H, D), float("nan")), lse_buf()
        if name == "output":
            out_lse = lse_buf()
        else:
            out = torch.full((T, H, D), float("nan"))
        merge(out, out_lse)
        assert_close_rel(out, want, torch.float32)
        assert torch.allclose(out_lse.double(), want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("api", ["two", "n_way"])
@pytest.mark.parametrize("fullgraph", [False, True])
def test_compiled_refuses_outputs_that_require_grad(api, fullgraph):
    """Inside torch.compile the wrappers refuse a written tensor that requires grad as in eager
    (the check runs while tracing). It was skipped there: the compiled call wrote it and a
    backward then flowed through the old grad_fn (gradient 3 through a tensor the op had
    overwritten). With fullgraph=True Dynamo raises its own error quoting ours."""
    T, H, D = 2, 2, 4
    pa, la, pb, lb = make_case(T, H, D, torch.float32, "cpu", gen_seed=23)

    def f(w):
        y = w * 3  # a non-leaf that requires grad
        if api == "two":
            mla_ext.merge_attn_states(y, None, pa, la, pb, lb)
        else:
            mla_ext.merge_attn_states_n(y, None, torch.stack([pa, pb]), torch.stack([la, lb]))
        return y

    torch._dynamo.reset()
    w = torch.zeros(T, H, D, requires_grad=True)
    with pytest.raises(RuntimeError, match="output requires grad; the op has no backward"):
        torch.compile(f, backend="aot_eager", fullgraph=fullgraph)(w)
    with torch.no_grad():  # the same call with grad mode off writes the merge
        got = torch.compile(f, backend="aot_eager", fullgraph=fullgraph)(w)
    assert_close_rel(got, reference.merge_attn_states(pa, la, pb, lb)[0], torch.float32)


_MERGE_FAKE_REFUSALS = [
    (dict(prefix_output=lambda a: a["prefix_output"].double()), "expected prefix_output to have output's dtype"),
    (dict(suffix_output=lambda a: a["suffix_output"][:, :2]), "expected output and suffix_output to have the same shape"),
    (dict(prefix_lse=lambda a: a["prefix_lse"][:3]), "expected prefix_lse of shape [num_tokens, num_heads]"),
    (dict(output_lse=lambda a: a["output_lse"].half()), "expected output_lse to be float32"),
    (dict(output=lambda a: a["output"][0]), "expected output to be 3-D"),
    (dict(output_scale=lambda a: torch.ones(1, device=a["output"].device)), "expected output_scale to be None"),
    (dict(ctx=lambda a: -1), "expected prefill_tokens_with_context >= 0"),
    (dict(output=lambda a: a["output"][..., :0], prefix_output=lambda a: a["prefix_output"][..., :0],
          suffix_output=lambda a: a["suffix_output"][..., :0]), "got head_size 0 with 4 tokens and 3 heads"),
]


@pytest.mark.parametrize("i", range(len(_MERGE_FAKE_REFUSALS)))
def test_fake_kernel_refuses_like_the_op(i):
    """The same bad call on CPU and on meta tensors (the fake kernel torch.compile traces with):
    both refused with the same words; the valid call passes on meta."""
    changes, words = _MERGE_FAKE_REFUSALS[i]
    T, H, D = 4, 3, 16
    pa, la, pb, lb = make_case(T, H, D, torch.float32, "cpu", gen_seed=12)
    cpu = dict(output=torch.empty(T, H, D), output_lse=torch.empty(T, H), prefix_output=pa, prefix_lse=la,
               suffix_output=pb, suffix_lse=lb, ctx=None, output_scale=None)
    assert_fake_refuses_like_op(torch.ops.mla_ext.merge_attn_states, cpu, changes, words)


def test_fake_kernel_refuses_like_the_op_n_way():
    """merge_attn_states_n: values of another dtype, lses of the wrong shape, zero states and an
    output_lse with head_size 0 are refused on meta tensors as on CPU ones."""
    T, H, D = 4, 3, 16
    pa, la, pb, lb = make_case(T, H, D, torch.float32, "cpu", gen_seed=13)
    for dev in ("cpu", "meta"):
        out = torch.empty(T, H, D, device=dev)
        values, lses = torch.stack([pa, pb]).to(dev), torch.stack([la, lb]).to(dev)
        if dev == "meta":
            torch.ops.mla_ext.merge_attn_states_n(out, None, values, lses)  # the valid call
        for v, ls, words in ((values.half(), lses, "expected values to have output's dtype"),
                             (values, lses[:, :2], "expected lses of shape [num_states, num_tokens, num_heads]"),
                             (values[:0], lses[:0], "expected at least one state")):
            with pytest.raises(RuntimeError, match=re.escape(words)):
                torch.ops.mla_ext.merge_attn_states_n(out, None, v, ls)
        with pytest.raises(RuntimeError, match=re.escape("got head_size 0 with 4 tokens and 3 heads")):
            torch.ops.mla_ext.merge_attn_states_n(out[..., :0], torch.empty(T, H, device=dev), values[..., :0], lses)


def test_prefill_tokens_with_context_must_be_an_integer():
    T, H, D = 5, 3, 16
    pa, la, pb, lb = make_case(T, H, D, torch.float32, "cpu", gen_seed=8)
    out = poison_(torch.empty(T, H, D))
    with pytest.raises(TypeError):
        mla_ext.merge_attn_states(out, None, pa, la, pb, lb, prefill_tokens_with_context=2.5)
    assert out.isnan().all()
    mla_ext.merge_attn_states(out, None, pa, la, pb, lb, prefill_tokens_with_context=torch.tensor(2).item())
    assert not out.isnan().any()


# ---- FP8 output (output_scale) and prefill_tokens_with_context ----

FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]
FP8_UNIT = {torch.float8_e4m3fn: 2.0 ** -9, torch.float8_e4m3fnuz: 2.0 ** -10}  # subnormal step


def assert_fp8_close(out, ref, fp8_dtype):
    """out (FP8) within FP8 rounding of ref (float64, already scaled and saturated)."""
    got = out.cpu().double()
    ref = ref.double().cpu()
    assert torch.equal(got.isnan(), ref.isnan()), "NaN positions differ"
    ok = ~ref.isnan()
    err = (got - ref).abs()[ok]
    tol = 0.0625 * ref.abs()[ok] + FP8_UNIT[fp8_dtype] / 2 + 2e-5 * ref.abs()[ok].max().clamp_min(1.0)
    bad = err > tol
    assert not bad.any(), f"{int(bad.sum())} FP8 elements off by more than rounding: max err {err.max():.4g}"


def fp8_expected_bits(x32: torch.Tensor, scale: float, fp8_dtype) -> torch.Tensor:
    """What the kernel must store for an fp32 value x32: saturate(x32 * (1/scale)) rounded by torch."""
    inv = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(scale, dtype=torch.float32)
    fmax = torch.finfo(fp8_dtype).max
    y = (x32.float() * inv).clamp(-fmax, fmax)
    return y.to(fp8_dtype)


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,H,D", [(7, 16, 128), (613, 3, 48), (3, 5, 576), (2, 7, 7), (1, 128, 512)])
def test_fp8_output(device, fp8_dtype, dtype, T, H, D):
    pa, la, pb, lb = make_case(T, H, D, dtype, device)
    pa, pb = pa * 4, pb * 4  # some values saturate at scale 1/64, others land on subnormals
    for scale in (1.0 / 64, 0.37):
        sc = torch.tensor([scale], device=device)
        out = poison_(torch.empty(T, H, D, dtype=torch.float32, device=device)).to(fp8_dtype)
        out_lse = poison_(torch.empty(T, H, device=device))
        mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb, output_scale=sc)
        ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu(),
                                                   output_scale=scale, fp8_dtype=fp8_dtype)
        assert not out.cpu().float().isnan().any()
        assert_fp8_close(out, ref_o, fp8_dtype)
        assert torch.allclose(out_lse.double().cpu(), ref_l, rtol=1e-6, atol=1e-5)  # LSE not scaled
        if scale == 1.0 / 64 and T * H * D > 1000:  # the data reaches saturation at this scale
            assert (out.cpu().float().abs() == torch.finfo(fp8_dtype).max).any()


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_rounding_bit_exact(device, fp8_dtype, dtype):
    """Selected rows (one side empty) are quantised from the exact input value: the bits equal
    torch's round-to-nearest-even conversion of saturate(x * (1/scale)). Covers ties, subnormals,
    tiny negatives, saturation and +-inf."""
    T, H, D = 6, 4, 64
    scale = 0.5
    fmax = torch.finfo(fp8_dtype).max
    g = torch.Generator().manual_seed(11)
    # magnitudes spread over the whole FP8 range (and beyond), random signs
    mag = torch.exp2(torch.empty(T, H, D).uniform_(-16, 10, generator=g))
    x = (mag * torch.where(torch.rand(T, H, D, generator=g) < 0.5, -1.0, 1.0))
    # exact FP8 grid points and midpoints between them (ties) after the 1/scale = 2 multiply
    grid = torch.arange(0, 128, dtype=torch.uint8).view(fp8_dtype).float()
    grid = grid[~grid.isnan()]
    mids = (grid[:-1] + grid[1:]) / 2
    special = torch.cat([grid, mids, -mids, torch.tensor([fmax, fmax * 1.01, 1e30, float("inf"), -float("inf"),
                                                          -1e-30, -0.0, 0.0])]) * scale
    flat = x.view(-1)
    flat[:special.numel()] = special
    x = x.to(dtype)
    x = torch.where(x.float().isnan(), torch.zeros_like(x), x)
    la = torch.randn(T, H, generator=g)
    lb = torch.full((T, H), -INF)            # suffix empty: prefix selected
    lb[3:] = torch.randn(3, H, generator=g)  # tokens 3.. copy the suffix (prefill_tokens_with_context=3)
    pb = x.clone()
    pa = x.clone()
    pa[3:] = float("nan")                    # never read for copied tokens
    la[3:] = float("nan")
    x, pa, pb, la, lb = (t.to(device) for t in (x, pa, pb, la, lb))
    out = torch.zeros(T, H, D, dtype=fp8_dtype, device=device)
    sc = torch.tensor(scale, device=device)  # a 0-d scale is one element too
    mla_ext.merge_attn_states(out, None, pa, la, pb, lb, 3, sc)
    want = fp8_expected_bits(x.cpu(), scale, fp8_dtype)
    got = out.cpu()
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), \
        f"{int((got.view(torch.uint8) != want.view(torch.uint8)).sum())} elements differ from torch's rounding"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("P", [0, 1, 5, 9, 40])
def test_prefill_tokens_with_context(device, dtype, P):
    """Tokens t >= P copy the suffix (values bit-exact, LSE verbatim incl. +inf / NaN); the
    prefix of those tokens is never read (NaN there)."""
    T, H, D = 9, 4, 40
    pa, la, pb, lb = make_case(T, H, D, dtype, device, gen_seed=7)
    pa, la, pb, lb = pa.clone(), la.clone(), pb.clone(), lb.clone()
    ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu(), prefill_tokens_with_context=P)
    pa[P:] = float("nan")
    la[P:] = float("nan")
    if P + 2 < T:
        lb[P, 0] = INF            # copied verbatim, not treated as empty
        lb[P + 1, 1] = float("nan")
        ref_l[P, 0] = INF
        ref_l[P + 1, 1] = float("nan")
    out = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb, prefill_tokens_with_context=P)
    m = min(P, T)
    if m:
        assert_close_rel(out[:m], ref_o[:m], dtype)
        assert torch.allclose(out_lse[:m].double().cpu(), ref_l[:m], rtol=1e-6, atol=1e-5)
    assert torch.equal(out[m:], pb[m:])
    assert torch.equal(out_lse[m:].cpu().double(), ref_l[m:]) or torch.allclose(
        out_lse[m:].cpu().double(), ref_l[m:], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES)
def test_prefill_tokens_with_context_fp8_vllm_compat(device, fp8_dtype):
    """Both new arguments through vLLM's call shape ([H, T] LSE buffers)."""
    T, H, D = 12, 8, 128
    P = 7
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, device, gen_seed=8)
    out = torch.full((T, H, D), float("nan"), device=device).to(fp8_dtype)
    out_lse_v = poison_(torch.empty(H, T, device=device))
    scale = 0.05
    sc = torch.tensor([scale], device=device)
    mla_ext.compat.vllm.merge_attn_states(out, pa, la.T.contiguous(), pb, lb.T.contiguous(), out_lse_v, P, sc)
    ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu(), prefill_tokens_with_context=P,
                                               output_scale=scale, fp8_dtype=fp8_dtype)
    assert_fp8_close(out, ref_o, fp8_dtype)
    assert torch.allclose(out_lse_v.T.double().cpu(), ref_l, rtol=1e-6, atol=1e-5)
    # the copied tokens are exactly the suffix quantised
    assert torch.equal(out[P:].cpu().view(torch.uint8), fp8_expected_bits(pb[P:].cpu(), scale, fp8_dtype).view(torch.uint8))


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES)
def test_fp8_output_strided_and_narrow(device, fp8_dtype):
    """FP8 output as a strided view (token offset inside a wider buffer, odd byte offset: narrow path)."""
    T, H, D = 33, 6, 64
    pa, la, pb, lb = make_case(T, H, D, torch.float16, device, gen_seed=9, pad_to=96)
    for off in (0, 1):
        buf = torch.full((T + 2, H, D + 16 + off), float("nan"), device=device).to(fp8_dtype)
        out = buf[1:T + 1, :, off:off + D]
        mla_ext.merge_attn_states(out, None, pa, la.T.contiguous().T, pb, lb, None, torch.tensor([0.1], device=device))
        ref_o, _ = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu(), output_scale=0.1, fp8_dtype=fp8_dtype)
        assert_fp8_close(out, ref_o, fp8_dtype)
        # nothing outside the view was written
        b = buf.cpu().float()
        assert b[0].isnan().all() and b[T + 1].isnan().all()
        assert b[1:T + 1, :, :off].isnan().all() and b[1:T + 1, :, off + D:].isnan().all()


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES)
def test_fp8_empty_sides_and_nan(device, fp8_dtype):
    T, H, D = 5, 3, 32
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, device, gen_seed=10)
    pa, pb = pa.clone(), pb.clone()
    la[0] = INF; pa[0] = float("nan")               # suffix selected
    la[1] = -INF; lb[1] = INF; pa[1] = pb[1] = float("nan")  # both empty: 0
    lb[2] = float("nan")                            # NaN
    out = torch.full((T, H, D), 7.0, device=device).to(fp8_dtype)
    out_lse = poison_(torch.empty(T, H, device=device))
    mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb, output_scale=torch.ones(1, device=device))
    o = out.cpu().float()
    assert torch.equal(out[0].cpu().view(torch.uint8), fp8_expected_bits(pb[0].cpu(), 1.0, fp8_dtype).view(torch.uint8))
    assert (o[1] == 0).all() and torch.isneginf(out_lse[1]).all()
    assert o[2].isnan().all() and out_lse[2].isnan().all()
    ref_o, _ = reference.merge_attn_states(pa[3:].cpu(), la[3:].cpu(), pb[3:].cpu(), lb[3:].cpu(),
                                           output_scale=1.0, fp8_dtype=fp8_dtype)
    assert_fp8_close(out[3:], ref_o, fp8_dtype)


def _valid_fp8(device):
    a = _valid(device)
    a["output"] = torch.full(a["output"].shape, float("nan"), device=device).to(torch.float8_e4m3fn)
    a["output_scale"] = torch.tensor([0.5], device=device)
    return a


def _fp8_nan(t):
    return t.float().isnan() if t.dtype in FP8_DTYPES else t.isnan()


NEW_ERROR_CASES = {
    "fp8 output without scale": (lambda a: a.pop("output_scale"), "output_scale .*float8_e4m3fn output"),
    "scale with bf16 output": (lambda a: a.update(output=poison_(torch.empty_like(a["prefix_output"]))),
                               "output_scale to be None"),
    "scale not fp32": (lambda a: a.update(output_scale=a["output_scale"].double()), "output_scale to be float32"),
    "scale two elements": (lambda a: a.update(output_scale=torch.ones(2, device=a["output"].device)),
                           "output_scale to have exactly one element"),
    "scale empty": (lambda a: a.update(output_scale=torch.ones(0, device=a["output"].device)),
                    "output_scale to have exactly one element"),
    "fp8 inputs differ": (lambda a: a.update(suffix_output=a["suffix_output"].half()), "suffix_output to have prefix_output's dtype"),
    "fp8 inputs unsupported": (lambda a: a.update(prefix_output=a["prefix_output"].double(), suffix_output=a["suffix_output"].double()),
                               "prefix_output to be float32, float16 or bfloat16"),
    "negative prefill_tokens_with_context": (lambda a: a.update(prefill_tokens_with_context=-1), "prefill_tokens_with_context >= 0"),
    "fp8 output shape": (lambda a: a.update(output=a["output"][:, :2]), "output and prefix_output to have the same shape"),
}


@pytest.mark.parametrize("case", list(NEW_ERROR_CASES))
def test_errors_before_write_new_args(device, case):
    args = _valid_fp8(device)
    mutate, needle = NEW_ERROR_CASES[case]
    mutate(args)
    out, out_lse = args["output"], args["output_lse"]
    with pytest.raises(RuntimeError, match=needle):
        mla_ext.merge_attn_states(**args)
    assert _fp8_nan(out).all() and out_lse.isnan().all()


@requires_gpu
def test_error_scale_on_other_device():
    args = _valid_fp8("cuda")
    args["output_scale"] = args["output_scale"].cpu()
    with pytest.raises(RuntimeError, match="output_scale.*same device"):
        mla_ext.merge_attn_states(**args)
    assert args["output"].float().isnan().all()


def test_opcheck_new_args(device):
    args = _valid_fp8(device)
    # test_schema is left out for the FP8 output only: torch's schema checker compares the
    # mutated output with a multiply that torch does not implement for float8 on the CPU.
    torch.library.opcheck(torch.ops.mla_ext.merge_attn_states.default,
                          (args["output"], args["output_lse"], args["prefix_output"], args["prefix_lse"],
                           args["suffix_output"], args["suffix_lse"], 2, args["output_scale"]),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    a = _valid(device, T=5, H=4, D=64)
    torch.library.opcheck(torch.ops.mla_ext.merge_attn_states.default, tuple(a.values()) + (3, None))


def test_torch_compile_fullgraph_new_args(device):
    T, H, D = 9, 4, 64
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, device, gen_seed=12)
    sc = torch.tensor([0.25], device=device)

    @torch.compile(fullgraph=True)
    def f(pa, la, pb, lb, sc):
        out = torch.empty(pa.shape, dtype=torch.float8_e4m3fn, device=pa.device)
        out_lse = torch.empty_like(la)
        mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb, 6, sc)
        return out.float() * 2, out_lse

    out2, out_lse = f(pa, la, pb, lb, sc)
    ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu(), prefill_tokens_with_context=6,
                                               output_scale=0.25, fp8_dtype=torch.float8_e4m3fn)
    assert_fp8_close((out2 / 2).to(torch.float8_e4m3fn), ref_o, torch.float8_e4m3fn)
    assert torch.allclose(out_lse.double().cpu(), ref_l, rtol=1e-6, atol=1e-5)


@requires_gpu
def test_cuda_graph_fp8_scale_read_at_replay():
    """The scale is read on the device when the graph replays: a new value in the same tensor applies."""
    T, H, D = 64, 16, 512
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, "cuda", gen_seed=13)
    out = torch.empty(T, H, D, dtype=torch.float8_e4m3fn, device="cuda")
    sc = torch.tensor([0.5], device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mla_ext.merge_attn_states(out, None, pa, la, pb, lb, 40, sc)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        mla_ext.merge_attn_states(out, None, pa, la, pb, lb, 40, sc)
    for scale in (0.02, 1.5):
        sc.fill_(scale)
        out.view(torch.uint8).fill_(0x7f)
        g.replay()
        torch.cuda.synchronize()
        ref_o, _ = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu(), prefill_tokens_with_context=40,
                                               output_scale=scale, fp8_dtype=torch.float8_e4m3fn)
        assert_fp8_close(out, ref_o, torch.float8_e4m3fn)


@requires_gpu
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES)
def test_fp8_cpu_gpu_agree(fp8_dtype):
    """The GPU kernel and the CPU twin produce the same FP8 codes up to one step (the GPU's exp differs)."""
    T, H, D = 257, 8, 128
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, "cpu", gen_seed=14)
    sc = torch.tensor([0.03])
    oc = torch.empty(T, H, D, dtype=fp8_dtype)
    mla_ext.merge_attn_states(oc, None, pa, la, pb, lb, 200, sc)
    og = torch.empty(T, H, D, dtype=fp8_dtype, device="cuda")
    mla_ext.merge_attn_states(og, None, pa.cuda(), la.cuda(), pb.cuda(), lb.cuda(), 200, sc.cuda())
    a = oc.view(torch.uint8).int()
    b = og.cpu().view(torch.uint8).int()
    assert ((a - b).abs() <= 1).all() and (a == b).float().mean() > 0.99
    assert torch.equal(a[200:], b[200:])  # copied rows: exact


def test_repeating_outputs_refused(device):
    """An expand()ed output or output_lse (stride 0 over a dim of size > 1) is refused before any
    write, for the two-way and the N-way merge."""
    T, H, D = 4, 3, 8
    g = torch.Generator().manual_seed(3)
    v = torch.randn(T, H, D, generator=g).to(device)
    l = torch.randn(T, H, generator=g).to(device)
    base = poison_(torch.empty(1, H, D, device=device))
    with pytest.raises(RuntimeError, match="output to hold each element once"):
        mla_ext.merge_attn_states(base.expand(T, H, D), None, v, l, v, l)
    lse_base = poison_(torch.empty(T, 1, device=device))
    out = poison_(torch.empty(T, H, D, device=device))
    with pytest.raises(RuntimeError, match="output_lse to hold each element once"):
        mla_ext.merge_attn_states(out, lse_base.expand(T, H), v, l, v, l)
    with pytest.raises(RuntimeError, match="output to hold each element once"):
        mla_ext.merge_attn_states_n(base.expand(T, H, D), None, torch.stack([v, v]), torch.stack([l, l]))
    with pytest.raises(RuntimeError, match="output_lse to hold each element once"):
        mla_ext.merge_attn_states_n(out, lse_base.expand(T, H), torch.stack([v, v]), torch.stack([l, l]))
    assert base.isnan().all() and lse_base.isnan().all() and out.isnan().all()


def _overlapping(shape, strides, dtype, device):
    """A NaN-filled view of `shape` with `strides` over a buffer just large enough."""
    n = 1 + sum((sz - 1) * st for sz, st in zip(shape, strides))
    return torch.full((n,), float("nan"), dtype=dtype, device=device).as_strided(shape, strides)


def test_self_overlapping_outputs_refused(device):
    """An output or output_lse whose elements share memory (heads 64 elements apart with head_size
    128; an LSE with both strides 1) is refused before any write, by both merges, naming the
    strides; an interleaved layout whose elements are disjoint is accepted."""
    T, H, D = 4, 3, 128
    g = torch.Generator().manual_seed(5)
    v = torch.randn(T, H, D, generator=g).to(device)
    l = torch.randn(T, H, generator=g).to(device)
    vs, ls = torch.stack([v, v]), torch.stack([l, l])
    bad_out = _overlapping((T, H, D), (H * 64, 64, 1), torch.float32, device)
    bad_lse = _overlapping((T, H), (1, 1), torch.float32, device)
    out = poison_(torch.empty(T, H, D, device=device))
    for call in (lambda o, ol: mla_ext.merge_attn_states(o, ol, v, l, v, l),
                 lambda o, ol: mla_ext.merge_attn_states_n(o, ol, vs, ls)):
        with pytest.raises(RuntimeError, match=r"output to hold each element once.*strides \[192, 64, 1\], whose elements share memory"):
            call(bad_out, None)
        with pytest.raises(RuntimeError, match="output_lse to hold each element once"):
            call(out, bad_lse)
    assert bad_out.isnan().all() and bad_lse.isnan().all() and out.isnan().all()
    # transposed, sliced and padded layouts stay accepted, and so does an interleaving whose
    # elements are disjoint (rows at t * 3D + h * 4D: decided exactly)
    lse_t = poison_(torch.empty(H, T, device=device)).T
    out_p = poison_(torch.empty(T, H, D + 8, device=device))[..., :D]
    mla_ext.merge_attn_states(out_p, lse_t, v, l, v, l)
    assert not out_p.isnan().any() and not lse_t.isnan().any()
    out_i = _overlapping((T, H, D), (3 * D, 4 * D, 1), torch.float32, device)
    mla_ext.merge_attn_states(out_i, None, v, l, v, l)
    ref, _ = reference.merge_attn_states(v.cpu(), l.cpu(), v.cpu(), l.cpu())
    assert_close_rel(out_i, ref, torch.float32)


def test_head_size_zero(device):
    """head_size 0: nothing to merge and returns at once without output_lse; with tokens, heads and
    an output_lse it is refused (the LSE would stay unwritten), by both merges."""
    T, H = 4, 3
    z = torch.empty(T, H, 0, device=device)
    l = torch.randn(T, H, device=device)
    mla_ext.merge_attn_states(z, None, z, l, z, l)
    mla_ext.merge_attn_states_n(z, None, torch.stack([z, z]), torch.stack([l, l]))
    ol = poison_(torch.empty(T, H, device=device))
    with pytest.raises(RuntimeError, match="head_size 0 with 4 tokens and 3 heads: output_lse would not be written"):
        mla_ext.merge_attn_states(z, ol, z, l, z, l)
    with pytest.raises(RuntimeError, match="merge_attn_states_n: got head_size 0"):
        mla_ext.merge_attn_states_n(z, ol, torch.stack([z, z]), torch.stack([l, l]))
    assert ol.isnan().all()


@pytest.mark.parametrize("name", ["output", "prefix_output", "prefix_lse", "suffix_output", "suffix_lse"])
def test_non_tensor_argument_named(device, name):
    """A required tensor passed as None: a TypeError naming it (torch's own message does not)."""
    T, H, D = 4, 3, 16
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, device)
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16, device=device))
    args = dict(output=out, output_lse=None, prefix_output=pa, prefix_lse=la, suffix_output=pb, suffix_lse=lb)
    args[name] = None
    with pytest.raises(TypeError, match=f"merge_attn_states: expected {name} to be a torch.Tensor"):
        mla_ext.merge_attn_states(**args)
    assert out.isnan().all()
    with pytest.raises(TypeError, match="merge_attn_states: expected output_lse to be a torch.Tensor or None"):
        mla_ext.merge_attn_states(out, [0.0], pa, la, pb, lb)


@pytest.mark.parametrize("name", ["output", "prefix_output", "prefix_lse", "suffix_output", "suffix_lse"])
def test_op_none_tensor_refused(device, name):
    """None for a required tensor straight into torch.ops (no Python wrapper): torch passes it as an
    undefined tensor, which the op refuses by name before touching anything (torch 2.11 crashed)."""
    T, H, D = 4, 3, 16
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, device)
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    args = dict(output=out, output_lse=out_lse, prefix_output=pa, prefix_lse=la, suffix_output=pb, suffix_lse=lb)
    args[name] = None
    with pytest.raises(RuntimeError, match=f"merge_attn_states: expected {name} to be a tensor, got None"):
        torch.ops.mla_ext.merge_attn_states(*args.values())
    assert out.isnan().all() and out_lse.isnan().all()
    values, lses = torch.stack([pa, pb]), torch.stack([la, lb])
    n_args = dict(output=out, output_lse=out_lse, values=values, lses=lses)
    if name in n_args:
        n_args[name] = None
        with pytest.raises(RuntimeError, match=f"merge_attn_states_n: expected {name} to be a tensor, got None"):
            torch.ops.mla_ext.merge_attn_states_n(*n_args.values())
        assert out.isnan().all() and out_lse.isnan().all()


@pytest.mark.parametrize("value,err,needle", [(2.5, TypeError, "prefill_tokens_with_context to be an integer"),
                                              (True, TypeError, "prefill_tokens_with_context to be an integer"),
                                              (torch.tensor([2]), TypeError,
                                               "prefill_tokens_with_context to be an integer, got a tensor"),
                                              (2**70, RuntimeError, "prefill_tokens_with_context to fit in int64")])
def test_prefill_tokens_with_context_not_an_int64(device, value, err, needle):
    T, H, D = 4, 3, 16
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, device)
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16, device=device))
    with pytest.raises(err, match=needle):
        mla_ext.merge_attn_states(out, None, pa, la, pb, lb, value)
    assert out.isnan().all()
