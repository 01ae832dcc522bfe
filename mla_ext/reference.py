"""Pure-PyTorch reference (test oracle) for ``sparse_mla_decode`` and ``merge_attn_states``.

Float64 by default, written for clarity and bounded memory, not speed: one query token at a time,
vectorised over heads and that token's selected rows. Semantics follow DESIGN.md sections 3-4.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from . import formats

__all__ = [
    "sparse_mla_decode",
    "merge_attn_states",
    "merge_attn_states_n",
    "fp8_saturate",
    "softmax_scale_v32",
    "softmax_scale_v4",
    "decode_tolerances",
    "lse_error",
    "LSE_ABS_LIMIT",
    "D_V",
]

#: Value width of every DeepSeek MLA layout (V3.2: the 512 latent dims; V4: all 512 dims).
D_V = 512


def softmax_scale_v32() -> float:
    """DeepSeek V3.2 softmax scale: ``192 ** -0.5 * mscale ** 2``.

    qk_head_dim 192 (128 nope + 64 rope of the un-absorbed heads), YaRN
    mscale = 0.1 * mscale_all_dim(1.0) * ln(factor 40) + 1. (Not 576 ** -0.5.)
    """
    mscale = 0.1 * 1.0 * math.log(40.0) + 1.0
    return 192.0 ** -0.5 * mscale * mscale


def softmax_scale_v4() -> float:
    """DeepSeek V4 softmax scale: ``512 ** -0.5``."""
    return 512.0 ** -0.5


def decode_tolerances(device_type: str, kv_format: str) -> Tuple[float, float]:
    """Tolerances of ``mla_ext.sparse_mla_decode`` against :func:`sparse_mla_decode` (float64):
    ``(out_tol, lse_tol)`` with out_tol bounding max |out - ref| / max |ref| over the compared
    tokens and lse_tol bounding :func:`lse_error` (natural log: max |lse - ref| over finite
    reference entries, relative to |ref| / 1024 where |ref| > 1024, since fp32 carries ~7 digits).

    The one source for the test suite and ``mla-ext decode``. The output is bf16 (rounding
    2^-8 relative, so 1.6e-2 of max |ref|). CPU lse: fp32 throughout (1e-3). GPU: keys enter the
    tensor cores exactly (bf16 caches and V4 e4m3 x power-of-two keys are bf16 values; V3.2's
    fp32 scales are applied to the partial scores after the MMA) and only the probabilities are
    rounded to bf16, so 1e-2 for every format.

    Args:
        device_type: ``"cpu"`` or a GPU type (``"cuda"``; ROCm tensors report ``"cuda"`` too).
        kv_format: ``"bf16"``, ``"fp8_ds_mla"``, ``"fp8_ds_mla_v4"`` or their ``_fnuz`` twins.
    """
    if device_type == "cpu":
        return 1.6e-2, 1e-3
    return 1.6e-2, 1e-2


#: Above this |lse| the lse tolerance is relative (:func:`lse_error`): an fp32 lse of 23,000 is
#: only good to ~0.002, one unit in its last place, past the CPU's absolute 1e-3.
LSE_ABS_LIMIT = 1024.0


def lse_error(lse: torch.Tensor, ref: torch.Tensor) -> float:
    """Error measure the lse tolerance of :func:`decode_tolerances` bounds: the largest
    ``|lse - ref| / max(1, |ref| / LSE_ABS_LIMIT)`` over entries where ``ref`` is finite (0.0
    where none is; inf where ``lse`` is not finite there); absolute up to |ref| = 1024, relative
    beyond. Where ``ref`` is infinite or NaN, ``lse`` must be the same value (else the error is
    inf). Any shapes that broadcast; compared in float64 on the CPU.

    Raises:
        RuntimeError: if the shapes do not broadcast (torch's error).
    """
    lse = lse.detach().double().cpu()
    ref = ref.detach().double().cpu()
    lse, ref = torch.broadcast_tensors(lse, ref)
    fin = torch.isfinite(ref)
    same = (lse[~fin] == ref[~fin]) | (torch.isnan(lse[~fin]) & torch.isnan(ref[~fin]))
    if not bool(same.all()):
        return math.inf
    if not bool(fin.any()):
        return 0.0
    scale = (ref[fin].abs() / LSE_ABS_LIMIT).clamp_min(1.0)
    err = ((lse[fin] - ref[fin]).abs() / scale).nan_to_num(nan=math.inf)  # NaN or inf where ref is finite: inf
    return err.max().item()


def _valid_slots(indices_row: torch.Tensor, num_slots: int, length: Optional[int]) -> torch.Tensor:
    row = indices_row.to(torch.int64)
    ok = (row >= 0) & (row < num_slots)
    if length is not None:
        ok &= torch.arange(row.numel(), device=row.device) < length
    return row[ok]


def _num_slots(cache: torch.Tensor) -> int:
    return int(cache.shape[0]) * int(cache.shape[1])


def sparse_mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    *,
    kv_format: str,
    softmax_scale: float,
    lengths: Optional[torch.Tensor] = None,
    extra_kv_cache: Optional[torch.Tensor] = None,
    extra_indices: Optional[torch.Tensor] = None,
    extra_lengths: Optional[torch.Tensor] = None,
    attn_sink: Optional[torch.Tensor] = None,
    dtype: torch.dtype = torch.float64,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Reference sparse MLA decode over a paged latent KV cache (DeepSeek V3.2 / V4).

    Args:
        q: ``[num_tokens, num_heads, d_qk]`` any float dtype (bf16 in practice), any strides.
        kv_cache: paged cache in ``kv_format`` (see :mod:`mla_ext.formats`):
            bf16 ``[num_pages, page_size, d_qk]`` (d_qk 576 or 512), fp8_ds_mla[_fnuz] (V3.2,
            d_qk 576) ``[num_pages, page_size, 656]`` uint8, fp8_ds_mla_v4[_fnuz] (V4, d_qk 512)
            uint8 view ``[num_pages, page_size, 584]`` with a padded page stride (FP8 caches may
            also be int8 or the format's float8 type, read as bytes, as the op accepts); a
            singleton head dim is accepted. Only selected slots are read (others may hold NaN).
        indices: ``[num_tokens, W]`` integer global slot ids (page * page_size + offset).
            An entry is skipped when < 0, >= num_pages * page_size, or at column >= lengths[t].
        kv_format: ``"bf16"``, ``"fp8_ds_mla"``, ``"fp8_ds_mla_v4"``, or the e4m3fnuz twins
            ``"fp8_ds_mla_fnuz"`` / ``"fp8_ds_mla_v4_fnuz"`` (applies to both sets). FP8 bytes are
            decoded exactly (e4m3fnuz: 0x80 is NaN, 0x7F / 0xFF are +-240).
        softmax_scale: float multiplier of q.K (V3.2: :func:`softmax_scale_v32`,
            V4: :func:`softmax_scale_v4`).
        lengths: optional ``[num_tokens]`` integer count of leading columns of ``indices`` to use.
        extra_kv_cache, extra_indices ``[num_tokens, W2]``, extra_lengths ``[num_tokens]``: optional
            second set (V4 compressed rows), own page size, same format and rules; it joins the
            main set in one softmax.
        attn_sink: optional ``[num_heads]`` float logit per head (V4): adds ``exp(sink - m)`` to
            the softmax denominator only. -inf = no sink; +inf gives output 0.
        dtype: compute and result dtype (float64 default).

    Returns:
        ``(out [num_tokens, num_heads, 512], lse [num_tokens, num_heads])`` in ``dtype``, where
        out = sum_i exp(s_i - m) V_i / (l + exp(sink - m)), lse = m + log(l) (natural log, sink
        excluded), s_i = softmax_scale * <q, K_i[:d_qk]>, V_i = K_i[:512]. A token with no valid
        entry, or a (token, head) whose every score is -inf, gets out 0 and lse -inf (a -inf
        score weighs 0); a +inf or NaN score gives NaN. Duplicate entries count once each.
    """
    formats._check_format(kv_format)
    c_main = formats._check_cache(kv_cache, kv_format, "kv_cache")
    d_qk = formats._cache_d_qk(c_main, kv_format)
    if q.dim() != 3 or q.shape[-1] != d_qk:
        raise ValueError(f"q: expected [num_tokens, num_heads, {d_qk}], got {tuple(q.shape)}")
    T, H, _ = q.shape
    if indices.dim() != 2 or indices.shape[0] != T:
        raise ValueError(f"indices: expected [{T}, W], got {tuple(indices.shape)}")
    if lengths is not None and lengths.reshape(-1).shape[0] != T:
        raise ValueError(f"lengths: expected [{T}], got {tuple(lengths.shape)}")
    if (extra_kv_cache is None) != (extra_indices is None):
        raise ValueError("extra_kv_cache and extra_indices must be given together")
    if extra_lengths is not None and extra_indices is None:
        raise ValueError("extra_lengths given without extra_indices")
    if extra_kv_cache is not None:
        c_extra = formats._check_cache(extra_kv_cache, kv_format, "extra_kv_cache")
        if formats._cache_d_qk(c_extra, kv_format) != d_qk:
            raise ValueError("extra_kv_cache: row width differs from kv_cache")
        if extra_indices.dim() != 2 or extra_indices.shape[0] != T:
            raise ValueError(f"extra_indices: expected [{T}, W2], got {tuple(extra_indices.shape)}")
        if extra_lengths is not None and extra_lengths.reshape(-1).shape[0] != T:
            raise ValueError(f"extra_lengths: expected [{T}], got {tuple(extra_lengths.shape)}")
    if attn_sink is not None and attn_sink.reshape(-1).shape[0] != H:
        raise ValueError(f"attn_sink: expected [{H}], got {tuple(attn_sink.shape)}")

    device = q.device
    out = torch.zeros((T, H, D_V), dtype=dtype, device=device)
    lse = torch.full((T, H), float("-inf"), dtype=dtype, device=device)
    if T == 0 or H == 0:
        return out, lse

    # Small per-token metadata on the host (the loop is per token anyway).
    idx_main = indices.to(device)
    idx_extra = None if extra_indices is None else extra_indices.to(device)
    len_main = None if lengths is None else [int(v) for v in lengths.reshape(-1).tolist()]
    len_extra = None if extra_lengths is None else [int(v) for v in extra_lengths.reshape(-1).tolist()]
    n_main = _num_slots(c_main)
    n_extra = _num_slots(c_extra) if extra_kv_cache is not None else 0
    sink = None if attn_sink is None else attn_sink.reshape(-1).to(device=device, dtype=dtype)

    for t in range(T):
        parts = []
        sl = _valid_slots(idx_main[t], n_main, None if len_main is None else len_main[t])
        if sl.numel():
            parts.append(formats.gather_kv_rows(kv_cache, kv_format, sl, dtype))
        if extra_kv_cache is not None:
            sl = _valid_slots(
                idx_extra[t], n_extra, None if len_extra is None else len_extra[t]
            )
            if sl.numel():
                parts.append(formats.gather_kv_rows(extra_kv_cache, kv_format, sl, dtype))
        if not parts:
            continue  # empty row: out 0, lse -inf
        k = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)  # [n, d_qk]
        s = (q[t].to(dtype) @ k.T) * softmax_scale  # [H, n]
        m = s.amax(dim=1)  # [H]
        # every score -inf: an empty row (-inf scores weigh 0; the max is read as 0 for the weights)
        dead = torch.isneginf(m)
        m_use = torch.where(dead, torch.zeros_like(m), m)
        p = torch.exp(s - m_use[:, None])
        l = p.sum(dim=1)
        num = p @ k[:, :D_V]  # [H, 512]
        denom = l
        if sink is not None:
            denom = l + torch.exp(sink - m_use)  # sink -inf adds 0; +inf gives inf
        o = num / denom[:, None]
        if sink is not None:
            o = torch.where(torch.isposinf(sink)[:, None], torch.zeros_like(o), o)
        out[t] = torch.where(dead[:, None], num * 0, o)  # 0 (NaN from an inf / NaN value, as the kernels)
        lse[t] = torch.where(dead, torch.full_like(m, float("-inf")), m + torch.log(l))
    return out, lse


