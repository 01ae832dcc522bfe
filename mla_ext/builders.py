"""Realistic ``sparse_mla_decode`` inputs for one attention layer (DeepSeek V3.2 / V4).

:func:`build_decode_inputs` makes the query, the paged cache(s) and the per-token index sets that
an engine would hand the op for one decode step of one layer:

- ``"v4_swa"``  (V4, sliding-window-only layers): main set = the last 128 positions.
- ``"v4_c4"``   (V4, 4:1-compressed layers): main = sliding window, extra = indexer top-k of the
  compressed rows.
- ``"v4_c128"`` (V4, 128:1-compressed layers): main = sliding window, extra = all compressed rows.
- ``"v32"``     (V3.2 DSA): main = indexer top-k 2048 of all visible tokens.

Cache construction: only pages that hold selected rows are allocated, in a random physical order
across the cache, plus a few unused pages. Every byte not belonging to a selected row (unselected
rows of allocated pages, unused pages, V4 page padding) is garbage that decodes to NaN, so a
kernel that reads an unselected row produces NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch

from . import formats
from ._ops import int_arg
from .reference import softmax_scale_v32, softmax_scale_v4

__all__ = ["LayerKind", "LAYER_KINDS", "DecodeInputs", "build_decode_inputs"]


@dataclass(frozen=True)
class LayerKind:
    """Geometry of one layer kind.

    Attributes:
        name: key in :data:`LAYER_KINDS`.
        model: ``"DeepSeek-V4"`` or ``"DeepSeek-V3.2"``.
        d_qk: query/key width (V4 512 = 448 + 64 RoPE; V3.2 576 = 512 + 64 RoPE).
        default_format: default ``kv_format``.
        formats: accepted ``kv_format`` values.
        page_size: tokens per page of the main cache.
        extra_page_size: rows per page of the extra (compressed) cache, None without extra set.
        window: sliding-window length of the main set (positions), None for a top-k main set.
        topk: default top-k (main set for v32, extra set for v4_c4), None if not top-k.
        compress_ratio: positions per compressed row of the extra set (4 or 128), None if none.
        sink: whether the layer has a per-head attention sink.
    """

    name: str
    model: str
    d_qk: int
    default_format: str
    formats: Tuple[str, ...]
    page_size: int
    extra_page_size: Optional[int]
    window: Optional[int]
    topk: Optional[int]
    compress_ratio: Optional[int]
    sink: bool

    @property
    def softmax_scale(self) -> float:
        return softmax_scale_v4() if self.model == "DeepSeek-V4" else softmax_scale_v32()


_V4_FORMATS = ("fp8_ds_mla_v4", "bf16", "fp8_ds_mla_v4_fnuz")
_V32_FORMATS = ("fp8_ds_mla", "bf16", "fp8_ds_mla_fnuz")

LAYER_KINDS = {
    "v4_swa": LayerKind("v4_swa", "DeepSeek-V4", 512, "fp8_ds_mla_v4", _V4_FORMATS,
                        page_size=256, extra_page_size=None, window=128, topk=None,
                        compress_ratio=None, sink=True),
    "v4_c4": LayerKind("v4_c4", "DeepSeek-V4", 512, "fp8_ds_mla_v4", _V4_FORMATS,
                       page_size=256, extra_page_size=64, window=128, topk=512,
                       compress_ratio=4, sink=True),
    "v4_c128": LayerKind("v4_c128", "DeepSeek-V4", 512, "fp8_ds_mla_v4", _V4_FORMATS,
                         page_size=256, extra_page_size=2, window=128, topk=None,
                         compress_ratio=128, sink=True),
    "v32": LayerKind("v32", "DeepSeek-V3.2", 576, "fp8_ds_mla", _V32_FORMATS,
                     page_size=64, extra_page_size=None, window=None, topk=2048,
                     compress_ratio=None, sink=False),
}


@dataclass
class DecodeInputs:
    """Inputs of one ``sparse_mla_decode`` call (one layer, one decode step).

    Tensors (T = num_tokens = batch * (1 + mtp), H = num_heads), all on the requested device:

    - ``q``: ``[T, H, d_qk]`` ``dtype_q`` (bf16).
    - ``kv_cache``: main cache in ``kv_format`` (see :mod:`mla_ext.formats`).
    - ``indices``: ``[T, W]`` int32 global slot ids, -1 padded.
    - ``lengths``: ``[T]`` int32 valid entries of ``indices`` (sliding-window main sets), or None
      (v32: validity given by -1 only).
    - ``extra_kv_cache`` / ``extra_indices [T, W2]`` int32 / ``extra_lengths [T]`` int32: V4
      compressed set, or None.
    - ``attn_sink``: ``[H]`` float32 (V4) or None.
    - ``context_lens``: ``[batch]`` int32 tokens in each request's context (query tokens included).
    - ``positions``: ``[T]`` int64 position of each query token.
    - ``page_table`` / ``extra_page_table`` (None with ``row_placement="packed"``):
      ``[batch, max_logical_pages]`` int32 physical page
      of each logical page of a request (-1: not allocated because no selected row lives there).

    Scalars: ``softmax_scale``; ``kv_format``; ``layer_kind``; ``num_selected`` (valid entries
    over both sets); ``num_kv_bytes`` (``num_selected`` x bytes per row, see
    :func:`mla_ext.formats.kv_bytes_per_row`; bf16 rows count ``2 * d_qk``).
    """

    q: torch.Tensor
    kv_cache: torch.Tensor
    indices: torch.Tensor
    lengths: Optional[torch.Tensor]
    extra_kv_cache: Optional[torch.Tensor]
    extra_indices: Optional[torch.Tensor]
    extra_lengths: Optional[torch.Tensor]
    attn_sink: Optional[torch.Tensor]
    softmax_scale: float
    kv_format: str
    layer_kind: str
    num_kv_bytes: int
    num_selected: int
    context_lens: torch.Tensor
    positions: Optional[torch.Tensor] = None
    page_table: Optional[torch.Tensor] = None
    extra_page_table: Optional[torch.Tensor] = None

    @property
    def num_tokens(self) -> int:
        return int(self.q.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.q.shape[1])

    def op_kwargs(self) -> dict:
        """Keyword arguments shared by the op and :func:`mla_ext.reference.sparse_mla_decode`
        (everything except ``q``, ``kv_cache``, ``indices``)."""
        return dict(
            kv_format=self.kv_format,
            softmax_scale=self.softmax_scale,
            lengths=self.lengths,
            extra_kv_cache=self.extra_kv_cache,
            extra_indices=self.extra_indices,
            extra_lengths=self.extra_lengths,
            attn_sink=self.attn_sink,
        )

    def reference(self, dtype: torch.dtype = torch.float64):
        """Run :func:`mla_ext.reference.sparse_mla_decode` on these inputs -> (out, lse)."""
        from .reference import sparse_mla_decode

        return sparse_mla_decode(self.q, self.kv_cache, self.indices, dtype=dtype, **self.op_kwargs())


# ----------------------------------------------------------------------------------------------
# index sets (logical rows per token, -1 = none); all vectorised over tokens
# ----------------------------------------------------------------------------------------------

_KEY_CHUNK = 1 << 25  # elements of random keys generated at once


def _window_rows(pos: torch.Tensor, window: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Last `window` positions <= pos, ascending; -> (rows [T, window], count [T])."""
    i = torch.arange(window, device=pos.device)
    start = (pos - window + 1).clamp_min(0)
    count = torch.minimum(pos + 1, torch.full_like(pos, window))
    rows = start[:, None] + i[None, :]
    rows = torch.where(i[None, :] < count[:, None], rows, torch.full_like(rows, -1))
    return rows, count


