"""FlashMLA's call shape for sparse MLA decode: ``flash_mla_with_kvcache(..., indices=...)``.

Engines that call DeepSeek's FlashMLA for DeepSeek V3.2 / V4 sparse decode (``get_mla_metadata()``
once per step, then ``flash_mla_with_kvcache`` per layer with ``indices``) can switch the import
to this module and keep their call sites. The arguments mean what they mean in FlashMLA's
Python interface (``flash_mla/flash_mla_interface.py``, sparse mode), and the caches are the same
bytes, so the same tensors pass unchanged:

- ``q [batch_size, seq_len_q, num_heads_q, d_qk]`` bf16, d_qk 576 (V3.2) or 512 (V4);
- ``k_cache [num_blocks, page_block_size, 1, bytes]``: V3.2's 656-byte rows (FlashMLA's
  ``V32_FP8Sparse``, this library's ``"fp8_ds_mla"``) or V4's 584-byte rows with a padded page
  stride (FlashMLA's ``MODEL1_FP8Sparse``, this library's ``"fp8_ds_mla_v4"``), as float8_e4m3fn
  or uint8 / int8 (float8_e4m3fnuz: the ``_fnuz`` twins of gfx942 engines); bf16 caches too
  (``is_fp8_kvcache=False``), which FlashMLA's sparse decode does not take;
- ``indices [batch_size, seq_len_q, topk]`` int32 slots ``page * page_block_size + offset``
  (-1, any negative or any slot past the cache: skipped);
- ``topk_length [batch_size]`` int32 per request (applies to each of its ``seq_len_q`` tokens);
- ``attn_sink [num_heads_q]`` float32; the optional extra set (V4 compressed rows) likewise;
- returns ``(out [batch_size, seq_len_q, num_heads_q, 512] bf16,
  softmax_lse [batch_size, num_heads_q, seq_len_q] float32)``, the LSE without the sink and
  ``+inf`` for a (token, head) with no valid entry (whose output is 0), as FlashMLA returns them.

What differs, on purpose:

- Buffers. FlashMLA allocates ``out``, ``softmax_lse`` and its scheduling tensors on every call.
  Here ``out=`` and ``softmax_lse=`` take the caller's buffers (written in place and returned),
  and the split-K workspace lives in the :class:`FlashMLASchedMeta`: give
  ``get_mla_metadata(workspace=ws.tensor)`` one :class:`mla_ext.DecodeWorkspace` made for the
  largest batch, and a step allocates nothing on the device (see "Allocations" below). Calls on
  one stream may share a workspace; calls that may run at the same time on different streams
  (e.g. two micro-batches overlapped) need one each.
- Scheduling. The split count comes from shapes and the processor count only, never from
  lengths or indices, so a :class:`FlashMLASchedMeta` may be reused while ``topk_length`` and
  the indices change (FlashMLA requires them unchanged); a CUDA graph captured once stays
  valid.
- Errors are exceptions with the argument's name (``ValueError`` / ``TypeError`` /
  ``NotImplementedError`` here, ``RuntimeError`` from the op), raised before anything is
  written, instead of assertions. Under ``torch.compile`` the op's own checks run while
  tracing, outside this wrapper's renaming: their messages name the op's arguments
  (``kv_cache``, ``output``, ``q [num_tokens, ...]``) instead of FlashMLA's.
- Only the sparse mode exists (``indices`` given); the dense paged decode (``block_table``,
  ``cache_seqlens``, ``causal``) raises ``NotImplementedError``.

Allocations per call (device memory, from torch's caching allocator): none with ``out=``,
``softmax_lse=`` and a sched meta holding a workspace (and ``seq_len_q`` 1, or neither
``topk_length`` nor ``extra_topk_length`` given). ``out`` must let its (batch_size, seq_len_q) dims merge into one token dim (a contiguous
buffer, or a view of the engine's ``[num_tokens, num_heads_q * 512]`` output), and so must
``softmax_lse``'s: with ``seq_len_q > 1`` pass ``torch.empty(batch_size, seq_len_q,
num_heads_q).transpose(1, 2)``; other layouts are refused. With ``seq_len_q > 1`` the per-token
lengths (``topk_length`` and ``extra_topk_length`` repeated, [batch_size * seq_len_q] int32 each)
are made on each call, ``q`` /
``indices`` are copied only where their token dims do not merge, and an LSE allocated here is
computed in token order and copied into its contiguous ``[batch_size, num_heads_q, seq_len_q]``
result.

Host cost of an eager call, over :func:`mla_ext.sparse_mla_decode` itself (this project's CPU
build machine, one V4 token x 8 heads, caller buffers and workspace): +6 µs with
``return_softmax_lse=False`` (12.9 against 6.8 µs: three views and the checks above), +10.5 µs with
the LSE (17.3 µs: its view and the +inf fix-up, one more small kernel on a GPU). Nothing of it
remains in a replayed CUDA graph.
"""
from __future__ import annotations

