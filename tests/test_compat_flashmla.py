"""mla_ext.compat.flashmla (FlashMLA's sparse ``flash_mla_with_kvcache`` call shape) against a
float64 reference written here from FlashMLA's documented conventions: per-request lengths,
``[batch_size, num_heads_q, seq_len_q]`` LSE without the sink, ``+inf`` LSE and zero output for a
(token, head) with no valid entry. CPU always, GPU when present; fresh random inputs, caches whose
unselected slots decode to NaN, caller buffers poisoned before each call."""
import pytest
import torch

import mla_ext
from mla_ext import formats, reference
from mla_ext.compat import flashmla
from conftest import poison_, requires_gpu
from test_sparse_mla_decode import make_cache as decode_test_cache

INF = float("inf")


def make_cache(g, fmt, num_pages, page_size, d_qk, device):
    """The decode tests' garbage-filled cache (NaN under any reading) with random rows in every even
    slot, and the float64 rows the reference reads ([num_pages * page_size, d_qk], NaN in the odd
    slots)."""
    cache = decode_test_cache(g, fmt, d_qk, num_pages, page_size, torch.arange(0, num_pages * page_size, 2), device)
    rows = formats.unpack_kv_cache(cache.cpu(), fmt, torch.float64).reshape(-1, d_qk)
    return cache, rows


