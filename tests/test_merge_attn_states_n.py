"""merge_attn_states_n (S-way merge) against the float64 reference on fresh random inputs
(CPU always, GPU when present)."""
import pytest
import torch

import mla_ext
from mla_ext import reference
from conftest import assert_close_rel, poison_, requires_gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INF = float("inf")
NAN = float("nan")


def make_states(S, T, H, D, dtype, device, *, seed, empty_frac=0.0, pad_to=None):
    """values [S, T, H, D] (optionally [..., :D] of a wider buffer), lses [S, T, H] ~ 3 N(0,1).
    A fraction of (s, t, h) entries is empty (+inf or -inf, chosen at random), with NaN values."""
    g = torch.Generator().manual_seed(seed)
    width = pad_to or D
    values = torch.randn(S, T, H, width, generator=g)[..., :D]
    lses = torch.randn(S, T, H, generator=g) * 3
    if empty_frac:
        empty = torch.rand(S, T, H, generator=g) < empty_frac
        sign = torch.where(torch.rand(S, T, H, generator=g) < 0.5, INF, -INF)
        lses = torch.where(empty, sign, lses)
        values = torch.where(empty[..., None], torch.full_like(values, NAN), values)
    return values.to(dtype).to(device), lses.to(device)


def check(out, out_lse, values, lses, dtype):
    ref_o, ref_l = reference.merge_attn_states_n(values.cpu(), lses.cpu())
    magnitude, _ = reference.merge_attn_states_n(values.cpu().abs(), lses.cpu())
    assert_close_rel(out, ref_o, dtype, magnitude=magnitude)
    if out_lse is not None:
        assert torch.allclose(out_lse.double().cpu(), ref_l, rtol=1e-6, atol=1e-5, equal_nan=True)


SHAPES = [(1, 1, 1), (7, 16, 128), (33, 3, 48), (2, 5, 576), (3, 7, 7), (1, 128, 512), (613, 2, 64), (4, 3, 2)]