import dataclasses
import operator
import re
from typing import Optional, Tuple

import torch

from .._decode import DecodeWorkspace
from .._decode import sparse_mla_decode as _decode

_FN = "flash_mla_with_kvcache (mla_ext.compat.flashmla)"
# This module's argument names for the op's, so that an error from the op names what the caller passed.
_NAMES = (("extra_kv_cache", "extra_k_cache"), ("extra_indices", "extra_indices_in_kvcache"),
          ("extra_lengths", "extra_topk_length"), ("kv_cache", "k_cache"), ("lengths", "topk_length"),
          ("output", "out"), ("lse", "softmax_lse"))


@dataclasses.dataclass
class FlashMLASchedMeta:
    """What :func:`get_mla_metadata` returns and :func:`flash_mla_with_kvcache` takes as
    ``tile_scheduler_metadata``: the split-K workspace of the calls that share it.

    Attributes:
        workspace: 1-D uint8 tensor (a :class:`mla_ext.DecodeWorkspace`'s ``.tensor``) or None;
            when None, the first call allocates one sized for its own ``batch_size * seq_len_q``
            tokens and ``num_heads_q`` heads (under its ``num_splits``) and keeps it. A later
            call whose split count needs more bytes than it holds is refused by the op, and
            which calls those are depends on the device (the automatic split count follows the
            processor count; on the CPU, one split and no workspace is common), so a sched meta
            reused for bigger calls can pass on the CPU and be refused on a GPU: size the
            workspace for the largest call with ``get_mla_metadata(workspace=...)``. Its
            contents never matter; calls on one stream may share it.
    """

    workspace: Optional[torch.Tensor] = None


def get_mla_metadata(*args, workspace: Optional[torch.Tensor] = None, **kwargs) -> Tuple[FlashMLASchedMeta, None]:
    """FlashMLA's ``get_mla_metadata``: a fresh :class:`FlashMLASchedMeta` and ``None``.

    Positional and other keyword arguments (the older interface's ``cache_seqlens``,
    ``num_q_tokens_per_head_k``, ...) are accepted and ignored, as FlashMLA does; ``workspace``
    is keyword-only. This mirrors FlashMLA's current interface, whose sched meta is an object
    filled on first use: engines written for the older one, whose ``get_mla_metadata`` returned
    scheduling tensors (``tile_scheduler_metadata``, ``num_splits``) that their metadata
    builders copy or slice for CUDA-graph replay, drop that plumbing (here nothing per step
    needs copying: the split count depends on shapes only).

    Args:
        workspace: optional 1-D uint8 split-K workspace on the calls' device, at least
            :func:`mla_ext.sparse_mla_decode_workspace_size` bytes for the largest call that
            uses this sched meta (``num_tokens = batch_size * seq_len_q``); pass one
            :class:`mla_ext.DecodeWorkspace`'s ``.tensor`` to every step's sched meta so that no
            step allocates one. Not written until a call.

    Returns:
        ``(FlashMLASchedMeta(workspace), None)``; the second element is kept for the tuple's shape.

    Raises:
        TypeError: ``workspace`` is neither None nor a tensor, or a uint8 tensor is passed
            positionally.
    """
    del kwargs
    if any(isinstance(a, torch.Tensor) and a.dtype == torch.uint8 for a in args):
        raise TypeError("get_mla_metadata: a uint8 tensor was passed positionally (ignored like FlashMLA's "
                        "old arguments); pass the workspace by keyword: get_mla_metadata(workspace=...)")
    if workspace is not None and not isinstance(workspace, torch.Tensor):
        raise TypeError(f"get_mla_metadata: expected workspace to be a uint8 tensor or None, got "
                        f"{type(workspace).__name__}")
    return FlashMLASchedMeta(workspace), None