def even_slots(g, shape, num_slots, invalid_share=0.2):
    """Random even (written) slots with about ``invalid_share`` of the entries -1."""
    idx = torch.randint(0, num_slots // 2, shape, generator=g, dtype=torch.int32) * 2
    idx[torch.rand(shape, generator=g) < invalid_share] = -1
    return idx


def flashmla_reference(q, sets, sink, scale):
    """FlashMLA's sparse decode in float64. ``sets``: (rows [num_slots, d_qk] float64, indices
    [b, s_q, k], lengths [b] or None). Returns (out [b, s_q, h, 512], lse [b, h, s_q])."""
    b, s_q, h, _ = q.shape
    keys, masks = [], []
    for rows, idx, lengths in sets:
        idx = idx.cpu().long()
        valid = (idx >= 0) & (idx < rows.shape[0])
        if lengths is not None:
            valid &= torch.arange(idx.shape[-1]) < lengths.cpu().long().view(b, 1, 1)
        k = rows[idx.clamp(0, rows.shape[0] - 1)]  # [b, s_q, k, d_qk]
        keys.append(torch.where(valid[..., None], k, torch.zeros((), dtype=torch.float64)))
        masks.append(valid)
    k = torch.cat(keys, dim=2)
    valid = torch.cat(masks, dim=2)
    s = torch.einsum("bshd,bskd->bshk", q.cpu().double(), k) * scale
    s = s.masked_fill(~valid[:, :, None, :], -INF)
    lse = torch.logsumexp(s, dim=-1)  # [b, s_q, h]
    empty = torch.isneginf(lse)
    p = torch.exp(s - torch.where(empty, 0.0, lse)[..., None])
    out = torch.einsum("bshk,bskd->bshd", p, k[..., :512])
    if sink is not None:
        out = out / (1.0 + torch.exp(sink.cpu().double().view(1, 1, h) - lse))[..., None]
    out[empty] = 0.0
    lse = torch.where(empty, INF, lse)
    return out, lse.transpose(1, 2)


def check(out, lse, ref_out, ref_lse, fmt, device):
    out_tol, lse_tol = reference.decode_tolerances(torch.device(device).type, fmt)
    out, lse = out.cpu().double(), lse.cpu().double()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any(), "unwritten (NaN) elements"
    err = (out - ref_out).abs().max() / ref_out.abs().max().clamp_min(1e-30)
    assert err <= out_tol, f"out: max error {err:.3g} > {out_tol}"
    assert torch.equal(torch.isposinf(lse), torch.isposinf(ref_lse)), "+inf LSE (empty rows) misplaced"
    fin = torch.isfinite(ref_lse)
    assert reference.lse_error(lse[fin], ref_lse[fin]) <= lse_tol


@pytest.mark.parametrize("fmt,view", [("fp8_ds_mla", torch.float8_e4m3fn), ("fp8_ds_mla", torch.uint8),
                                      ("fp8_ds_mla_fnuz", torch.float8_e4m3fnuz)])
def test_v32_top_k(device, fmt, view):
    g = torch.Generator().manual_seed(11)
    b, h, page_size, topk = 4, 16, 64, 200
    cache, rows = make_cache(g, fmt, 24, page_size, 576, device)
    k_cache = cache.view(view).unsqueeze(2)  # FlashMLA's [num_blocks, page_block_size, 1, 656]
    q = torch.randn(b, 1, h, 576, generator=g).to(device, torch.bfloat16)
    idx = even_slots(g, (b, 1, topk), rows.shape[0])
    lengths = torch.tensor([topk, 150, 0, 37], dtype=torch.int32)  # request 2: no valid entry
    scale = reference.softmax_scale_v32()
    sched, none = flashmla.get_mla_metadata()
    assert none is None and sched.workspace is None
    out, lse = flashmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, sched, softmax_scale=scale,
                                               is_fp8_kvcache=True, indices=idx.to(device),
                                               topk_length=lengths.to(device))
    assert out.shape == (b, 1, h, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (b, h, 1) and lse.dtype == torch.float32 and lse.is_contiguous()
    ref_out, ref_lse = flashmla_reference(q, [(rows, idx, lengths)], None, scale)
    check(out, lse, ref_out, ref_lse, fmt, device)
    assert torch.isposinf(lse[2]).all() and (out[2] == 0).all()
    assert sched.workspace is not None and sched.workspace.dtype == torch.uint8


def test_v4_extra_set_sink_mtp_reused_sched(device):
    """V4 C4-style call: window set (page 16) + compressed set (page 4), sink with -inf / +inf
    heads, two tokens per request (MTP), caller-owned buffers, the FlashMLA default softmax scale,
    one sched meta (with a workspace) reused after indices and lengths change."""
    g = torch.Generator().manual_seed(12)
    b, s_q, h = 3, 2, 8
    fmt = "fp8_ds_mla_v4"
    main, main_rows = make_cache(g, fmt, 12, 16, 512, device)
    extra, extra_rows = make_cache(g, fmt, 40, 4, 512, device)
    k_main = main.view(torch.float8_e4m3fn).unsqueeze(2)
    k_extra = extra.view(torch.float8_e4m3fn).unsqueeze(2)
    assert k_main.stride(0) > 16 * 584  # the padded page stride travels with the view
    sink = torch.randn(h, generator=g)
    sink[1], sink[2] = -INF, INF
    ws = mla_ext.DecodeWorkspace(b * s_q, h, device=device)
    sched, _ = flashmla.get_mla_metadata(workspace=ws.tensor)
    out = poison_(torch.empty(b, s_q, h, 512, dtype=torch.bfloat16, device=device))
    lse = poison_(torch.empty(b, s_q, h, device=device)).transpose(1, 2)  # [b, h, s_q], tokens merge
    q = torch.randn(b, s_q, h, 512, generator=g).to(device, torch.bfloat16)
    for step in range(2):
        idx = even_slots(g, (b, s_q, 64), main_rows.shape[0])
        eidx = even_slots(g, (b, s_q, 96), extra_rows.shape[0])
        lengths = torch.randint(0, 65, (b,), generator=g, dtype=torch.int32)
        elengths = torch.randint(1, 97, (b,), generator=g, dtype=torch.int32)
        if step == 1:
            lengths[0], elengths[0] = 0, 0  # request 0 has nothing to attend to
        poison_(out), poison_(lse)
        got = flashmla.flash_mla_with_kvcache(
            q, k_main, None, None, 512, sched, is_fp8_kvcache=True, indices=idx.to(device),
            attn_sink=sink.to(device), extra_k_cache=k_extra, extra_indices_in_kvcache=eidx.to(device),
            topk_length=lengths.to(device), extra_topk_length=elengths.to(device), out=out, softmax_lse=lse)
        assert got[0] is out and got[1] is lse
        assert sched.workspace is ws.tensor
        ref_out, ref_lse = flashmla_reference(q, [(main_rows, idx, lengths), (extra_rows, eidx, elengths)], sink,
                                              512 ** -0.5)
        check(out, lse, ref_out, ref_lse, fmt, device)
        assert (out[:, :, 2] == 0).all()  # sink +inf
        if step == 1:
            assert torch.isposinf(lse[0]).all() and (out[0] == 0).all()


def test_buffer_layouts(device):
    """seq_len_q > 1: the allocated LSE is contiguous [b, h, s_q] with the bits of a caller's
    transposed [b, s_q, h] buffer; ``out`` as a view of an engine's [num_tokens, h * 512] buffer at
    a token offset is written in place and nothing else; buffers whose (batch, token) dims do not
    merge into one stride are refused before anything is written."""
    g = torch.Generator().manual_seed(13)
    b, s_q, h = 2, 3, 4
    fmt = "fp8_ds_mla"
    cache, rows = make_cache(g, fmt, 6, 64, 576, device)
    q = torch.randn(b, s_q, h, 576, generator=g).to(device, torch.bfloat16)
    idx = even_slots(g, (b, s_q, 50), rows.shape[0]).to(device)
    args = (q, cache, None, None, 512, None)
    kw = dict(softmax_scale=0.07, is_fp8_kvcache=True, indices=idx)
    want_out, want_lse = flashmla.flash_mla_with_kvcache(*args, **kw)
    assert want_lse.shape == (b, h, s_q) and want_lse.is_contiguous()
    no_lse_out, none = flashmla.flash_mla_with_kvcache(*args, **kw, return_softmax_lse=False)
    assert none is None and torch.equal(no_lse_out, want_out)
    engine_out = poison_(torch.empty(b * s_q + 2, h * 512, dtype=torch.bfloat16, device=device))
    out = engine_out[1:1 + b * s_q].view(b, s_q, h, 512)
    lse = poison_(torch.empty(b, s_q, h, device=device)).transpose(1, 2)
    got = flashmla.flash_mla_with_kvcache(*args, **kw, out=out, softmax_lse=lse)
    assert got[0] is out and got[1] is lse
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    assert torch.isnan(engine_out[0].float()).all() and torch.isnan(engine_out[-1].float()).all()
    ref_out, ref_lse = flashmla_reference(q, [(rows, idx, None)], None, 0.07)
    check(out, lse, ref_out, ref_lse, fmt, device)

    bad_out = poison_(torch.empty(s_q, b, h, 512, dtype=torch.bfloat16, device=device)).transpose(0, 1)
    bad_lse = poison_(torch.empty(b, h, s_q, device=device))  # contiguous: no [b * s_q, h] view of it
    good_lse = poison_(torch.empty(b, s_q, h, device=device)).transpose(1, 2)
    good_out = poison_(torch.empty(b, s_q, h, 512, dtype=torch.bfloat16, device=device))
    with pytest.raises(ValueError, match="out's .batch_size, seq_len_q. dims to merge"):
        flashmla.flash_mla_with_kvcache(*args, **kw, out=bad_out, softmax_lse=good_lse)
    with pytest.raises(ValueError, match=r"softmax_lse .*\.transpose\(1, 2\)"):
        flashmla.flash_mla_with_kvcache(*args, **kw, out=good_out, softmax_lse=bad_lse)
    for t in (bad_out, bad_lse, good_lse, good_out):
        assert torch.isnan(t.float()).all(), "a refused call wrote into a buffer"


def test_torch_compile_fullgraph(device):
    """A compiled function calling the shim (two tokens per request, allocated results, a sched
    meta holding a workspace) traces in one graph and gives the eager call's bits."""
    g = torch.Generator().manual_seed(17)
    b, s_q, h = 2, 2, 8
    cache, rows = make_cache(g, "fp8_ds_mla_v4", 8, 16, 512, device)
    q = torch.randn(b, s_q, h, 512, generator=g).to(device, torch.bfloat16)
    idx = even_slots(g, (b, s_q, 40), rows.shape[0]).to(device)
    lengths = torch.tensor([40, 0], dtype=torch.int32, device=device)
    sched, _ = flashmla.get_mla_metadata(workspace=mla_ext.DecodeWorkspace(b * s_q, h, device=device).tensor)

    def step(q, idx, lengths):
        return flashmla.flash_mla_with_kvcache(q, cache.unsqueeze(2), None, None, 512, sched, is_fp8_kvcache=True,
                                               indices=idx, topk_length=lengths)

    torch._dynamo.reset()
    got_out, got_lse = torch.compile(step, fullgraph=True)(q, idx, lengths)
    want_out, want_lse = step(q, idx, lengths)
    assert torch.equal(got_out, want_out) and torch.equal(got_lse, want_lse)
    assert torch.isposinf(got_lse[1]).all() and not torch.isinf(got_lse[0]).any()


def test_bf16_cache(device):
    g = torch.Generator().manual_seed(14)
    cache, rows = make_cache(g, "bf16", 5, 32, 576, device)
    q = torch.randn(2, 1, 8, 576, generator=g).to(device, torch.bfloat16)
    idx = even_slots(g, (2, 1, 40), rows.shape[0])
    out, lse = flashmla.flash_mla_with_kvcache(q, cache.unsqueeze(2), None, None, 512, None, softmax_scale=0.05,
                                               indices=idx.to(device))
    ref_out, ref_lse = flashmla_reference(q, [(rows, idx, None)], None, 0.05)
    check(out, lse, ref_out, ref_lse, "bf16", device)


def test_old_metadata_arguments_ignored():
    sched, none = flashmla.get_mla_metadata(torch.tensor([5, 9], dtype=torch.int32), 64, 1, num_heads_q=16,
                                            is_fp8_kvcache=True, topk=2048)
    assert isinstance(sched, flashmla.FlashMLASchedMeta) and sched.workspace is None and none is None
    with pytest.raises(TypeError, match="workspace"):
        flashmla.get_mla_metadata(workspace=123)
    with pytest.raises(TypeError, match=r"by keyword: get_mla_metadata\(workspace=...\)"):
        flashmla.get_mla_metadata(torch.empty(1024, dtype=torch.uint8))


def test_fnuz_bytes_in_a_uint8_cache(device):
    """A uint8 cache cannot say which e4m3 flavour its bytes are: kv_format names it, as a gfx942
    engine writing e4m3fnuz into a uint8 cache must; numpy integers pass as ints."""
    np = pytest.importorskip("numpy")
    g = torch.Generator().manual_seed(19)
    fmt = "fp8_ds_mla_v4_fnuz"
    cache, rows = make_cache(g, fmt, 6, 32, 512, device)
    assert cache.dtype == torch.uint8
    q = torch.randn(3, 1, 8, 512, generator=g).to(device, torch.bfloat16)
    idx = even_slots(g, (3, 1, 70), rows.shape[0])
    out, lse = flashmla.flash_mla_with_kvcache(q, cache, None, None, np.int64(512), None, num_splits=np.int32(2),
                                               softmax_scale=0.05, is_fp8_kvcache=True, indices=idx.to(device),
                                               kv_format=fmt)
    ref_out, ref_lse = flashmla_reference(q, [(rows, idx, None)], None, 0.05)
    check(out, lse, ref_out, ref_lse, fmt, device)
    with pytest.raises(ValueError, match="kv_format='bf16' with is_fp8_kvcache=True"):
        flashmla.flash_mla_with_kvcache(q, cache, None, None, 512, None, is_fp8_kvcache=True,
                                        indices=idx.to(device), kv_format="bf16")


def test_torch_compile_needs_a_workspace_in_the_sched_meta():
    """Sizing a workspace is a host query dynamo cannot trace: compiled code without one is told
    what to pass instead of failing deep inside torch."""
    g = torch.Generator().manual_seed(20)
    cache, rows = make_cache(g, "fp8_ds_mla_v4", 4, 16, 512, "cpu")
    q = torch.randn(2, 1, 8, 512, generator=g).to(torch.bfloat16)
    idx = even_slots(g, (2, 1, 20), rows.shape[0])

    def step(q, idx):
        return flashmla.flash_mla_with_kvcache(q, cache, None, None, 512, None, is_fp8_kvcache=True, indices=idx)

    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"get_mla_metadata\(workspace="):
        torch.compile(step, fullgraph=True)(q, idx)


