"""Tests of mla_ext.reference (against naive loops) and mla_ext.builders (CPU)."""

import math

import pytest
import torch

import mla_ext.builders as B
import mla_ext.formats as F
import mla_ext.reference as R

INF = float("inf")


# ---------------------------------------------------------------------------------------------
# naive oracle: plain Python loops over tokens, heads and entries, float64 scalars
# ---------------------------------------------------------------------------------------------


def _entries(indices, lengths, num_slots, t):
    row = indices[t].tolist()
    n = len(row) if lengths is None else min(len(row), int(lengths[t]))
    return [s for s in row[:n] if 0 <= s < num_slots]


def naive_decode(q, rows_main, indices, scale, lengths=None, rows_extra=None, extra_indices=None,
                 extra_lengths=None, sink=None):
    """rows_*: [num_slots, d_qk] float64 dequantised caches (flattened pages)."""
    T, H, d = q.shape
    out = torch.zeros(T, H, 512, dtype=torch.float64)
    lse = torch.full((T, H), -INF, dtype=torch.float64)
    qd = q.double()
    for t in range(T):
        keys = [rows_main[s] for s in _entries(indices, lengths, rows_main.shape[0], t)]
        if rows_extra is not None:
            keys += [rows_extra[s] for s in _entries(extra_indices, extra_lengths, rows_extra.shape[0], t)]
        if not keys:
            continue
        for h in range(H):
            logits = [scale * float(torch.dot(qd[t, h], k[:d])) for k in keys]
            m = max(logits)
            w = [math.exp(x - m) for x in logits]
            l = sum(w)
            acc = torch.zeros(512, dtype=torch.float64)
            for wi, k in zip(w, keys):
                acc += wi * k[:512]
            lse[t, h] = m + math.log(l)
            s = None if sink is None else float(sink[h])
            if s is None or s == -INF:
                out[t, h] = acc / l
            elif s == INF:
                out[t, h] = 0.0
            else:
                out[t, h] = acc / (l + math.exp(s - m))
    return out, lse


def _cache(kv_format, num_pages, page_size, d_qk, seed, fill_slots):
    """A cache with only `fill_slots` written (everything else NaN garbage) + float64 rows."""
    g = torch.Generator().manual_seed(seed)
    cache = F.alloc_kv_cache(kv_format, num_pages, page_size, d_qk)
    slots = torch.tensor(sorted(set(fill_slots)), dtype=torch.int64)
    F.write_kv_rows(cache, kv_format, slots, torch.randn(len(slots), d_qk, generator=g) * 2)
    rows = F.unpack_kv_cache(cache, kv_format, dtype=torch.float64).reshape(-1, d_qk)
    return cache, rows


def _valid_slots(indices, lengths, num_slots):
    return [s for t in range(indices.shape[0]) for s in _entries(indices, lengths, num_slots, t)]


# main set: 4 pages of 4 (16 slots); rows cover empty rows, leading/middle/trailing invalid
# entries (-1, -7, >= num_slots), a lengths cut, duplicates.
MAIN_IDX = torch.tensor([
    [3, 14, 5, 9, -1, -1],      # trailing -1
    [-1, 2, 16, 7, 200, 11],    # leading -1, out-of-range in the middle
    [-1, -1, -1, -1, -1, -1],   # empty main
    [6, 6, 6, 12, -5, 1],       # duplicates, negative middle
    [0, 15, 8, 4, 13, 10],      # cut by lengths
], dtype=torch.int32)
MAIN_LEN = torch.tensor([6, 6, 3, 6, 2], dtype=torch.int32)
EXTRA_IDX = torch.tensor([
    [1, 4, -1, -1],
    [-1, -1, -1, -1],           # no extra
    [-1, -1, -1, -1],           # empty overall (both sets)
    [5, 2, 2, 9],               # 9 out of range of the extra cache (3 pages x 2 = 6 slots)
    [0, -1, 3, 5],
], dtype=torch.int32)
EXTRA_LEN = torch.tensor([2, 4, 4, 4, 3], dtype=torch.int32)


@pytest.mark.parametrize("kv_format,d_qk", [("bf16", 576), ("bf16", 512), ("fp8_ds_mla", 576),
                                            ("fp8_ds_mla_v4", 512)])