@pytest.mark.parametrize("S", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("T,H,D", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_contiguous(device, S, T, H, D, dtype):
    values, lses = make_states(S, T, H, D, dtype, device, seed=S * 1000 + T + D, empty_frac=0.2)
    out = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    mla_ext.merge_attn_states_n(out, out_lse, values, lses)
    check(out, out_lse, values, lses, dtype)  # all-empty rows must be 0 (written), not NaN


@pytest.mark.parametrize("S", [16, 64, 100])
@pytest.mark.parametrize("dtype", DTYPES)
def test_many_states(device, S, dtype):
    T, H, D = 5, 4, 128
    values, lses = make_states(S, T, H, D, dtype, device, seed=S, empty_frac=0.3)
    out = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    mla_ext.merge_attn_states_n(out, out_lse, values, lses)
    check(out, out_lse, values, lses, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_views(device, dtype):
    """values as a permuted view of [T, S, H, D+pad], lses as a permuted view of [H, S, T],
    output a [T, H, D] view inside a wider buffer at a token offset; nothing outside written."""
    S, T, H, D = 4, 21, 6, 64
    g = torch.Generator().manual_seed(3)
    vbuf = torch.randn(T, S, H, D + 8, generator=g).to(dtype).to(device)
    values = vbuf.permute(1, 0, 2, 3)[..., :D]
    lbuf = (torch.randn(H, S, T, generator=g) * 2).to(device)
    lses = lbuf.permute(1, 2, 0)
    obuf = poison_(torch.empty(T + 3, H, D + 32, dtype=dtype, device=device))
    out = obuf[2:T + 2, :, 16:16 + D]
    lse_buf = poison_(torch.empty(H, T + 2, device=device))
    out_lse = lse_buf[:, 1:T + 1].T
    mla_ext.merge_attn_states_n(out, out_lse, values, lses)
    check(out, out_lse, values, lses, dtype)
    ob = obuf.cpu()
    assert ob[:2].isnan().all() and ob[T + 2:].isnan().all()
    assert ob[2:T + 2, :, :16].isnan().all() and ob[2:T + 2, :, 16 + D:].isnan().all()
    assert lse_buf[:, 0].isnan().all() and lse_buf[:, T + 1].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_narrow_alignment_path(device, dtype):
    """Misaligned pointers and odd strides force the element-wise path."""
    S, T, H, D = 3, 9, 4, 64
    g = torch.Generator().manual_seed(4)
    base = torch.randn(S * T * H * D + 1, generator=g).to(dtype).to(device)
    values = base[1:].view(S, T, H, D)
    lses = torch.randn(S, T, H, generator=g).to(device)
    out = poison_(torch.empty(T * H * D + 3, dtype=dtype, device=device))[3:].view(T, H, D)
    out_lse = poison_(torch.empty(T, H, device=device))
    mla_ext.merge_attn_states_n(out, out_lse, values, lses)
    check(out, out_lse, values, lses, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_edge_cases(device, dtype):
    S, T, H, D = 4, 8, 3, 40
    values, lses = make_states(S, T, H, D, dtype, device, seed=5)
    values, lses = values.clone(), lses.clone()
    # token 0: every state empty (mixed +inf / -inf), values NaN -> 0, -inf
    lses[:, 0] = torch.tensor([INF, -INF, INF, -INF], device=device)[:, None]
    values[:, 0] = NAN
    # token 1: only state 2 non-empty, the others' values NaN -> state 2 exactly
    lses[[0, 1, 3], 1] = INF
    values[[0, 1, 3], 1] = NAN
    # token 2: one NaN lse -> NaN
    lses[3, 2, 1] = NAN
    # token 3: only state 0 non-empty with a huge lse, the rest -inf
    lses[1:, 3] = -INF
    lses[0, 3] = 1e30
    # token 4: states with lse far below the max (weights underflow to 0, not NaN)
    lses[0, 4] = 50.0
    lses[1:, 4] = -80.0
    out = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    mla_ext.merge_attn_states_n(out, out_lse, values, lses)
    assert (out[0] == 0).all() and torch.isneginf(out_lse[0]).all()
    assert torch.equal(out[1], values[2, 1]) and torch.equal(out_lse[1], lses[2, 1])
    assert out[2, 1].isnan().all() and out_lse[2, 1].isnan()
    assert not out[2, 0].isnan().any() and not out[2, 2].isnan().any()
    assert torch.equal(out[3], values[0, 3]) and torch.equal(out_lse[3], lses[0, 3])
    check(out[4:], out_lse[4:], values[:, 4:], lses[:, 4:], dtype)
    ref_o, ref_l = reference.merge_attn_states_n(values.cpu(), lses.cpu())
    assert torch.allclose(out_lse.double().cpu(), ref_l, rtol=1e-6, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_single_state(device, dtype):
    """S = 1: a copy (or 0 / -inf when empty, NaN when the lse is NaN)."""
    T, H, D = 6, 5, 48
    values, lses = make_states(1, T, H, D, dtype, device, seed=6)
    lses = lses.clone()
    lses[0, 0, 0] = INF
    lses[0, 1, 1] = NAN
    out = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    mla_ext.merge_attn_states_n(out, out_lse, values, lses)
    assert (out[0, 0] == 0).all() and torch.isneginf(out_lse[0, 0])
    assert out[1, 1].isnan().all() and out_lse[1, 1].isnan()
    keep = torch.ones(T, H, dtype=torch.bool)
    keep[0, 0] = keep[1, 1] = False
    assert torch.equal(out[keep.to(device)], values[0][keep.to(device)])
    assert torch.equal(out_lse[keep.to(device)], lses[0][keep.to(device)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_two_way_merge(device, dtype):
    """S = 2 agrees with merge_attn_states (both against the reference; same edge rules)."""
    T, H, D = 17, 8, 128
    values, lses = make_states(2, T, H, D, dtype, device, seed=7, empty_frac=0.25)
    o2 = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    l2 = poison_(torch.empty(T, H, device=device))
    mla_ext.merge_attn_states(o2, l2, values[0], lses[0], values[1], lses[1])
    on = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    ln = poison_(torch.empty(T, H, device=device))
    mla_ext.merge_attn_states_n(on, ln, values, lses)
    check(on, ln, values, lses, dtype)
    assert torch.allclose(on.double(), o2.double(), rtol=0, atol=2 * {torch.float32: 1e-6, torch.float16: 2e-3,
                                                                        torch.bfloat16: 1.6e-2}[dtype] * 4)
    assert torch.allclose(ln, l2, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_output_aliases_a_state(device, dtype):
    S, T, H, D = 3, 65, 8, 128
    values, lses = make_states(S, T, H, D, dtype, device, seed=8)
    values = values.clone()
    ref_o, ref_l = reference.merge_attn_states_n(values.cpu(), lses.cpu())
    out = values[1]
    mla_ext.merge_attn_states_n(out, None, values, lses)
    assert_close_rel(out, ref_o, dtype)


def test_empty_batch(device):
    """Zero tokens or heads (with an output_lse: it has no elements) and head_size 0 without
    output_lse return at once (head_size 0 with an output_lse: test_merge_attn_states.py)."""
    for shape in [(0, 4, 64), (4, 0, 64), (4, 3, 0)]:
        out = torch.empty(*shape, dtype=torch.bfloat16, device=device)
        values = torch.empty(2, *shape, dtype=torch.bfloat16, device=device)
        lses = torch.empty(2, *shape[:2], device=device)
        out_lse = poison_(torch.empty(shape[:2], device=device)) if shape[2] else None
        mla_ext.merge_attn_states_n(out, out_lse, values, lses)


def test_error_head_size_too_large(device):
    """The two-way merge's limit (32-bit in-row chunk indices on the GPU) on every device, checked
    before the zero-token early return; the fake kernel torch.compile traces with refuses it too."""
    def call(D, dev, T=0):
        out = torch.empty(T, 2, D, dtype=torch.bfloat16, device=dev)
        values = torch.empty(3, T, 2, D, dtype=torch.bfloat16, device=dev)
        lses = torch.empty(3, T, 2, device=dev)
        torch.ops.mla_ext.merge_attn_states_n(out, torch.empty(T, 2, device=dev), values, lses, None)
    for dev, T in ((device, 0), ("meta", 1)):  # meta tensors have no storage: one real token
        with pytest.raises(RuntimeError, match="merge_attn_states_n: expected head_size below 2\\^31 "
                                               "elements, got 2147483648"):
            call(2**31, dev, T)
        call(2**31 - 1, dev, T)


# ---- errors: raised before anything is written ----

def _valid(device, S=3, T=4, H=3, D=16, dtype=torch.bfloat16):
    values, lses = make_states(S, T, H, D, dtype, device, seed=9)
    out = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    return dict(output=out, output_lse=out_lse, values=values, lses=lses)


ERROR_CASES = {
    "no states": (lambda a: a.update(values=a["values"][:0], lses=a["lses"][:0]), "at least one state"),
    "values 3-D": (lambda a: a.update(values=a["values"][0]), "values of shape"),
    "values shape": (lambda a: a.update(values=a["values"][:, :, :2]), "values of shape"),
    "values dtype": (lambda a: a.update(values=a["values"].float()), "values to have output's dtype"),
    "output dtype": (lambda a: a.update(output=a["output"].double(), values=a["values"].double()),
                     "float32, float16 or bfloat16"),
    "lses dtype": (lambda a: a.update(lses=a["lses"].double()), "lses to be float32"),
    "lses states": (lambda a: a.update(lses=a["lses"][:2]), "lses of shape"),
    "lses shape": (lambda a: a.update(lses=a["lses"][:, :, :1]), "lses of shape"),
    "output_lse shape": (lambda a: a.update(output_lse=poison_(torch.empty(3, 4, device=a["output"].device))),
                         "output_lse of shape"),
    "output_lse dtype": (lambda a: a.update(output_lse=poison_(torch.empty(4, 3, device=a["output"].device).double())),
                         "output_lse to be float32"),
    "values last dim": (lambda a: a.update(values=torch.randn(3, 4, 3, 32, device=a["output"].device)
                                           .to(torch.bfloat16)[..., ::2]), "values to be contiguous"),
    "output not 3-D": (lambda a: a.update(output=a["output"].flatten(1)), "output to be 3-D"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_before_write(device, case):
    args = _valid(device)
    mutate, needle = ERROR_CASES[case]
    mutate(args)
    with pytest.raises(RuntimeError, match=needle):
        mla_ext.merge_attn_states_n(**args)
    assert args["output"].isnan().all() and args["output_lse"].isnan().all()


def test_output_overlap_refused(device):
    """output in place means the very same view as one state; an output shifted by one head over
    values, or an attn_sink sharing memory with output_lse, is refused before anything is written."""
    args = _valid(device, S=3)
    values = args["values"]
    S, T, H, D = values.shape
    flat = torch.cat([values.flatten(), poison_(torch.empty(D, dtype=values.dtype, device=device))])
    before = flat.clone()
    vals = flat[:values.numel()].view(S, T, H, D)
    shifted = flat[(S - 1) * T * H * D + D:].view(T, H, D)  # values[S - 1] moved by one head
    with pytest.raises(RuntimeError, match="very same view as one state"):
        mla_ext.merge_attn_states_n(shifted, args["output_lse"], vals, args["lses"])
    assert torch.equal(flat.isnan(), before.isnan()) and args["output_lse"].isnan().all()
    ol = args["output_lse"]
    with pytest.raises(RuntimeError, match="output_lse not to share memory with attn_sink"):
        mla_ext.merge_attn_states_n(args["output"], ol, values, args["lses"], attn_sink=ol[0])
    assert args["output"].isnan().all() and ol.isnan().all()


def test_in_place_state_overlapping_another_refused(device):
    """output may be the very same view as values[s] only if no other state shares its memory
    (here values[1][t] is values[0][t + 1]); output_lse inside values is refused."""
    args = _valid(device, S=2)
    T, H, D = args["output"].shape
    buf = torch.randn((T + 1) * H * D, device=device).to(args["values"].dtype)
    before = buf.clone()
    values = buf.as_strided((2, T, H, D), (H * D, H * D, D, 1))
    with pytest.raises(RuntimeError, match="not to share memory with the other states"):
        mla_ext.merge_attn_states_n(values[0], args["output_lse"], values, args["lses"])
    assert torch.equal(buf, before) and args["output_lse"].isnan().all()
    vals = args["values"].clone()
    vals_before = vals.clone()
    if vals.dtype == torch.float32:
        with pytest.raises(RuntimeError, match="output_lse not to share memory with values"):
            mla_ext.merge_attn_states_n(args["output"], vals[0, :, :, 0], vals, args["lses"])
        assert torch.equal(vals, vals_before) and args["output"].isnan().all()


def test_in_place_state_of_token_interleaved_values(device):
    """States interleaved per token (values a [T, S, H, D] buffer viewed as [S, T, H, D]): output
    may be values[s] in place, as with the usual [S, T, H, D] layout (the other states are
    disjoint fields of the same buffer, cleared by the exact overlap test)."""
    args = _valid(device, S=3)
    vals = args["values"]
    S, T, H, D = vals.shape
    buf = vals.permute(1, 0, 2, 3).contiguous()  # [T, S, H, D]
    values = buf.permute(1, 0, 2, 3)
    ref_o, ref_l = reference.merge_attn_states_n(vals.cpu(), args["lses"].cpu())
    mla_ext.merge_attn_states_n(values[1], args["output_lse"], values, args["lses"])
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[vals.dtype]
    out = values[1].double().cpu()
    assert ((out - ref_o).abs().max() / ref_o.abs().max()).item() < tol
    assert torch.equal(values[0], vals[0]) and torch.equal(values[2], vals[2])


def test_output_lse_sharing_lses(device):
    """output_lse may not share elements with lses (e.g. lses[1] in place): a clear error, nothing
    written; a disjoint slot of the same buffer is accepted."""
    args = _valid(device, S=3)
    lses = args["lses"]
    buf = torch.cat([lses, poison_(torch.empty_like(lses[:1]))])  # [S + 1, T, H]
    before = buf.clone()
    args.update(lses=buf[:3], output_lse=buf[1])
    with pytest.raises(RuntimeError, match="output_lse not to share memory with lses"):
        mla_ext.merge_attn_states_n(**args)
    assert args["output"].isnan().all() and torch.equal(buf[:3], before[:3])
    args.update(output_lse=buf[3])
    mla_ext.merge_attn_states_n(**args)
    ref_o, ref_l = reference.merge_attn_states_n(args["values"].cpu(), lses.cpu())
    assert torch.allclose(buf[3].double().cpu(), ref_l, rtol=1e-6, atol=1e-5, equal_nan=True)


def test_meta_and_real_tensors_mixed_raise():
    args = _valid("cpu")
    args["lses"] = args["lses"].to("meta")
    with pytest.raises(RuntimeError, match="lses.*same device"):
        mla_ext.merge_attn_states_n(**args)


@requires_gpu
def test_error_mixed_devices():
    args = _valid("cuda")
    args["lses"] = args["lses"].cpu()
    with pytest.raises(RuntimeError, match="lses.*same device"):
        mla_ext.merge_attn_states_n(**args)
    assert args["output"].isnan().all()


# ---- torch integration ----

def test_opcheck(device):
    a = _valid(device, S=4, T=5, H=4, D=64)
    torch.library.opcheck(torch.ops.mla_ext.merge_attn_states_n.default, tuple(a.values()))
    a["output_lse"] = None
    torch.library.opcheck(torch.ops.mla_ext.merge_attn_states_n.default, tuple(a.values()))


def test_torch_compile_fullgraph(device):
    S, T, H, D = 5, 9, 4, 64
    values, lses = make_states(S, T, H, D, torch.bfloat16, device, seed=10)

    @torch.compile(fullgraph=True)
    def f(values, lses):
        out = torch.empty(values.shape[1:], dtype=values.dtype, device=values.device)
        out_lse = torch.empty(lses.shape[1:], device=lses.device)
        mla_ext.merge_attn_states_n(out, out_lse, values, lses)
        return out * 2, out_lse

    out, out_lse = f(values, lses)
    ref_o, ref_l = reference.merge_attn_states_n(values.cpu(), lses.cpu())
    assert_close_rel(out / 2, ref_o, torch.bfloat16)
    assert torch.allclose(out_lse.double().cpu(), ref_l, rtol=1e-6, atol=1e-5)


# ---- GPU only ----

@requires_gpu
def test_cuda_graph_capture_side_stream_replay():
    S, T, H, D = 8, 64, 16, 512
    values, lses = make_states(S, T, H, D, torch.bfloat16, "cuda", seed=11)
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16, device="cuda"))
    out_lse = poison_(torch.empty(T, H, device="cuda"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mla_ext.merge_attn_states_n(out, out_lse, values, lses)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        mla_ext.merge_attn_states_n(out, out_lse, values, lses)
    for i in range(2):
        nv, nl = make_states(S, T, H, D, torch.bfloat16, "cuda", seed=100 + i, empty_frac=0.2)
        values.copy_(nv)
        lses.copy_(nl)
        poison_(out); poison_(out_lse)
        g.replay()
        torch.cuda.synchronize()
        check(out, out_lse, values, lses, torch.bfloat16)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_gpu_agree_large(dtype):
    """A large problem on the GPU (grid-stride loop) against the CPU twin and the reference."""
    S, T, H, D = 64, 96, 16, 512
    values, lses = make_states(S, T, H, D, dtype, "cpu", seed=12, empty_frac=0.1)
    oc = poison_(torch.empty(T, H, D, dtype=dtype))
    lc = poison_(torch.empty(T, H))
    mla_ext.merge_attn_states_n(oc, lc, values, lses)
    og = poison_(torch.empty(T, H, D, dtype=dtype, device="cuda"))
    lg = poison_(torch.empty(T, H, device="cuda"))
    mla_ext.merge_attn_states_n(og, lg, values.cuda(), lses.cuda())
    check(og, lg, values, lses, dtype)
    check(oc, lc, values, lses, dtype)


@requires_gpu
def test_offsets_past_2_pow_32():
    """State stride beyond 2^32 elements (64-bit indexing)."""
    S, T, H, D = 3, 2, 2, 64
    stride_s = (1 << 31) + 64  # elements; state 2 starts past 2^32
    if torch.cuda.get_device_properties(0).total_memory < 20 * (1 << 30):
        pytest.skip("needs ~9 GiB of device memory")
    big = torch.empty(stride_s * (S - 1) + T * H * D, dtype=torch.bfloat16, device="cuda")
    values = big.as_strided((S, T, H, D), (stride_s, H * D, D, 1))
    v, lses = make_states(S, T, H, D, torch.bfloat16, "cuda", seed=13)
    values.copy_(v)
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16, device="cuda"))
    out_lse = poison_(torch.empty(T, H, device="cuda"))
    mla_ext.merge_attn_states_n(out, out_lse, values, lses)
    check(out, out_lse, v, lses, torch.bfloat16)
    del big, values
    torch.cuda.empty_cache()


# ---- attention sink (DeepSeek V4) ----

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("S", [1, 2, 5])
def test_attn_sink(device, dtype, S):
    T, H, D = 11, 6, 128
    values, lses = make_states(S, T, H, D, dtype, device, seed=20 + S, empty_frac=0.25)
    g = torch.Generator().manual_seed(21)
    sink = (torch.randn(2 * H, generator=g) * 2).to(device)[::2]  # strided [H]
    sink[0] = -INF   # no sink on head 0 (one-state rows copied exactly)
    sink[1] = 40.0   # dominating sink: output ~0
    out = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    mla_ext.merge_attn_states_n(out, out_lse, values, lses, sink)
    ref_o, ref_l = reference.merge_attn_states_n(values.cpu(), lses.cpu(), attn_sink=sink.cpu())
    assert_close_rel(out, ref_o, dtype)
    assert torch.allclose(out_lse.double().cpu(), ref_l, rtol=1e-6, atol=1e-5)
    # the LSE excludes the sink: same as without it
    _, ref_l0 = reference.merge_attn_states_n(values.cpu(), lses.cpu())
    assert torch.allclose(ref_l, ref_l0, equal_nan=True)
    # head 0 (sink -inf): one-state rows are exact copies
    live = (~torch.isinf(lses)).sum(0)
    for t in range(T):
        if live[t, 0] == 1:
            s = int((~torch.isinf(lses[:, t, 0])).nonzero()[0])
            assert torch.equal(out[t, 0], values[s, t, 0])
        if live[t, 0] == 0:
            assert (out[t, 0] == 0).all()


def test_attn_sink_edges(device):
    """+inf sink gives 0 (LSE kept); NaN sink gives NaN output; all-empty rows stay 0 / -inf."""
    S, T, H, D = 3, 4, 4, 32
    values, lses = make_states(S, T, H, D, torch.float32, device, seed=22)
    lses = lses.clone()
    lses[:, 3] = -INF
    sink = torch.tensor([INF, float("nan"), 0.5, -INF], device=device)
    out = poison_(torch.empty(T, H, D, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    mla_ext.merge_attn_states_n(out, out_lse, values, lses, sink)
    _, ref_l = reference.merge_attn_states_n(values.cpu(), lses.cpu())
    assert (out[:3, 0] == 0).all()
    assert out[:3, 1].isnan().all()
    assert (out[3] == 0).all() and torch.isneginf(out_lse[3]).all()
    assert torch.allclose(out_lse.double().cpu(), ref_l, rtol=1e-6, atol=1e-5)
    ref_o, _ = reference.merge_attn_states_n(values.cpu(), lses.cpu(), attn_sink=sink.cpu())
    assert torch.allclose(out[:3, 2:].double().cpu(), ref_o[:3, 2:], rtol=1e-5, atol=1e-6)


def test_sink_once_equals_decode_over_union(device):
    """States computed without the sink over disjoint key sets, merged with the sink, equal one
    sparse_mla_decode over the union with the sink; applying the sink in every state does not."""
    from mla_ext.builders import build_decode_inputs
    inp = build_decode_inputs("v4_c4", batch=3, num_heads=8, context_len=(600, 900), topk=64, device=device, seed=5)
    T, H = inp.num_tokens, inp.num_heads
    S = 3
    # a sink comparable with the scores' total mass (builders' N(0, 1) sinks are small next to
    # hundreds of keys), so that applying it the wrong way shows
    _, lse0 = inp.reference()
    inp.attn_sink = lse0.float().mean(0).to(device) + torch.linspace(-1, 1, H, device=device)
    ref_o, ref_l = inp.reference()
    # split the main and extra index sets column-wise into S disjoint parts
    outs, lss, outs_sink = [], [], []
    for s in range(S):
        def part(idx):
            keep = (torch.arange(idx.shape[1], device=idx.device) % S) == s
            return torch.where(keep[None, :], idx, torch.full_like(idx, -1))
        kw = inp.op_kwargs()
        kw.update(extra_indices=part(inp.extra_indices), attn_sink=None)
        o = poison_(torch.empty(T, H, 512, dtype=torch.bfloat16, device=device))
        l = poison_(torch.empty(T, H, device=device))
        ws = mla_ext.DecodeWorkspace(T, H, device=device)
        mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, part(inp.indices), output=o, workspace=ws.tensor, lse=l, **kw)
        outs.append(o)
        lss.append(l)
        o2 = poison_(torch.empty(T, H, 512, dtype=torch.bfloat16, device=device))
        kw.update(attn_sink=inp.attn_sink)
        mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, part(inp.indices), output=o2, workspace=ws.tensor, **kw)
        outs_sink.append(o2)
    values, lses = torch.stack(outs), torch.stack(lss)
    out = poison_(torch.empty(T, H, 512, dtype=torch.bfloat16, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    mla_ext.merge_attn_states_n(out, out_lse, values, lses, inp.attn_sink)
    assert_close_rel(out, ref_o, torch.bfloat16)
    assert torch.allclose(out_lse.double().cpu(), ref_l.cpu(), rtol=1e-5, atol=1e-4)
    # the wrong way: the sink inside every part
    wrong = poison_(torch.empty(T, H, 512, dtype=torch.bfloat16, device=device))
    mla_ext.merge_attn_states_n(wrong, None, torch.stack(outs_sink), lses)
    err = ((wrong.double().cpu() - ref_o.cpu()).abs().max() / ref_o.abs().max()).item()
    assert err > 5e-2, f"sink applied per part should be visibly wrong, err {err}"


def test_attn_sink_errors(device):
    args = _valid(device)
    H = args["output"].shape[1]
    for sink, needle in ((torch.zeros(H, dtype=torch.float64, device=device), "attn_sink to be float32"),
                         (torch.zeros(H + 1, device=device), "attn_sink of shape"),
                         (torch.zeros(1, H, device=device), "attn_sink of shape")):
        with pytest.raises(RuntimeError, match=needle):
            mla_ext.merge_attn_states_n(**args, attn_sink=sink)
    assert args["output"].isnan().all() and args["output_lse"].isnan().all()


def test_opcheck_sink(device):
    a = _valid(device, S=4, T=5, H=4, D=64)
    torch.library.opcheck(torch.ops.mla_ext.merge_attn_states_n.default,
                          tuple(a.values()) + (torch.randn(4, device=device),))