def _bad_calls(device):
    g = torch.Generator().manual_seed(15)
    b, s_q, h = 2, 2, 4
    cache, rows = make_cache(g, "fp8_ds_mla", 4, 64, 576, device)
    q = torch.randn(b, s_q, h, 576, generator=g).to(device, torch.bfloat16)
    idx = even_slots(g, (b, s_q, 20), rows.shape[0]).to(device)
    good = dict(q=q, k_cache=cache, block_table=None, cache_seqlens=None, head_dim_v=512, tile_scheduler_metadata=None,
                is_fp8_kvcache=True, indices=idx)
    return good, [
        (dict(indices=None), NotImplementedError, "only sparse decode"),
        (dict(causal=True), ValueError, "causal"),
        (dict(head_dim_v=576), ValueError, "head_dim_v=512"),
        (dict(is_fp8_kvcache=False), ValueError, "is_fp8_kvcache=False"),
        (dict(tile_scheduler_metadata=object()), TypeError, "FlashMLASchedMeta"),
        (dict(num_splits=torch.tensor(4)), TypeError, "num_splits"),
        (dict(topk_length=torch.full((b * s_q,), 5, dtype=torch.int32, device=device)), ValueError,
         r"topk_length of shape \[batch_size\] = \[2\]"),
        (dict(indices=idx[:, :1]), ValueError, "indices of shape"),
        (dict(extra_k_cache=cache), ValueError, "together"),
        (dict(q=q[..., :512].contiguous()), RuntimeError, "k_cache"),  # d_qk 512 reads V4 rows: 656 refused
        (dict(k_cache=cache[..., :600]), RuntimeError, "k_cache"),  # the op's check, in these names
        (dict(k_cache=cache.view(torch.float16)), ValueError, "k_cache to be float8"),
        (dict(head_dim_v=512.0), ValueError, "head_dim_v=512"),
        (dict(num_splits=300), ValueError, "num_splits None or 0..256"),
        (dict(attn_sink=0.0), TypeError, r"^flash_mla_with_kvcache .*attn_sink"),  # the op's TypeError, renamed
        (dict(softmax_scale="0.1"), TypeError, r"^flash_mla_with_kvcache .*softmax_scale"),
    ]