def _all_rows(nvis: torch.Tensor, width: int) -> torch.Tensor:
    i = torch.arange(width, device=nvis.device)
    rows = i[None, :].expand(nvis.shape[0], width)
    return torch.where(i[None, :] < nvis[:, None], rows, torch.full_like(rows, -1))


def _random_subsets(nvis: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """Per token a uniformly random subset of min(k, nvis[t]) rows of [0, nvis[t]) in random
    order (as an indexer emits them in score order), then -1 padding; -> [T, k] int64."""
    T = nvis.shape[0]
    device = nvis.device
    out = torch.full((T, k), -1, dtype=torch.int64, device=device)
    maxv = int(nvis.max()) if T else 0
    if maxv == 0 or k == 0:
        return out
    cols = max(maxv, k)
    col = torch.arange(cols, device=device)
    step = max(1, _KEY_CHUNK // cols)
    for t0 in range(0, T, step):
        t1 = min(T, t0 + step)
        # int64 keys make ties (and so device-dependent tie order) practically impossible
        keys = torch.randint(0, 1 << 62, (t1 - t0, cols), generator=gen, device=device, dtype=torch.int64)
        keys = torch.where(col[None, :] < nvis[t0:t1, None], keys, torch.full_like(keys, -1))
        top, arg = torch.topk(keys, k, dim=1)  # descending random keys = random order
        out[t0:t1] = torch.where(top >= 0, arg, torch.full_like(arg, -1))
    return out


def _random_kv(n: int, d: int, gen: torch.Generator, device) -> torch.Tensor:
    """[n, d] float32 ~ N(0, 1) with 4 outliers per row (x 8..32)."""
    x = torch.randn((n, d), generator=gen, device=device)
    pos = torch.randint(0, d, (n, 4), generator=gen, device=device)
    fac = torch.rand((n, 4), generator=gen, device=device) * 24.0 + 8.0
    x.scatter_(1, pos, x.gather(1, pos) * fac)
    return x


def _build_cache_set(sel, req, batch, page_size, kv_format, d_qk, gen_struct, gen_bulk, device, packed=False):
    """Allocate a cache holding the selected logical rows and map them to slots.

    sel [T, W] int64 logical rows (-1: none) of request req[t]. Returns
    (kv_cache, indices [T, W] int32, page_table [batch, K] int32 (None when packed), num_valid).
    packed: each distinct (request, row) its own slot, back to back in (request, row) order, and
    each token's valid indices in ascending slot order (the -1 padding stays at the end).
    """
    valid = sel >= 0
    lpage = sel.clamp_min(0) // page_size
    num_lp = int(lpage[valid].max()) + 1 if bool(valid.any()) else 1
    key = req[:, None] * num_lp + lpage
    uniq, inv = torch.unique(key[valid], return_inverse=True)
    used = uniq.numel()
    num_pages = used + 3 + used // 32  # a few never-used garbage pages
    # (drawn in both placements, so that both draw the same q, selections and data streams)
    perm = torch.randperm(num_pages, generator=gen_struct).to(device)
    page_table = None
    if packed:
        key_r = req[:, None] * (num_lp * page_size) + sel.clamp_min(0)
        uniq_r, slots = torch.unique(key_r[valid], return_inverse=True)
        used = -(-uniq_r.numel() // page_size)
        num_pages = used + 3 + used // 32
    else:
        phys = perm[:used]
        slots = phys[inv] * page_size + sel[valid] % page_size
        page_table = torch.full((batch, num_lp), -1, dtype=torch.int32, device=device)
        page_table[uniq // num_lp, uniq % num_lp] = phys.to(torch.int32)
    indices = torch.full(sel.shape, -1, dtype=torch.int64, device=device)
    indices[valid] = slots
    if packed:  # ascending, valid entries first (they already are: only their order changes)
        big = torch.iinfo(torch.int64).max
        indices = torch.where(valid, indices, big).sort(dim=1).values
        indices[indices == big] = -1
    if num_pages * page_size >= 2**31:
        raise ValueError("cache too large for int32 slot ids")

    cache = formats.alloc_kv_cache(kv_format, num_pages, page_size, d_qk, device=device)
    fill = torch.unique(slots)  # each selected row written once
    chunk = max(1, (1 << 24) // d_qk)
    for i in range(0, fill.numel(), chunk):
        part = fill[i:i + chunk]
        formats.write_kv_rows(cache, kv_format, part, _random_kv(part.numel(), d_qk, gen_bulk, device))
    return cache, indices.to(torch.int32), page_table, int(valid.sum())


def build_decode_inputs(
    layer_kind: str,
    *,
    batch: int,
    num_heads: int,
    context_len: Union[int, Tuple[int, int]] = (1024, 4096),
    mtp: int = 0,
    kv_format: Optional[str] = None,
    topk: Optional[int] = None,
    device="cpu",
    seed: int = 0,
    dtype_q: torch.dtype = torch.bfloat16,
    row_placement: str = "pages",
) -> DecodeInputs:
    """Build realistic decode inputs for one layer of DeepSeek V4 or V3.2.

    Args:
        layer_kind: ``"v4_swa"``, ``"v4_c4"``, ``"v4_c128"`` or ``"v32"`` (see :data:`LAYER_KINDS`).
        batch: number of requests.
        num_heads: query heads on this GPU (H).
        context_len: per-request context length in tokens (query tokens included), drawn uniformly
            from the inclusive range ``(lo, hi)`` (or a fixed int). Must be >= 1 + mtp.
        mtp: extra speculative (multi-token-prediction) query tokens per request; a request has
            ``1 + mtp`` query tokens at positions ``ctx - 1 - mtp + j``, each seeing positions
            <= its own.
        kv_format: cache format; default the layer's (V4 ``"fp8_ds_mla_v4"``, V3.2
            ``"fp8_ds_mla"``); ``"bf16"`` and the layer's e4m3fnuz twin (``"fp8_ds_mla_v4_fnuz"``,
            ``"fp8_ds_mla_fnuz"``: the caches gfx942 engines may write) also accepted.
        topk: top-k width for v4_c4 (default 512; Flash 512, Pro 1024) and v32 (default 2048);
            not accepted for v4_swa / v4_c128.
        device: where the tensors live.
        seed: seeds the generators. Structure (context lengths, page order, sinks) comes from a
            CPU generator; bulk random data (q, KV rows, top-k choices) from a generator on
            ``device`` seeded with ``seed`` (reproducible per device type).
        dtype_q: dtype of q; only ``torch.bfloat16`` (the one q dtype ``sparse_mla_decode``
            takes), others raise ValueError.
        row_placement: ``"pages"`` (default): whole logical pages in a random physical order,
            as a paged engine's cache after some churn (the module's Cache construction).
            ``"packed"``: the selected rows of each set back to back in (request, row) order, one
            slot each (rows that several query tokens select stored once), as if the cache held
            nothing else, and each token's indices in ascending slot order (a top-k set's random
            order sorted; the -1 padding stays at the end); ``page_table`` / ``extra_page_table``
            are then None. Same q, lengths and selected rows as the default build, but a row's
            values differ between the two (the data are drawn in slot order). For measuring how
            much of a call's time the rows' scatter costs; not a layout engines write.

    Sets (per query token t at position p):
        main, v4_*: sliding window = positions max(0, p-127)..p ascending, page_size 256,
        ``lengths`` = count, -1 after. main, v32: random top-k of positions [0, p] in random order,
        page_size 64, width = topk, -1 padding at the end, ``lengths`` None.
        extra, v4_c4: random top-k of compressed rows r with 4r+3 <= p (page_size 64), width topk,
        -1 padded, ``extra_lengths`` = count. extra, v4_c128: all rows r with 128r+127 <= p
        ascending (page_size 2), width = max count rounded up to a multiple of 64 (>= 64),
        ``extra_lengths`` = count.

    Returns:
        :class:`DecodeInputs`. q ~ N(0, 1); KV rows ~ N(0, 1) with 4 outliers (x 8..32) per row;
        sink ~ N(0, 1) float32 per head (V4).

    Raises:
        TypeError: batch, num_heads, mtp, topk or context_len (or an item of its pair) is not an
            integer (a float, a bool, a tensor).
        ValueError: an unknown layer_kind, kv_format or row_placement; topk for a layer without
            one, or < 1; batch or num_heads < 1, mtp < 0; context_len not an int or a pair, or a
            range without 1 + mtp <= lo <= hi; dtype_q other than bf16.
    """
    if layer_kind not in LAYER_KINDS:
        raise ValueError(f"layer_kind must be one of {tuple(LAYER_KINDS)}, got {layer_kind!r}")
    kind = LAYER_KINDS[layer_kind]
    kv_format = kind.default_format if kv_format is None else kv_format
    if kv_format not in kind.formats:
        raise ValueError(f"kv_format for {layer_kind} must be one of {kind.formats}, got {kv_format!r}")
    if topk is not None and kind.topk is None:
        raise ValueError(f"topk is not a parameter of layer kind {layer_kind!r}")
    fn = "build_decode_inputs"
    k_top = kind.topk if topk is None else int_arg(fn, "topk", topk)
    batch, num_heads, mtp = (int_arg(fn, n, v) for n, v in (("batch", batch), ("num_heads", num_heads), ("mtp", mtp)))
    if batch < 1 or num_heads < 1 or mtp < 0:
        raise ValueError(f"{fn}: batch and num_heads must be >= 1 and mtp >= 0, got batch={batch}, "
                         f"num_heads={num_heads}, mtp={mtp}")
    if k_top is not None and k_top < 1:
        raise ValueError(f"{fn}: topk must be >= 1, got {k_top}")
    if isinstance(context_len, (tuple, list)):
        if len(context_len) != 2:
            raise ValueError(f"{fn}: context_len must be an int or a (lo, hi) pair, got {context_len!r}")
        lo, hi = (int_arg(fn, "context_len", v) for v in context_len)
    else:
        lo = hi = int_arg(fn, "context_len", context_len)
    if lo < 1 + mtp or hi < lo:
        raise ValueError(f"{fn}: context_len range {(lo, hi)} must satisfy 1 + mtp <= lo <= hi")
    if dtype_q != torch.bfloat16:
        raise ValueError(f"{fn}: dtype_q must be torch.bfloat16 (the q dtype sparse_mla_decode takes), got {dtype_q}")
    if row_placement not in ("pages", "packed"):
        raise ValueError(f"row_placement must be 'pages' or 'packed', got {row_placement!r}")
    packed = row_placement == "packed"
    device = torch.device(device)

    g = torch.Generator().manual_seed(seed)
    gb = g if device.type == "cpu" else torch.Generator(device=device).manual_seed(seed)

    ctx = torch.randint(lo, hi + 1, (batch,), generator=g).to(device)
    nq = 1 + mtp
    T = batch * nq
    req = torch.arange(batch, device=device).repeat_interleave(nq)
    j = torch.arange(nq, device=device).repeat(batch)
    pos = ctx[req] - 1 - mtp + j  # int64 [T]

    d_qk = kind.d_qk
    attn_sink = torch.randn((num_heads,), generator=g).to(device) if kind.sink else None

    # main set
    if kind.window is not None:
        sel, count = _window_rows(pos, kind.window)
        lengths = count.to(torch.int32)
    else:
        sel = _random_subsets(pos + 1, k_top, gb)
        lengths = None
    kv_cache, indices, page_table, n_main = _build_cache_set(
        sel, req, batch, kind.page_size, kv_format, d_qk, g, gb, device, packed)

    # extra set
    extra_kv_cache = extra_indices = extra_lengths = extra_page_table = None
    n_extra = 0
    if kind.compress_ratio is not None:
        r = kind.compress_ratio
        nvis = (pos + 1) // r  # rows r with r*row + (r-1) <= p
        if kind.topk is not None:
            sel_x = _random_subsets(nvis, k_top, gb)
            cnt = torch.clamp(nvis, max=k_top)
        else:
            width = max(64, -(-int(nvis.max()) // 64) * 64)
            sel_x = _all_rows(nvis, width)
            cnt = nvis
        extra_lengths = cnt.to(torch.int32)
        extra_kv_cache, extra_indices, extra_page_table, n_extra = _build_cache_set(
            sel_x, req, batch, kind.extra_page_size, kv_format, d_qk, g, gb, device, packed)

    q = torch.randn((T, num_heads, d_qk), generator=gb, device=device).to(dtype_q)
    num_selected = n_main + n_extra
    return DecodeInputs(
        q=q,
        kv_cache=kv_cache,
        indices=indices,
        lengths=lengths,
        extra_kv_cache=extra_kv_cache,
        extra_indices=extra_indices,
        extra_lengths=extra_lengths,
        attn_sink=attn_sink,
        softmax_scale=kind.softmax_scale,
        kv_format=kv_format,
        layer_kind=layer_kind,
        num_kv_bytes=num_selected * formats.kv_bytes_per_row(kv_format, d_qk),
        num_selected=num_selected,
        context_lens=ctx.to(torch.int32),
        positions=pos,
        page_table=page_table,
        extra_page_table=extra_page_table,
    )