@pytest.mark.parametrize("use_lengths", [False, True])
def test_main_set_vs_naive(kv_format, d_qk, use_lengths):
    lengths = MAIN_LEN if use_lengths else None
    sel = _valid_slots(MAIN_IDX, lengths, 16)
    cache, rows = _cache(kv_format, 4, 4, d_qk, seed=1, fill_slots=sel)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(5, 3, d_qk, generator=g).to(torch.bfloat16)
    scale = R.softmax_scale_v32() if d_qk == 576 else R.softmax_scale_v4()
    out, lse = R.sparse_mla_decode(q, cache, MAIN_IDX, kv_format=kv_format, softmax_scale=scale,
                                   lengths=lengths)
    assert out.dtype == torch.float64 and out.shape == (5, 3, 512) and lse.shape == (5, 3)
    ref_out, ref_lse = naive_decode(q, rows, MAIN_IDX, scale, lengths)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)
    assert torch.equal(out[2], torch.zeros(3, 512, dtype=torch.float64))
    assert bool(torch.isneginf(lse[2]).all())
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("kv_format", ["fp8_ds_mla_v4", "bf16"])
def test_two_sets_and_sinks_vs_naive(kv_format):
    sel = _valid_slots(MAIN_IDX, MAIN_LEN, 16)
    cache, rows = _cache(kv_format, 4, 4, 512, seed=3, fill_slots=sel)
    sel_x = _valid_slots(EXTRA_IDX, EXTRA_LEN, 6)
    xcache, xrows = _cache(kv_format, 3, 2, 512, seed=4, fill_slots=sel_x)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(5, 4, 512, generator=g).to(torch.bfloat16)
    sink = torch.tensor([-INF, 0.7, INF, -1.5], dtype=torch.float32)
    kw = dict(kv_format=kv_format, softmax_scale=R.softmax_scale_v4(), lengths=MAIN_LEN,
              extra_kv_cache=xcache, extra_indices=EXTRA_IDX, extra_lengths=EXTRA_LEN, attn_sink=sink)
    out, lse = R.sparse_mla_decode(q, cache, MAIN_IDX, **kw)
    ref_out, ref_lse = naive_decode(q, rows, MAIN_IDX, R.softmax_scale_v4(), MAIN_LEN, xrows, EXTRA_IDX,
                                    EXTRA_LEN, sink)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert torch.equal(out[:, 2], torch.zeros(5, 512, dtype=torch.float64))  # sink +inf -> 0
    assert bool(torch.isfinite(lse[[0, 1, 3, 4], 2]).all())  # lse excludes the sink
    assert torch.equal(out[2], torch.zeros(4, 512, dtype=torch.float64))  # empty in both sets
    assert bool(torch.isneginf(lse[2]).all())
    # the extra set matters: token 2 of main is empty but token 1 only has main entries etc.
    out_main, _ = R.sparse_mla_decode(q, cache, MAIN_IDX, kv_format=kv_format,
                                      softmax_scale=R.softmax_scale_v4(), lengths=MAIN_LEN, attn_sink=sink)
    assert torch.equal(out_main[1], out[1])
    assert not torch.allclose(out_main[0], out[0])
    # sink -inf is the same as no sink
    out_ns, lse_ns = R.sparse_mla_decode(q, cache, MAIN_IDX, **{**kw, "attn_sink": None})
    torch.testing.assert_close(out_ns[:, 0], out[:, 0], rtol=1e-14, atol=0)
    torch.testing.assert_close(lse_ns, lse, rtol=0, atol=0)