def merge_attn_states(
    prefix_output: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix_output: torch.Tensor,
    suffix_lse: torch.Tensor,
    dtype: torch.dtype = torch.float64,
    *,
    prefill_tokens_with_context: Optional[int] = None,
    output_scale: Optional[float] = None,
    fp8_dtype: Optional[torch.dtype] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Reference merge of two partial attention results over disjoint key sets (DESIGN.md §3).

    Args:
        prefix_output, suffix_output: ``[num_tokens, num_heads, head_size]`` any float dtype, any
            strides.
        prefix_lse, suffix_lse: ``[num_tokens, num_heads]`` natural-log LSE, any strides. +inf
            means "empty" (treated as -inf).
        dtype: result dtype (float64 default).
        prefill_tokens_with_context: optional int; tokens ``t >=`` it take the suffix's values and
            LSE as they are (no merge, the prefix is ignored).
        output_scale: optional float (or one-element tensor): the FP8 output path. The merged
            values are divided by it and saturated to +-``torch.finfo(fp8_dtype).max`` (448 for
            float8_e4m3fn, 240 for float8_e4m3fnuz; NaN stays NaN), *not* rounded to FP8, so
            callers compare within FP8 rounding. LSEs are not scaled.
        fp8_dtype: the FP8 output dtype (required with ``output_scale``).

    Returns:
        ``(out [num_tokens, num_heads, head_size], out_lse [num_tokens, num_heads])`` in ``dtype``.
        out = (wa*vA + wb*vB) / (wa + wb), wa = exp(a - m), wb = exp(b - m), m = max(a, b),
        out_lse = m + log(wa + wb). One side empty: the other side is selected exactly (NaN in
        the empty side's values cannot leak). Both empty: 0 and -inf. A NaN LSE on either side
        gives NaN output and NaN LSE.
    """
    out, out_lse = _merge2(prefix_output, prefix_lse, suffix_output, suffix_lse, dtype)
    if prefill_tokens_with_context is not None:
        p = max(0, int(prefill_tokens_with_context))
        out[p:] = suffix_output[p:].to(dtype)
        out_lse[p:] = suffix_lse[p:].to(dtype)
    if output_scale is not None:
        out = fp8_saturate(out, output_scale, fp8_dtype)
    return out, out_lse


def fp8_saturate(x: torch.Tensor, scale, fp8_dtype: torch.dtype) -> torch.Tensor:
    """``x / scale`` clamped to +-``torch.finfo(fp8_dtype).max`` (NaN kept), in ``x``'s dtype.

    The reference of a scaled FP8 output before its rounding to FP8 (round to nearest even)."""
    if fp8_dtype not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        raise ValueError(f"fp8_dtype must be float8_e4m3fn or float8_e4m3fnuz, got {fp8_dtype}")
    fmax = float(torch.finfo(fp8_dtype).max)
    scale = float(scale.reshape(-1)[0]) if isinstance(scale, torch.Tensor) else float(scale)
    y = x / scale
    return torch.where(torch.isnan(y), y, y.clamp(-fmax, fmax))


def merge_attn_states_n(
    values: torch.Tensor,
    lses: torch.Tensor,
    dtype: torch.dtype = torch.float64,
    attn_sink: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Reference S-way merge of partial attention results over disjoint key sets.

    Args:
        values: ``[num_states, num_tokens, num_heads, head_size]`` any float dtype, any strides.
        lses: ``[num_states, num_tokens, num_heads]`` natural-log LSE; +-inf = empty state.
        dtype: result dtype (float64 default).
        attn_sink: optional ``[num_heads]`` sink logit per head: adds ``exp(sink - m)`` to the
            denominator (not to out_lse), as :func:`sparse_mla_decode` does.

    Returns:
        ``(out [num_tokens, num_heads, head_size], out_lse [num_tokens, num_heads])``: over the
        non-empty states, m = max lse, w_s = exp(lse_s - m), out = sum w_s v_s / (sum w_s +
        exp(sink - m)), out_lse = m + log(sum w_s). Empty states' values never enter (NaN there
        cannot leak); exactly one non-empty state without a sink is selected as is; all empty
        gives 0 and -inf; any NaN LSE gives NaN output and LSE.
    """
    if values.dim() != 4 or lses.dim() != 3 or values.shape[:3] != lses.shape or values.shape[0] < 1:
        raise ValueError(f"values [S, T, H, D] and lses [S, T, H] with S >= 1 expected, got "
                         f"{tuple(values.shape)} and {tuple(lses.shape)}")
    v = values.to(dtype)
    lse = lses.to(dtype)
    lse = torch.where(torch.isposinf(lse), torch.full_like(lse, float("-inf")), lse)
    nan = torch.isnan(lse).any(0)
    live = ~torch.isneginf(lse) & ~torch.isnan(lse)  # [S, T, H]
    count = live.sum(0)
    m = torch.where(live, lse, torch.full_like(lse, float("-inf"))).amax(0)
    m_safe = torch.where(count > 0, m, torch.zeros_like(m))
    w = torch.where(live, torch.exp(lse - m_safe), torch.zeros_like(lse))
    wsum = w.sum(0)
    acc = (w[..., None] * torch.where(live[..., None], v, torch.zeros_like(v))).sum(0)
    denom = wsum.clamp_min(1.0)  # wsum >= 1 wherever count > 0
    sink_on = torch.zeros(lse.shape[1:], dtype=torch.bool, device=lse.device)
    if attn_sink is not None:
        sk = attn_sink.reshape(-1).to(device=lse.device, dtype=dtype)
        if sk.shape[0] != lse.shape[2]:
            raise ValueError(f"attn_sink: expected [{lse.shape[2]}], got {tuple(attn_sink.shape)}")
        sk = sk[None, :].expand(lse.shape[1:])
        sink_on = ~torch.isneginf(sk)
        denom = denom + torch.where(sink_on, torch.exp(sk - m_safe), torch.zeros_like(sk))
    out = acc / denom[..., None]
    out_lse = m_safe + torch.log(wsum)
    # exactly one live state (and no sink): select it as is
    first = live.to(torch.int8).argmax(0)  # [T, H]
    sel_v = torch.gather(v, 0, first[None, ..., None].expand(1, *v.shape[1:])).squeeze(0)
    sel_l = torch.gather(lse, 0, first[None]).squeeze(0)
    one = (count == 1) & ~sink_on
    out_lse = torch.where(count == 1, sel_l, out_lse)
    out = torch.where(one[..., None], sel_v, out)
    none = count == 0
    out = torch.where(none[..., None], torch.zeros_like(out), out)
    out_lse = torch.where(none, torch.full_like(out_lse, float("-inf")), out_lse)
    out = torch.where(nan[..., None], torch.full_like(out, float("nan")), out)
    out_lse = torch.where(nan, torch.full_like(out_lse, float("nan")), out_lse)
    return out, out_lse


def _merge2(prefix_output, prefix_lse, suffix_output, suffix_lse, dtype):
    va = prefix_output.to(dtype)
    vb = suffix_output.to(dtype)
    a = prefix_lse.to(dtype)
    b = suffix_lse.to(dtype)
    if va.dim() != 3 or va.shape != vb.shape:
        raise ValueError(
            f"prefix_output/suffix_output: expected equal [num_tokens, num_heads, head_size], got "
            f"{tuple(va.shape)} and {tuple(vb.shape)}"
        )
    if a.shape != va.shape[:2] or b.shape != va.shape[:2]:
        raise ValueError(
            f"prefix_lse/suffix_lse: expected {tuple(va.shape[:2])}, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    ninf = torch.tensor(float("-inf"), dtype=dtype, device=a.device)
    a = torch.where(torch.isposinf(a), ninf, a)
    b = torch.where(torch.isposinf(b), ninf, b)
    a_empty = torch.isneginf(a)
    b_empty = torch.isneginf(b)
    nan = torch.isnan(a) | torch.isnan(b)

    m = torch.maximum(a, b)
    m_safe = torch.where(a_empty & b_empty, torch.zeros_like(m), m)
    wa = torch.exp(a - m_safe)
    wb = torch.exp(b - m_safe)
    w = wa + wb
    # General case; rows with an empty side or NaN are overwritten below.
    both = (wa[..., None] * torch.where(a_empty[..., None], 0.0, va)
            + wb[..., None] * torch.where(b_empty[..., None], 0.0, vb)) / w[..., None]
    out_lse = m_safe + torch.log(w)

    out = torch.where(a_empty[..., None], vb, both)
    out_lse = torch.where(a_empty, b, out_lse)
    out = torch.where(b_empty[..., None], va, out)
    out_lse = torch.where(b_empty, a, out_lse)
    out = torch.where((a_empty & b_empty)[..., None], torch.zeros_like(out), out)
    out_lse = torch.where(a_empty & b_empty, ninf, out_lse)
    out = torch.where(nan[..., None], torch.full_like(out, float("nan")), out)
    out_lse = torch.where(nan, torch.full_like(out_lse, float("nan")), out_lse)
    return out, out_lse