def _kv_format(q: torch.Tensor, k_cache: torch.Tensor, is_fp8_kvcache: bool, kv_format: Optional[str]) -> str:
    if kv_format is not None:  # the caller's; the op checks it against the cache and q
        if not isinstance(kv_format, str):
            raise TypeError(f"{_FN}: expected kv_format to be a string or None, got {type(kv_format).__name__}")
        if (kv_format == "bf16") == bool(is_fp8_kvcache):
            raise ValueError(f"{_FN}: kv_format={kv_format!r} with is_fp8_kvcache={bool(is_fp8_kvcache)}")
        return kv_format
    d_qk = q.shape[-1]
    if k_cache.dtype == torch.bfloat16:
        if is_fp8_kvcache:
            raise ValueError(f"{_FN}: k_cache is bfloat16 but is_fp8_kvcache=True")
        return "bf16"
    fnuz = getattr(torch, "float8_e4m3fnuz", None)
    if k_cache.dtype not in (torch.uint8, torch.int8, torch.float8_e4m3fn, fnuz):
        raise ValueError(f"{_FN}: expected k_cache to be float8_e4m3fn, float8_e4m3fnuz, uint8 or int8 "
                         f"(FP8 rows as bytes) or bfloat16, got {k_cache.dtype}")
    if not is_fp8_kvcache:
        raise ValueError(f"{_FN}: k_cache holds FP8 rows ({k_cache.dtype}) but is_fp8_kvcache=False")
    if d_qk not in (576, 512):
        raise ValueError(f"{_FN}: expected q's head_dim to be 576 (DeepSeek V3.2) or 512 (DeepSeek V4) "
                         f"with an FP8 cache, got {d_qk}")
    base = "fp8_ds_mla" if d_qk == 576 else "fp8_ds_mla_v4"
    return base + "_fnuz" if k_cache.dtype == fnuz else base


def _as_int(v) -> Optional[int]:
    """An integer argument (Python or numpy int) as an int; None for anything else (floats, bools,
    tensors)."""
    if isinstance(v, bool) or isinstance(v, torch.Tensor):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def _per_token_lengths(name: str, lengths: Optional[torch.Tensor], b: int, s_q: int) -> Optional[torch.Tensor]:
    """[batch_size] per-request lengths as the op's [batch_size * seq_len_q] per-token lengths."""
    if lengths is None:
        return None
    if not isinstance(lengths, torch.Tensor):
        raise TypeError(f"{_FN}: expected {name} to be an int32 tensor or None, got {type(lengths).__name__}")
    if tuple(lengths.shape) != (b,):
        raise ValueError(f"{_FN}: expected {name} of shape [batch_size] = [{b}], got {list(lengths.shape)}")
    return lengths if s_q == 1 else lengths[:, None].expand(b, s_q).reshape(b * s_q)  # no host sync


def _token_rows(name: str, x: Optional[torch.Tensor], b: int, s_q: int) -> Optional[torch.Tensor]:
    """Index rows [batch_size, seq_len_q, W] as [batch_size * seq_len_q, W] (a view where the
    layout allows, else a copy)."""
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{_FN}: expected {name} to be a tensor, got {type(x).__name__}")
    if x.dim() != 3 or tuple(x.shape[:2]) != (b, s_q):
        raise ValueError(f"{_FN}: expected {name} of shape [batch_size, seq_len_q, W] = [{b}, {s_q}, W], "
                         f"got {list(x.shape)}")
    return x.select(1, 0) if s_q == 1 else x.reshape(b * s_q, x.shape[2])