def test_duplicates_count_twice():
    cache, rows = _cache("bf16", 1, 4, 512, seed=6, fill_slots=[0, 1])
    q = torch.randn(1, 1, 512, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    a, la = R.sparse_mla_decode(q, cache, torch.tensor([[0, 1]]), kv_format="bf16", softmax_scale=0.05)
    b, lb = R.sparse_mla_decode(q, cache, torch.tensor([[0, 0, 1]]), kv_format="bf16", softmax_scale=0.05)
    s = 0.05 * (q.double()[0, 0] @ rows[:2, :].T)
    w = torch.softmax(torch.stack([s[0], s[0], s[1]]), 0)
    torch.testing.assert_close(b[0, 0], w[0] * rows[0] * 2 + w[2] * rows[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lb[0, 0], torch.logsumexp(torch.stack([s[0], s[0], s[1]]), 0))
    assert not torch.allclose(a, b)


def test_singleton_head_dim_and_float32():
    sel = _valid_slots(MAIN_IDX, None, 16)
    cache, rows = _cache("fp8_ds_mla", 4, 4, 576, seed=8, fill_slots=sel)
    q = torch.randn(5, 2, 576, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    o1, l1 = R.sparse_mla_decode(q, cache, MAIN_IDX, kv_format="fp8_ds_mla", softmax_scale=0.1)
    o2, l2 = R.sparse_mla_decode(q, cache.unsqueeze(2), MAIN_IDX, kv_format="fp8_ds_mla", softmax_scale=0.1)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    o3, l3 = R.sparse_mla_decode(q, cache, MAIN_IDX, kv_format="fp8_ds_mla", softmax_scale=0.1,
                                 dtype=torch.float32)
    assert o3.dtype == torch.float32
    torch.testing.assert_close(o3.double(), o1, rtol=1e-4, atol=1e-5)


def test_bad_shapes_raise():
    cache = F.alloc_kv_cache("bf16", 2, 4, 512)
    q = torch.zeros(2, 1, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="q"):
        R.sparse_mla_decode(q, cache, torch.zeros(2, 3, dtype=torch.int32), kv_format="bf16", softmax_scale=1.0)
    q = torch.zeros(2, 1, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="indices"):
        R.sparse_mla_decode(q, cache, torch.zeros(3, 3, dtype=torch.int32), kv_format="bf16", softmax_scale=1.0)
    with pytest.raises(ValueError, match="extra"):
        R.sparse_mla_decode(q, cache, torch.zeros(2, 3, dtype=torch.int32), kv_format="bf16",
                            softmax_scale=1.0, extra_kv_cache=cache)


def test_softmax_scales():
    mscale = 0.1 * math.log(40) + 1
    assert R.softmax_scale_v32() == pytest.approx(mscale ** 2 / math.sqrt(192), rel=1e-15)
    assert R.softmax_scale_v32() == pytest.approx(0.13523, rel=1e-4)
    assert R.softmax_scale_v4() == 512 ** -0.5


# ---------------------------------------------------------------------------------------------
# merge_attn_states
# ---------------------------------------------------------------------------------------------


def _naive_merge(va, a, vb, b):
    T, H, D = va.shape
    out = torch.empty(T, H, D, dtype=torch.float64)
    lse = torch.empty(T, H, dtype=torch.float64)
    for t in range(T):
        for h in range(H):
            x, y = float(a[t, h]), float(b[t, h])
            x = -INF if x == INF else x
            y = -INF if y == INF else y
            if math.isnan(x) or math.isnan(y):
                out[t, h], lse[t, h] = float("nan"), float("nan")
            elif x == -INF and y == -INF:
                out[t, h], lse[t, h] = 0.0, -INF
            elif x == -INF:
                out[t, h], lse[t, h] = vb[t, h].double(), y
            elif y == -INF:
                out[t, h], lse[t, h] = va[t, h].double(), x
            else:
                m = max(x, y)
                wa, wb = math.exp(x - m), math.exp(y - m)
                out[t, h] = (wa * va[t, h].double() + wb * vb[t, h].double()) / (wa + wb)
                lse[t, h] = m + math.log(wa + wb)
    return out, lse


def test_lse_error_absolute_then_relative():
    """lse_error: absolute up to |ref| = 1024, relative to |ref| / 1024 beyond, non-finite
    reference entries matched exactly (the CPU's 1e-3 lse tolerance cannot hold in absolute terms
    at |lse| ~ 23,000, where one fp32 step is ~0.002)."""
    ref = torch.tensor([2.0, -500.0, 23003.0, -float("inf")], dtype=torch.float64)
    assert R.lse_error(ref.float(), ref) == pytest.approx(0.0, abs=1e-4)
    assert R.lse_error(ref + torch.tensor([5e-4, 0, 0, 0]), ref) == pytest.approx(5e-4)
    assert R.lse_error(ref + torch.tensor([0, 2e-3, 0, 0]), ref) == pytest.approx(2e-3)
    # 0.02 at 23,003 is 0.02 / (23003 / 1024) ~ 8.9e-4 relative to the limit's scale
    assert R.lse_error(ref + torch.tensor([0, 0, 0.02, 0]), ref) == pytest.approx(0.02 / (23003 / 1024))
    assert R.lse_error(ref.clone().index_fill_(0, torch.tensor([3]), 1.0), ref) == math.inf
    assert R.lse_error(torch.tensor([float("nan")]), torch.tensor([1.0])) == math.inf
    assert R.lse_error(torch.tensor([float("nan")]), torch.tensor([float("nan")])) == 0.0
    assert R.lse_error(torch.tensor([float("inf")]), torch.tensor([float("inf")])) == 0.0


def test_merge_edge_cases():
    g = torch.Generator().manual_seed(10)
    T, H, D = 8, 3, 16
    va = torch.randn(T, H, D, generator=g)
    vb = torch.randn(T, H, D, generator=g)
    a = torch.randn(T, H, generator=g) * 3
    b = torch.randn(T, H, generator=g) * 3
    a[0, 0] = INF; va[0, 0] = float("nan")       # prefix empty (+inf): suffix exactly
    b[1, 1] = -INF; vb[1, 1] = float("nan")      # suffix empty: prefix exactly
    a[2, 2] = INF; b[2, 2] = -INF                # both empty
    a[3, 0] = float("nan")                       # NaN propagates
    b[4, 1] = float("nan"); a[4, 1] = -INF       # NaN wins over an empty side
    a[5, 2] = 1e4; b[5, 2] = -1e4                # extreme weights
    a[6, 0] = b[6, 0] = 2.5                      # equal
    out, lse = R.merge_attn_states(va, a, vb, b)
    ref_out, ref_lse = _naive_merge(va, a, vb, b)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12, equal_nan=True)
    assert torch.equal(out[0, 0], vb[0, 0].double()) and lse[0, 0] == b[0, 0].double()
    assert torch.equal(out[1, 1], va[1, 1].double()) and lse[1, 1] == a[1, 1].double()
    assert torch.equal(out[2, 2], torch.zeros(D, dtype=torch.float64)) and lse[2, 2] == -INF
    assert torch.isnan(out[3, 0]).all() and torch.isnan(lse[3, 0])
    assert torch.isnan(out[4, 1]).all() and torch.isnan(lse[4, 1])


def test_merge_strided_views_and_consistency_with_decode():
    # merging the decode of two disjoint sets equals the decode of their union
    sel = list(range(16))
    cache, _ = _cache("bf16", 4, 4, 512, seed=11, fill_slots=sel)
    q = torch.randn(2, 3, 512, generator=torch.Generator().manual_seed(12)).to(torch.bfloat16)
    ia = torch.tensor([[0, 5, 9], [1, 2, 3]])
    ib = torch.tensor([[12, 13, -1], [15, 4, 7]])
    kw = dict(kv_format="bf16", softmax_scale=0.05)
    oa, la = R.sparse_mla_decode(q, cache, ia, **kw)
    ob, lb = R.sparse_mla_decode(q, cache, ib, **kw)
    ou, lu = R.sparse_mla_decode(q, cache, torch.cat([ia, ib], 1), **kw)
    # LSE as transposed [H, T] buffers, values as head-major buffers (non-contiguous views)
    la_t = la.T.contiguous().T
    ob_v = ob.transpose(0, 1).contiguous().transpose(0, 1)
    assert not la_t.is_contiguous() and not ob_v.is_contiguous()
    om, lm = R.merge_attn_states(oa, la_t, ob_v, lb)
    torch.testing.assert_close(om, ou, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lm, lu, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------


def _logical_rows(inp, slots, page_table, page_size, req):
    """Map global slots of request `req` back to logical rows via its page table (-1 if unmapped)."""
    pt = page_table[req].tolist()
    where = {p: lp for lp, p in enumerate(pt) if p >= 0}
    return [where[s // page_size] * page_size + s % page_size if s // page_size in where else None
            for s in slots]


@pytest.mark.parametrize("kind", ["v4_swa", "v4_c4", "v4_c128", "v32"])
def test_builder_structure(kind):
    lk = B.LAYER_KINDS[kind]
    batch, H, mtp = 3, 2, 1
    ctx_range = (130, 2600) if kind != "v4_c128" else (1000, 9000)
    inp = B.build_decode_inputs(kind, batch=batch, num_heads=H, context_len=ctx_range, mtp=mtp, seed=3,
                                topk=64 if kind in ("v4_c4", "v32") else None)
    T = batch * (1 + mtp)
    assert inp.q.shape == (T, H, lk.d_qk) and inp.q.dtype == torch.bfloat16
    assert inp.kv_format == lk.default_format and inp.layer_kind == kind
    assert inp.indices.dtype == torch.int32 and inp.indices.shape[0] == T
    assert inp.context_lens.dtype == torch.int32 and inp.context_lens.shape == (batch,)
    ctx = inp.context_lens.tolist()
    assert all(ctx_range[0] <= c <= ctx_range[1] for c in ctx)
    if lk.sink:
        assert inp.attn_sink.shape == (H,) and inp.attn_sink.dtype == torch.float32
    else:
        assert inp.attn_sink is None
    assert inp.softmax_scale == lk.softmax_scale

    sets = [("main", inp.kv_cache, inp.indices, inp.lengths, inp.page_table, lk.page_size)]
    if lk.compress_ratio is not None:
        assert inp.extra_indices.dtype == torch.int32 and inp.extra_lengths.dtype == torch.int32
        sets.append(("extra", inp.extra_kv_cache, inp.extra_indices, inp.extra_lengths,
                     inp.extra_page_table, lk.extra_page_size))
    else:
        assert inp.extra_kv_cache is None and inp.extra_indices is None and inp.extra_lengths is None
    if kind == "v4_c128":
        assert inp.extra_indices.shape[1] % 64 == 0

    total = 0
    for name, cache, idx, lens, pt, ps in sets:
        assert cache.shape[1] == ps
        num_slots = cache.shape[0] * ps
        # physical pages are not in logical order
        phys = [p for row in pt.tolist() for p in row if p >= 0]
        assert phys != sorted(phys)
        assert len(set(phys)) == len(phys) < cache.shape[0]  # a few unused pages exist
        selected = set()
        for t in range(T):
            b, j = divmod(t, 1 + mtp)
            pos = ctx[b] - 1 - mtp + j
            assert int(inp.positions[t]) == pos
            row = idx[t].tolist()
            n_valid = sum(s >= 0 for s in row)
            if lens is not None:
                # -1 padding exactly from lengths on
                assert all(s >= 0 for s in row[:int(lens[t])]) and all(s == -1 for s in row[int(lens[t]):])
            else:
                assert all(s == -1 for s in row[n_valid:])
            slots = [s for s in row if s >= 0]
            assert all(s < num_slots for s in slots)
            logical = _logical_rows(inp, slots, pt, ps, b)
            assert None not in logical  # every valid index points at a page of its own request
            assert len(set(logical)) == len(logical)
            selected.update(slots)
            total += len(slots)
            if name == "main" and lk.window is not None:
                assert logical == list(range(max(0, pos - 127), pos + 1))
            elif name == "main":  # v32 top-k
                assert len(logical) == min(64, pos + 1) and max(logical) <= pos
                assert logical != sorted(logical)  # random order
            elif kind == "v4_c4":
                nvis = (pos + 1) // 4
                assert len(logical) == min(64, nvis)
                assert all(4 * r + 3 <= pos for r in logical)
            else:
                assert logical == list(range((pos + 1) // 128))
                assert all(128 * r + 127 <= pos for r in logical)
        # selected rows hold data, every other row is NaN garbage
        rows = F.unpack_kv_cache(cache, inp.kv_format).reshape(num_slots, -1)
        sel = torch.zeros(num_slots, dtype=torch.bool)
        sel[list(selected)] = True
        assert not torch.isnan(rows[sel]).any()
        assert torch.isnan(rows[~sel]).any(dim=1).all()
    assert inp.num_selected == total
    assert inp.num_kv_bytes == total * F.kv_bytes_per_row(inp.kv_format, lk.d_qk)
    out, lse = inp.reference()
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


@pytest.mark.parametrize("kind", ["v4_swa", "v4_c4", "v4_c128", "v32"])
def test_builder_packed_rows(kind):
    """row_placement="packed": the same query tokens, lengths and selections as the default
    build, each distinct (request, row) in its own slot, back to back in (request, row) order,
    each token's indices ascending, no page tables; every other slot NaN garbage; the op matches
    the float64 reference on it."""
    import mla_ext

    kw = dict(batch=3, num_heads=4, context_len=(300, 2600) if kind != "v4_c128" else (1000, 9000), mtp=1, seed=4,
              topk=64 if kind in ("v4_c4", "v32") else None)
    a = B.build_decode_inputs(kind, **kw)
    p = B.build_decode_inputs(kind, row_placement="packed", **kw)
    for f in ("q", "lengths", "extra_lengths", "positions", "context_lens", "attn_sink"):
        x, y = getattr(a, f), getattr(p, f)
        assert (x is None and y is None) or torch.equal(x, y), f
    assert p.num_selected == a.num_selected and p.page_table is None and p.extra_page_table is None
    T = p.q.shape[0]
    sets = [(p.kv_cache, p.indices, a.indices)]
    if p.extra_kv_cache is not None:
        sets.append((p.extra_kv_cache, p.extra_indices, a.extra_indices))
    for cache, idx, idx_a in sets:
        assert torch.equal(idx >= 0, idx_a >= 0)
        used = torch.unique(idx[idx >= 0].long())
        assert torch.equal(used, torch.arange(used.numel()))  # dense from slot 0
        for t in range(T):  # each token's rows ascending, and as many as in the default build
            row = idx[t][idx[t] >= 0].long()
            assert bool((row[1:] > row[:-1]).all()) and row.numel() == int((idx_a[t] >= 0).sum())
        num_slots = cache.shape[0] * cache.shape[1]
        rows = F.unpack_kv_cache(cache, p.kv_format).reshape(num_slots, -1)
        sel = torch.zeros(num_slots, dtype=torch.bool)
        sel[used] = True
        assert not torch.isnan(rows[sel]).any() and torch.isnan(rows[~sel]).any(dim=1).all()
    ref_o, ref_l = p.reference()
    out = torch.full_like(p.q[..., :512], float("nan"))
    lse = torch.full(ref_l.shape, float("nan"))
    ws = mla_ext.DecodeWorkspace(T, p.q.shape[1], device="cpu")
    mla_ext.sparse_mla_decode(p.q, p.kv_cache, p.indices, output=out, lse=lse, workspace=ws.tensor, **p.op_kwargs())
    assert ((out.double() - ref_o).abs().max() / ref_o.abs().max()) < 2e-2
    assert (lse.double() - ref_l).abs().max() < 1e-2
    with pytest.raises(ValueError, match="row_placement"):
        B.build_decode_inputs(kind, row_placement="random", **kw)


def test_builder_defaults_formats_and_reproducibility():
    a = B.build_decode_inputs("v4_c4", batch=2, num_heads=2, context_len=(600, 900), seed=5)
    b = B.build_decode_inputs("v4_c4", batch=2, num_heads=2, context_len=(600, 900), seed=5)
    for f in ("q", "indices", "lengths", "extra_indices", "extra_lengths", "attn_sink", "context_lens"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    for ca, cb in ((a.kv_cache, b.kv_cache), (a.extra_kv_cache, b.extra_kv_cache)):
        n = ca.untyped_storage().nbytes()
        assert n == cb.untyped_storage().nbytes()
        assert torch.equal(ca.as_strided((n,), (1,), 0), cb.as_strided((n,), (1,), 0))
    assert a.indices.shape[1] == 128 and a.extra_indices.shape[1] == 512
    assert a.kv_cache.stride(0) == F.default_v4_page_stride(256)
    assert a.extra_kv_cache.stride(0) == F.default_v4_page_stride(64)
    c = B.build_decode_inputs("v32", batch=1, num_heads=2, context_len=100, kv_format="bf16")
    assert c.kv_cache.dtype == torch.bfloat16 and c.kv_cache.shape[-1] == 576
    assert c.indices.shape == (1, 2048) and c.lengths is None
    assert int((c.indices >= 0).sum()) == 100 and c.num_kv_bytes == 100 * 1152
    with pytest.raises(ValueError):
        B.build_decode_inputs("v4_swa", batch=1, num_heads=1, topk=5)
    with pytest.raises(ValueError):
        B.build_decode_inputs("v32", batch=1, num_heads=1, kv_format="fp8_ds_mla_v4")
    with pytest.raises(ValueError):
        B.build_decode_inputs("v4_swa", batch=1, num_heads=1, context_len=(1, 5), mtp=1)


def test_builder_short_contexts():
    # fewer compressed rows than top-k / no compressed row yet
    inp = B.build_decode_inputs("v4_c128", batch=2, num_heads=2, context_len=(5, 100), mtp=2, seed=1)
    assert inp.extra_indices.shape[1] == 64 and bool((inp.extra_indices == -1).all())
    assert int(inp.extra_lengths.sum()) == 0
    out, lse = inp.reference()
    assert torch.isfinite(out).all()
    inp = B.build_decode_inputs("v4_c4", batch=2, num_heads=2, context_len=(40, 60), seed=2)
    assert torch.equal(inp.extra_lengths.long(), (inp.positions + 1) // 4)