BAD_CALLS = 16


def test_bad_call_count():
    assert len(_bad_calls("cpu")[1]) == BAD_CALLS


@pytest.mark.parametrize("case", range(BAD_CALLS))
def test_bad_calls_raise_before_writing(device, case):
    good, cases = _bad_calls(device)
    change, exc, words = cases[case]
    b, s_q, h = good["q"].shape[:3]
    out = poison_(torch.empty(b, s_q, h, 512, dtype=torch.bfloat16, device=device))
    lse = poison_(torch.empty(b, s_q, h, device=device)).transpose(1, 2)
    sched, _ = flashmla.get_mla_metadata()
    args = {**good, "tile_scheduler_metadata": sched, **change}
    with pytest.raises(exc, match=words):
        flashmla.flash_mla_with_kvcache(**args, out=out, softmax_lse=lse)
    assert torch.isnan(out.float()).all() and torch.isnan(lse).all(), "a refused call wrote into the buffers"
    assert sched.workspace is None


def test_refusals_in_this_interface_names(device):
    """The op's refusals of the caller's buffers name them as this interface does (softmax_lse, out),
    before anything is written; a sched meta's workspace that a bigger call outgrows says where it
    came from."""
    good, _ = _bad_calls(device)
    b, s_q, h = good["q"].shape[:3]
    lse = poison_(torch.empty(b, s_q, h, device=device)).transpose(1, 2).requires_grad_()
    with pytest.raises(RuntimeError, match=r"^flash_mla_with_kvcache .*softmax_lse"):
        flashmla.flash_mla_with_kvcache(**good, softmax_lse=lse)
    raw = poison_(torch.empty(b * s_q * h * 512 * 2, dtype=torch.uint8, device=device))
    out = raw.view(torch.bfloat16).view(b, s_q, h, 512)
    shared = raw.view(torch.float32)[:b * s_q * h].view(b, s_q, h).transpose(1, 2)
    with pytest.raises(RuntimeError, match=r"^flash_mla_with_kvcache .*(out|softmax_lse).*share memory"):
        flashmla.flash_mla_with_kvcache(**good, out=out, softmax_lse=shared)
    assert (raw == 255).all()

    g = torch.Generator().manual_seed(18)
    cache = formats.alloc_kv_cache("fp8_ds_mla", 4, 64)  # garbage only: every index below is -1
    sched, _ = flashmla.get_mla_metadata()
    q1 = torch.randn(1, 1, 4, 576, generator=g).to(device, torch.bfloat16)
    i1 = torch.full((1, 1, 8), -1, dtype=torch.int32, device=device)
    flashmla.flash_mla_with_kvcache(q1, cache.to(device), None, None, 512, sched, is_fp8_kvcache=True, indices=i1)
    held = sched.workspace
    q64 = torch.randn(64, 1, 4, 576, generator=g).to(device, torch.bfloat16)
    i64 = torch.full((64, 1, 8), -1, dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match="tile_scheduler_metadata.workspace"):
        flashmla.flash_mla_with_kvcache(q64, cache.to(device), None, None, 512, sched, num_splits=8,
                                        is_fp8_kvcache=True, indices=i64)
    assert sched.workspace is held