def _buffer(name: str, buf: Optional[torch.Tensor], shape: Tuple[int, ...], dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
    """The caller's buffer after a shape check (the op checks its dtype and device and names it),
    or a new one."""
    if buf is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if not isinstance(buf, torch.Tensor):
        raise TypeError(f"{_FN}: expected {name} to be a tensor or None, got {type(buf).__name__}")
    if buf.shape != shape:
        raise ValueError(f"{_FN}: expected {name} of shape {list(shape)} ({dtype}), got {list(buf.shape)}")
    return buf


def _tokens_merged(x: torch.Tensor) -> Optional[torch.Tensor]:
    """``x [batch_size, seq_len_q, ...]`` as a ``[batch_size * seq_len_q, ...]`` view, or None where
    its strides do not allow one (decided from the strides, so that torch.compile traces it)."""
    b, s_q = x.shape[0], x.shape[1]
    if b <= 1 or s_q <= 1 or x.stride(0) == s_q * x.stride(1):
        return x.view(b * s_q, *x.shape[2:])
    return None


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: Optional[torch.Tensor],
    cache_seqlens: Optional[torch.Tensor],
    head_dim_v: int,
    tile_scheduler_metadata: Optional[FlashMLASchedMeta],
    num_splits: Optional[int] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: Optional[torch.Tensor] = None,
    attn_sink: Optional[torch.Tensor] = None,
    extra_k_cache: Optional[torch.Tensor] = None,
    extra_indices_in_kvcache: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
    extra_topk_length: Optional[torch.Tensor] = None,
    *,
    out: Optional[torch.Tensor] = None,
    softmax_lse: Optional[torch.Tensor] = None,
    return_softmax_lse: bool = True,
    kv_format: Optional[str] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """FlashMLA's sparse ``flash_mla_with_kvcache`` on :func:`mla_ext.sparse_mla_decode`.

    For each request ``i``, query token ``j`` and head ``h``: one softmax over the valid entries
    of ``indices[i, j, :topk_length[i]]`` in ``k_cache`` and of
    ``extra_indices_in_kvcache[i, j, :extra_topk_length[i]]`` in ``extra_k_cache``, scores
    ``softmax_scale * q.K``, values the rows' first 512 dims, ``attn_sink[h]`` added to the
    denominator only (the math of :func:`mla_ext.sparse_mla_decode`).

    Args:
        q: ``[batch_size, seq_len_q, num_heads_q, d_qk]`` bfloat16, d_qk 576 (V3.2) or 512 (V4).
            Not mutated. (MTP: ``seq_len_q`` tokens per request, or requests x tokens as
            ``batch_size`` with ``seq_len_q = 1``.)
        k_cache: ``[num_blocks, page_block_size, 1, row]`` (or without the head dim): FP8 rows
            (float8_e4m3fn, uint8 or int8 bytes; float8_e4m3fnuz for the fnuz twins) of 656
            bytes for d_qk 576 (``"fp8_ds_mla"``: 512 e4m3 + 4 fp32 scales + 64 bf16 RoPE) or
            584 bytes for d_qk 512 (``"fp8_ds_mla_v4"``: per page, the data rows then the scale
            groups; the page stride ``stride(0)`` is honoured), or bfloat16 rows of d_qk
            elements. Not mutated. Layouts: :mod:`mla_ext.formats`.
        block_table, cache_seqlens: ignored (dense decode only, which is not implemented).
        head_dim_v: must be the int 512.
        tile_scheduler_metadata: a :class:`FlashMLASchedMeta` from :func:`get_mla_metadata`
            (holds the workspace; **mutated**: gets one if it had none), or None (a workspace is
            allocated for this call alone).
        num_splits: None (the library's automatic split count, as FlashMLA requires None), or
            an int 0..256 passed on as :func:`mla_ext.sparse_mla_decode`'s ``num_splits``.
        softmax_scale: float; None = ``d_qk ** -0.5`` (FlashMLA's default; not the models'
            scale: see :func:`mla_ext.reference.softmax_scale_v32` / ``softmax_scale_v4``).
        causal: must be False (sparse decode).
        is_fp8_kvcache: must be True for an FP8 cache, False for a bf16 one.
        indices: ``[batch_size, seq_len_q, topk]`` int32 global slots (page * page_block_size +
            offset); entries < 0, past the cache, or at positions >= ``topk_length[i]`` are
            skipped and their rows never read. Required.
        attn_sink: optional ``[num_heads_q]`` float32 per-head sink logit.
        extra_k_cache, extra_indices_in_kvcache: optional second set (V4 compressed rows), same
            format and rules, own page size; ``[batch_size, seq_len_q, extra_topk]``.
        topk_length, extra_topk_length: optional ``[batch_size]`` int32: how many leading
            entries of each request's index rows count (every token of the request alike).
        out: optional ``[batch_size, seq_len_q, num_heads_q, 512]`` bfloat16, last dim
            contiguous, head stride free, ``stride(0) == seq_len_q * stride(1)`` (the two dims
            merge into one token dim; a view of a ``[num_tokens, num_heads_q * 512]`` buffer does).
            **Mutated** (every element); returned. None: allocated.
        softmax_lse: optional ``[batch_size, num_heads_q, seq_len_q]`` float32 whose batch and
            token dims merge likewise (e.g. ``torch.empty(b, s_q, h).transpose(1, 2)``; any
            layout when ``batch_size`` or ``seq_len_q`` is 1). **Mutated**; returned. None:
            allocated (contiguous).
        kv_format: None (default): from the cache's dtype and q's head size: bfloat16 ->
            ``"bf16"``; float8_e4m3fnuz -> the ``_fnuz`` formats; float8_e4m3fn, uint8 and int8
            -> OCP e4m3fn bytes (``"fp8_ds_mla"`` for d_qk 576, ``"fp8_ds_mla_v4"`` for 512).
            **A uint8 cache holding e4m3fnuz bytes (gfx942 engines) needs**
            ``kv_format="fp8_ds_mla_fnuz"`` / ``"fp8_ds_mla_v4_fnuz"`` (or a float8_e4m3fnuz
            view): the bytes cannot say which flavour they are. Any of
            :func:`mla_ext.sparse_mla_decode`'s formats is taken as given.
        return_softmax_lse: False skips the LSE (nothing computed, no ``softmax_lse`` buffer
            allowed) and returns ``(out, None)``, as vLLM's FlashMLA wrapper does; decode
            callers that drop the LSE save its +inf fix-up (one small elementwise kernel).

    Returns:
        ``(out, softmax_lse)``: the attention output, and the natural-log sum-exp of each
        (token, head)'s scores without the sink; ``+inf`` where a token has no valid entry
        (its output is 0), as FlashMLA. ``(out, None)`` with ``return_softmax_lse=False``.

    Raises:
        NotImplementedError: ``indices`` is None (dense decode).
        ValueError: ``causal=True``, ``head_dim_v != 512``, ``is_fp8_kvcache`` not matching the
            cache's dtype, a cache dtype or q head size no format has, a length, index, ``out``
            or ``softmax_lse`` tensor of the wrong shape (or, for the buffers, with batch and
            token dims that do not merge), ``softmax_lse`` given with ``return_softmax_lse=False``,
            ``num_splits`` outside 0..256.
        TypeError: ``tile_scheduler_metadata`` of another type (e.g. FlashMLA's own), a
            ``num_splits`` that is not None or an int, a non-tensor where a tensor is expected.
        RuntimeError (or the op's TypeError): anything :func:`mla_ext.sparse_mla_decode` refuses
            (dtypes, strides, cache rows, devices, buffers sharing memory, a workspace too
            small), with this function's argument names.
        Nothing is written when an error is raised.
    """
    if indices is None:
        raise NotImplementedError(f"{_FN}: only sparse decode (indices=...) is implemented; dense paged "
                                  "decode over block_table / cache_seqlens is not")
    if causal:
        raise ValueError(f"{_FN}: causal must be False for sparse decode (indices given)")
    if _as_int(head_dim_v) != 512:
        raise ValueError(f"{_FN}: expected head_dim_v=512, got {head_dim_v!r}")
    sched = tile_scheduler_metadata
    if sched is not None and not isinstance(sched, FlashMLASchedMeta):
        raise TypeError(f"{_FN}: expected tile_scheduler_metadata from mla_ext.compat.flashmla.get_mla_metadata "
                        f"(a FlashMLASchedMeta) or None, got {type(sched).__module__}.{type(sched).__name__}")
    if num_splits is None:
        splits = 0
    else:
        splits = _as_int(num_splits)
        if splits is None:
            raise TypeError(f"{_FN}: expected num_splits to be None or an int, got {type(num_splits).__name__}")
        if not 0 <= splits <= 256:
            raise ValueError(f"{_FN}: expected num_splits None or 0..256, got {splits}")
    if not isinstance(q, torch.Tensor) or not isinstance(k_cache, torch.Tensor):
        bad = "q" if not isinstance(q, torch.Tensor) else "k_cache"
        raise TypeError(f"{_FN}: expected {bad} to be a tensor")
    if q.dim() != 4:
        raise ValueError(f"{_FN}: expected q of shape [batch_size, seq_len_q, num_heads_q, head_dim], got {list(q.shape)}")
    b, s_q, h_q, d_qk = q.shape
    T = b * s_q
    kv_format = _kv_format(q, k_cache, is_fp8_kvcache, kv_format)
    if (extra_k_cache is None) != (extra_indices_in_kvcache is None):
        raise ValueError(f"{_FN}: extra_k_cache and extra_indices_in_kvcache must be given together")
    out = _buffer("out", out, (b, s_q, h_q, 512), torch.bfloat16, q.device)
    if s_q == 1:  # the usual decode call: one select per tensor instead of merging dims
        q2, idx, out_t = q.select(1, 0), _token_rows("indices", indices, b, 1), out.select(1, 0)
    else:
        q2, idx, out_t = q.reshape(T, h_q, d_qk), _token_rows("indices", indices, b, s_q), _tokens_merged(out)
    if out_t is None:
        raise ValueError(f"{_FN}: expected out's (batch_size, seq_len_q) dims to merge into one token dim "
                         f"(stride(0) == seq_len_q * stride(1), e.g. a contiguous buffer or a view of "
                         f"[num_tokens, num_heads_q * 512]), got strides {tuple(out.stride())}")
    extra_idx = _token_rows("extra_indices_in_kvcache", extra_indices_in_kvcache, b, s_q)
    lengths = _per_token_lengths("topk_length", topk_length, b, s_q)
    extra_lengths = _per_token_lengths("extra_topk_length", extra_topk_length, b, s_q)
    lse_t, lse_scratch = None, False
    if not return_softmax_lse:
        if softmax_lse is not None:
            raise ValueError(f"{_FN}: softmax_lse given with return_softmax_lse=False")
    else:
        lse_given = softmax_lse is not None
        softmax_lse = _buffer("softmax_lse", softmax_lse, (b, h_q, s_q), torch.float32, q.device)
        lse_t = softmax_lse.select(2, 0) if s_q == 1 else _tokens_merged(softmax_lse.transpose(1, 2))
        lse_scratch = lse_t is None
        if lse_scratch:
            if lse_given:
                raise ValueError(f"{_FN}: expected softmax_lse to be a [batch_size, num_heads_q, seq_len_q] view "
                                 f"whose (batch_size, seq_len_q) dims merge, e.g. torch.empty(batch_size, "
                                 f"seq_len_q, num_heads_q).transpose(1, 2); got strides {tuple(softmax_lse.stride())}")
            lse_t = torch.empty(T, h_q, dtype=torch.float32, device=q.device)  # copied into the contiguous result
    if softmax_scale is None:
        softmax_scale = d_qk ** -0.5
    workspace = None if sched is None else sched.workspace
    fresh = workspace is None
    if fresh:
        if torch.compiler.is_compiling():
            raise RuntimeError(f"{_FN}: under torch.compile the sched meta must hold a workspace (the size query "
                               "is a host call that does not trace): get_mla_metadata(workspace="
                               "mla_ext.DecodeWorkspace(max_num_tokens, num_heads).tensor) outside the compiled code")
        try:
            workspace = DecodeWorkspace(T, h_q, num_splits=splits, device=q.device).tensor
        except (RuntimeError, ValueError, TypeError) as e:
            raise type(e)(str(e).replace("DecodeWorkspace:", f"{_FN} (sizing a workspace for q):", 1)) from None
    try:
        _decode(q2, k_cache, idx, kv_format=kv_format, softmax_scale=softmax_scale, output=out_t,
                workspace=workspace, lengths=lengths, extra_kv_cache=extra_k_cache, extra_indices=extra_idx,
                extra_lengths=extra_lengths, attn_sink=attn_sink, lse=lse_t, num_splits=splits)
    except (RuntimeError, ValueError, TypeError) as e:
        msg = _renamed(str(e))
        if sched is not None and not fresh and "workspace" in msg:
            msg += (" (the workspace is tile_scheduler_metadata.workspace: the one given to get_mla_metadata, or "
                    "the one its first call sized for that call's tokens and heads; give every step's sched meta "
                    "one mla_ext.DecodeWorkspace(max_num_tokens, num_heads) made for the largest call)")
        raise type(e)(msg) from None
    if lse_scratch:
        softmax_lse.copy_(lse_t.view(b, s_q, h_q).transpose(1, 2))
    if fresh and sched is not None:
        sched.workspace = workspace
    if not return_softmax_lse:
        return out, None
    # FlashMLA marks a (token, head) with no valid entry by lse +inf (its output is 0); the op by -inf.
    torch.nan_to_num_(softmax_lse, nan=float("nan"), posinf=float("inf"), neginf=float("inf"))
    return out, softmax_lse


def _renamed(msg: str) -> str:
    """The op's message with this interface's argument names (``kv_cache`` -> ``k_cache``, ...)."""
    for ours, theirs in _NAMES:
        msg = re.sub(rf"\b{ours}\b", theirs, msg)
    msg = msg.replace("q.size(1)", "q.size(2)").replace("sparse_mla_decode:", f"{_FN}:", 1)
    if re.search(r"\bq \[|num_tokens", msg):  # the op saw the tokens of all requests as one dim
        msg += " (the op sees q as [batch_size * seq_len_q, num_heads_q, head_dim], num_tokens = batch_size * seq_len_q)"
    return msg