def test_wrong_buffers_refused(device):
    good, _ = _bad_calls(device)
    b, s_q, h = good["q"].shape[:3]
    with pytest.raises(RuntimeError, match=r"^flash_mla_with_kvcache .*expected out to be bfloat16"):
        flashmla.flash_mla_with_kvcache(**good, out=torch.empty(b, s_q, h, 512, device=device))
    with pytest.raises(ValueError, match=r"out of shape \[2, 2, 4, 512\]"):
        flashmla.flash_mla_with_kvcache(**good, out=torch.empty(b, 1, h, 512, dtype=torch.bfloat16, device=device))
    with pytest.raises(ValueError, match="softmax_lse given with return_softmax_lse=False"):
        flashmla.flash_mla_with_kvcache(**good, softmax_lse=torch.empty(b, h, s_q, device=device),
                                        return_softmax_lse=False)
    with pytest.raises(ValueError, match=r"softmax_lse of shape \[2, 4, 2\]"):
        flashmla.flash_mla_with_kvcache(**good, softmax_lse=torch.empty(b, s_q, h, device=device))


@requires_gpu
def test_gpu_graph_replays_after_new_indices_and_lengths():
    """One captured call (V4 window + extra set, two tokens per request, caller buffers, the sched
    meta holding a workspace) replays correctly after indices and lengths are rewritten in place:
    the lengths' per-token expansion and the +inf LSE fix-up are captured with it."""
    g = torch.Generator().manual_seed(16)
    b, s_q, h, fmt = 3, 2, 16, "fp8_ds_mla_v4"
    main, main_rows = make_cache(g, fmt, 10, 16, 512, "cuda")
    extra, extra_rows = make_cache(g, fmt, 300, 4, 512, "cuda")
    q = torch.randn(b, s_q, h, 512, generator=g).to("cuda", torch.bfloat16)
    sink = torch.randn(h, generator=g).cuda()
    idx = torch.empty(b, s_q, 64, dtype=torch.int32, device="cuda")
    eidx = torch.empty(b, s_q, 600, dtype=torch.int32, device="cuda")
    lengths = torch.empty(b, dtype=torch.int32, device="cuda")
    elengths = torch.empty(b, dtype=torch.int32, device="cuda")
    out = torch.empty(b, s_q, h, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(b, s_q, h, device="cuda").transpose(1, 2)
    sched, _ = flashmla.get_mla_metadata(workspace=mla_ext.DecodeWorkspace(b * s_q, h, device="cuda").tensor)

    def fill():
        i, e = even_slots(g, idx.shape, main_rows.shape[0]), even_slots(g, eidx.shape, extra_rows.shape[0])
        n, en = torch.randint(0, 65, (b,), generator=g, dtype=torch.int32), torch.randint(0, 601, (b,), generator=g, dtype=torch.int32)
        n[1], en[1] = 0, 0  # request 1: nothing to attend to
        for dst, src in ((idx, i), (eidx, e), (lengths, n), (elengths, en)):
            dst.copy_(src)
        return i, e, n, en

    def call():
        flashmla.flash_mla_with_kvcache(q, main.view(torch.float8_e4m3fn).unsqueeze(2), None, None, 512, sched,
                                        softmax_scale=512 ** -0.5, is_fp8_kvcache=True, indices=idx, attn_sink=sink,
                                        extra_k_cache=extra.unsqueeze(2), extra_indices_in_kvcache=eidx,
                                        topk_length=lengths, extra_topk_length=elengths, out=out, softmax_lse=lse)

    fill()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # warm-up
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            call()
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(2):
        i, e, n, en = fill()
        poison_(out), poison_(lse)
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = flashmla_reference(q, [(main_rows, i, n), (extra_rows, e, en)], sink, 512 ** -0.5)
        check(out, lse, ref_out, ref_lse, fmt, "cuda")
        assert torch.isposinf(lse[1]).all()
