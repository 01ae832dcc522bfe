"""Context-parallel sparse MLA decode over ``torch.distributed`` (NCCL on GPUs, gloo on CPUs).

Each rank holds a shard of the paged KV cache (whole pages, assigned round-robin or in contiguous
ranges by :class:`PageSharding`). A decode step on every rank:

1. ``sparse_mla_decode`` over the selected rows it owns (:meth:`PageSharding.localize_indices`
   maps global slot ids to its local cache and every other entry to -1, which the op skips),
   **without** the attention sink, into a packed send buffer: partial output
   ``[T, H, 512]`` bf16 then partial LSE ``[T, H]`` fp32;
2. one all-gather of the packed buffers (a single collective per step);
3. ``merge_attn_states_n`` over the ``S = world_size`` gathered states, straight from the
   receive buffer through strided views, **with** the sink, into the caller's output.

Why the sink enters exactly once (natural log, per token and head). Let the selected rows ``I``
be split into the disjoint per-rank sets ``I_r``, ``s_i`` the scaled scores and
``L_r = sum_{i in I_r} exp(s_i)``. Without a sink, rank ``r`` returns
``o_r = sum_{i in I_r} exp(s_i) V_i / L_r`` and ``lse_r = log L_r`` (``o_r = 0``,
``lse_r = -inf`` when ``I_r`` is empty). The merge with the sink ``sigma`` computes, with
``m = max_r lse_r`` and ``w_r = exp(lse_r - m) = L_r / e^m``::

    out = sum_r w_r o_r / (sum_r w_r + exp(sigma - m))
        = sum_r L_r o_r / (sum_r L_r + e^sigma)
        = sum_{i in I} exp(s_i) V_i / (L + e^sigma)          (L = sum_r L_r)
    lse = m + log(sum_r w_r) = log L

which is single-device decode over ``I`` with the sink (DESIGN.md section 4: ``D = l +
exp(sink - m)``, lse excluding the sink). Had every rank applied the sink, rank ``r`` would
return ``sum_{I_r} exp(s_i) V_i / (L_r + e^sigma)`` with the same ``lse_r``, and the merge would
weigh it by ``L_r``: the result is ``sum_r [L_r / (L_r + e^sigma)] sum_{I_r} exp(s_i) V_i / L``,
i.e. the sink counted once per rank, each time against a partial sum. Tests check both
statements numerically.

Run ``python -m mla_ext.parallel --cp N ...`` (see :mod:`mla_ext.parallel.runner`) to build
inputs, shard them, run, verify against single-device decode and time the phases.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from .._decode import DecodeWorkspace, sparse_mla_decode
from .._ops import int_arg, is_integer_dtype, merge_attn_states_n
from .. import formats

__all__ = ["PageSharding", "ContextParallelDecode", "compact_indices", "SHARDING_MODES", "D_V"]

SHARDING_MODES = ("round_robin", "contiguous")
D_V = 512  # output width of every DeepSeek MLA layout

# all_gather_single replaces all_gather_into_tensor in newer torch; older ones only have the latter.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _integer_tensor(fn: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor) or not is_integer_dtype(t.dtype):
        raise TypeError(f"{fn}: expected {name} to be an integer tensor, got "
                        f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")


def compact_indices(indices: torch.Tensor, lengths: Optional[torch.Tensor] = None):
    """Move each row's usable entries to its front, keeping their order: ``(indices, lengths)``.

    After :meth:`PageSharding.localize_indices` a rank's rows keep their full width with the
    other ranks' slots at -1, and ``sparse_mla_decode`` walks the whole width (split-K tiles are
    cut over positions ``< lengths``). Compacted rows let a rank walk only the rows it owns.
    The op's result is the same up to summation order.

    Args:
        indices: ``[num_tokens, W]`` integer slot ids of one set (entries < 0 are unusable, and so
            are entries above 2^31 - 1, which no int32 slot id reaches: an int64 padding value
            such as 2^32 is dropped, never narrowed onto a real slot).
        lengths: optional ``[num_tokens]`` integer counts on ``indices``' device: positions
            ``>= lengths[t]`` are unusable (as in the op).

    Returns:
        ``(int32 [num_tokens, W], int32 [num_tokens])``: the usable entries of each row first, in
        their original order, then -1; and their count per row (pass it as the set's lengths).
        Slots >= the cache's slot count are still skipped by the op, not here.

    Raises:
        TypeError: ``indices`` or ``lengths`` not an integer tensor.
        ValueError: ``indices`` not 2-D, ``lengths`` not of shape ``[num_tokens]`` or on another
            device.
    """
    _integer_tensor("compact_indices", "indices", indices)
    if indices.dim() != 2:
        raise ValueError(f"compact_indices: expected indices of shape [num_tokens, W], got {list(indices.shape)}")
    if lengths is not None:
        _integer_tensor("compact_indices", "lengths", lengths)
        if lengths.shape != indices.shape[:1] or lengths.device != indices.device:
            raise ValueError(f"compact_indices: expected lengths of shape [{indices.shape[0]}] on {indices.device}, "
                             f"got {list(lengths.shape)} on {lengths.device}")
    idx = indices.to(torch.int64)
    usable = (idx >= 0) & (idx <= torch.iinfo(torch.int32).max)
    if lengths is not None:
        pos = torch.arange(idx.shape[1], device=idx.device)
        usable &= pos[None, :] < lengths.to(torch.int64)[:, None]
    order = torch.argsort((~usable).to(torch.int8), dim=1, stable=True)
    count = usable.sum(dim=1)
    packed = idx.gather(1, order)
    keep = torch.arange(idx.shape[1], device=idx.device)[None, :] < count[:, None]
    packed = torch.where(keep, packed, torch.full_like(packed, -1))
    return packed.to(torch.int32), count.to(torch.int32)


@dataclass(frozen=True)
class PageSharding:
    """Which rank owns which whole KV-cache page.

    Attributes:
        world_size: number of ranks (>= 1).
        rank: this rank, ``0 <= rank < world_size``.
        mode: ``"round_robin"``: page ``p`` lives on rank ``p % world_size`` as local page
            ``p // world_size`` (spreads every request's pages, balancing the work of one step);
            ``"contiguous"``: ranks own consecutive ranges of ``ceil(num_pages / world_size)``
            pages (rank ``r`` owns pages ``[r * chunk, (r + 1) * chunk)``).
    """

    world_size: int
    rank: int
    mode: str = "round_robin"

    def __post_init__(self):
        for name in ("world_size", "rank"):  # (frozen: set through object)
            object.__setattr__(self, name, int_arg("PageSharding", name, getattr(self, name)))
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"PageSharding: expected world_size >= 1 and 0 <= rank < world_size, got "
                             f"world_size={self.world_size}, rank={self.rank}")
        if self.mode not in SHARDING_MODES:
            raise ValueError(f"PageSharding: mode must be one of {SHARDING_MODES}, got {self.mode!r}")

    def _chunk(self, num_pages: int) -> int:
        return -(-num_pages // self.world_size)

    def num_local_pages(self, num_pages: int) -> int:
        """Pages of a ``num_pages``-page cache that this rank owns."""
        if self.mode == "round_robin":
            return max(0, -(-(num_pages - self.rank) // self.world_size))
        c = self._chunk(num_pages)
        return max(0, min(num_pages, (self.rank + 1) * c) - self.rank * c)

    def owned_pages(self, num_pages: int, device=None) -> torch.Tensor:
        """Global ids (int64) of the pages this rank owns, in local page order."""
        n = self.num_local_pages(num_pages)
        j = torch.arange(n, device=device, dtype=torch.int64)
        if self.mode == "round_robin":
            return self.rank + j * self.world_size
        return self.rank * self._chunk(num_pages) + j

    def localize_indices(self, indices: torch.Tensor, *, page_size: int, num_pages: int,
                         out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Map global slot ids to this rank's local cache (:meth:`shard_kv_cache`).

        Args:
            indices: ``[num_tokens, W]`` integer global slot ids (``page * page_size + offset``)
                of the full cache; any strides.
            page_size: tokens per page of that cache.
            num_pages: pages of the full cache.
            out: optional int32 tensor of ``indices``' shape to write into (**mutated**).

        Returns:
            int32 ``[num_tokens, W]``: ``local_page * page_size + offset`` where this rank owns
            the slot's page, else -1 (also for entries < 0 or >= ``num_pages * page_size``, which
            the op would skip anyway). Positions are kept, so ``lengths`` still apply.

        Raises:
            TypeError: ``indices`` not an integer tensor, ``page_size`` / ``num_pages`` not
                integers, ``out`` not a tensor.
            ValueError: ``page_size < 1``, ``num_pages < 0``, ``out`` not int32 of ``indices``'
                shape on its device.
        """
        fn = "PageSharding.localize_indices"
        page_size = int_arg(fn, "page_size", page_size)
        num_pages = int_arg(fn, "num_pages", num_pages)
        _integer_tensor(fn, "indices", indices)
        if page_size < 1 or num_pages < 0:
            raise ValueError(f"{fn}: expected page_size >= 1 and num_pages >= 0, got page_size={page_size}, "
                             f"num_pages={num_pages}")
        if out is not None:
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"{fn}: expected out to be a tensor or None, got {type(out).__name__}")
            if out.dtype != torch.int32 or out.shape != indices.shape or out.device != indices.device:
                raise ValueError(f"{fn}: expected out to be int32 of indices' shape {list(indices.shape)} on "
                                 f"{indices.device}, got {out.dtype} {list(out.shape)} on {out.device}")
        idx = indices.to(torch.int64)
        valid = (idx >= 0) & (idx < num_pages * page_size)
        safe = torch.where(valid, idx, torch.zeros_like(idx))
        page, off = safe // page_size, safe % page_size
        if self.mode == "round_robin":
            owner, local = page % self.world_size, page // self.world_size
        else:
            c = max(1, self._chunk(num_pages))  # (num_pages 0: no slot is valid)
            owner, local = page // c, page % c
        mine = valid & (owner == self.rank)
        res = torch.where(mine, local * page_size + off, torch.full_like(idx, -1)).to(torch.int32)
        if out is None:
            return res
        out.copy_(res)
        return out

    def shard_kv_cache(self, kv_cache: torch.Tensor) -> torch.Tensor:
        """This rank's pages of ``kv_cache`` as a new cache of the same format and layout.

        Works for every ``kv_format``: the page stride (``stride(0)``; padded for DeepSeek V4's
        ``fp8_ds_mla_v4``) and the strides inside a page are kept, and each owned page's bytes
        (its ``[page_size, row]`` window: V4 data rows and scale groups included) are copied.
        Bytes outside those windows are filled with garbage (NaN for float caches, 0xFF bytes for
        uint8 / int8 ones), never read. A rank
        that owns no page gets one garbage page (no local index points at it).

        Args:
            kv_cache: ``[num_pages, page_size, ...]`` paged cache (any of the op's formats).

        Returns:
            ``[max(1, num_local_pages), page_size, ...]`` on the same device, local page ``j``
            = global page ``owned_pages()[j]``.

        Raises:
            TypeError: ``kv_cache`` is not a tensor.
            ValueError: ``kv_cache`` has fewer than 3 dims, or its pages overlap.
        """
        if not isinstance(kv_cache, torch.Tensor):
            raise TypeError(f"shard_kv_cache: expected kv_cache to be a tensor, got {type(kv_cache).__name__}")
        if kv_cache.dim() < 3:
            raise ValueError(f"shard_kv_cache: expected kv_cache of shape [num_pages, page_size, ...] (3 or more "
                             f"dims, as sparse_mla_decode takes it), got {list(kv_cache.shape)}")
        num_pages = kv_cache.shape[0]
        extent = 1 + sum((s - 1) * st for s, st in zip(kv_cache.shape[1:], kv_cache.stride()[1:]))
        page_stride = kv_cache.stride(0) if num_pages > 1 else max(kv_cache.stride(0), extent)
        if page_stride < extent:
            raise ValueError(f"shard_kv_cache: pages overlap (stride(0) = {page_stride} < page extent {extent})")
        pages = self.owned_pages(num_pages, device=kv_cache.device)
        n = max(1, pages.numel())
        if kv_cache.dtype.is_floating_point:
            flat = torch.full((n * page_stride,), float("nan"), dtype=kv_cache.dtype, device=kv_cache.device)
        else:  # uint8 / int8 byte caches: 0xFF bytes (a NaN fill cannot be an int8 value)
            flat = torch.full((n * page_stride * kv_cache.element_size(),), formats.GARBAGE_BYTE, dtype=torch.uint8,
                              device=kv_cache.device).view(kv_cache.dtype)
        local = flat.as_strided((n,) + tuple(kv_cache.shape[1:]), (page_stride,) + tuple(kv_cache.stride()[1:]), 0)
        if pages.numel():
            local[:pages.numel()].copy_(kv_cache.index_select(0, pages))
        return local


class ContextParallelDecode:
    """One rank's side of context-parallel sparse MLA decode (see the module docstring).

    Allocates, once, everything a step needs (no allocation per step): a
    :class:`~mla_ext.DecodeWorkspace`, a packed send buffer of ``max_num_tokens * num_heads *
    (512 * 2 + 4)`` bytes and a receive buffer ``world_size`` times that (bytes of device
    memory: about ``(world_size + 1) * max_num_tokens * num_heads * 1028``).

    Args:
        max_num_tokens: the most query tokens a step will have.
        num_heads: query heads (H) of every step.
        device: this rank's device (``cuda:<local rank>`` with NCCL, ``cpu`` with gloo).
        group: the ``torch.distributed`` process group of the context-parallel ranks
            (``None`` = the default group).
        num_splits: ``num_splits`` passed to the local decode (0 = automatic).

    Call :meth:`__call__` per layer and step, or the three phases separately
    (:meth:`local_decode`, :meth:`exchange`, :meth:`merge`) to time them.
    """

    def __init__(self, max_num_tokens: int, num_heads: int, *, device, group=None, num_splits: int = 0):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.max_num_tokens = int_arg("ContextParallelDecode", "max_num_tokens", max_num_tokens)
        self.num_heads = int_arg("ContextParallelDecode", "num_heads", num_heads)
        self.num_splits = int_arg("ContextParallelDecode", "num_splits", num_splits)
        self.device = torch.device(device)
        self.workspace = DecodeWorkspace(self.max_num_tokens, self.num_heads, num_splits=self.num_splits,
                                         device=self.device)
        per_rank = self.bytes_per_rank(self.max_num_tokens)
        self._send = torch.empty(per_rank, dtype=torch.uint8, device=self.device)
        self._recv = torch.empty(self.world_size * per_rank, dtype=torch.uint8, device=self.device)

    def bytes_per_rank(self, num_tokens: int) -> int:
        """Bytes each rank contributes to the all-gather of a ``num_tokens`` step: the bf16
        output, then the fp32 lse padded to 16 bytes (so every gathered state starts 16-byte
        aligned and the merge takes its vector path)."""
        th = num_tokens * self.num_heads
        return th * D_V * 2 + -(-th * 4 // 16) * 16

    def _check_tokens(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= self.max_num_tokens:
            raise ValueError(f"ContextParallelDecode: made for num_tokens <= {self.max_num_tokens}, "
                             f"got {num_tokens}")

    def _check_outputs(self, T: int, output, lse, attn_sink) -> None:
        """The merge's arguments as the caller passes them: output [T, H, 512] bf16, lse [T, H]
        fp32, attn_sink [H] fp32, all on this rank's device (ValueError / TypeError)."""
        H = self.num_heads

        def on_device(t):
            return t.device.type == self.device.type and (self.device.index is None or
                                                         t.device.index == self.device.index)

        for name, t, shape, dtype in (("output", output, [T, H, D_V], torch.bfloat16), ("lse", lse, [T, H], torch.float32),
                                      ("attn_sink", attn_sink, [H], torch.float32)):
            if t is None and name != "output":
                continue
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"ContextParallelDecode: expected {name} to be a tensor, got {type(t).__name__}")
            if list(t.shape) != shape:
                hint = f" (slice a padded buffer to {name}[:{T}])" if name != "attn_sink" and t.dim() == len(shape) \
                    and list(t.shape[1:]) == shape[1:] else ""
                raise ValueError(f"ContextParallelDecode: expected {name} of shape {shape} (num_tokens {T}, num_heads "
                                 f"{H}), got {list(t.shape)}{hint}")
            if t.dtype != dtype:
                raise ValueError(f"ContextParallelDecode: expected {name} to be {dtype}, got {t.dtype}")
            if not on_device(t):
                raise ValueError(f"ContextParallelDecode: expected {name} on {self.device}, got {t.device}")

    def partial_views(self, num_tokens: int):
        """(partial output ``[T, H, 512]`` bf16, partial lse ``[T, H]`` fp32): this rank's slice
        of the send buffer that :meth:`local_decode` writes."""
        T, H = num_tokens, self.num_heads
        send = self._send[:self.bytes_per_rank(T)]
        out = send[:T * H * D_V * 2].view(torch.bfloat16).view(T, H, D_V)
        lse = send[T * H * D_V * 2:T * H * (D_V * 2 + 4)].view(torch.float32).view(T, H)
        return out, lse

    def gathered_views(self, num_tokens: int):
        """(values ``[S, T, H, 512]`` bf16, lses ``[S, T, H]`` fp32): strided views of the
        receive buffer (state ``s`` = rank ``s``'s partial result), as
        :func:`mla_ext.merge_attn_states_n` takes them."""
        T, H, S = num_tokens, self.num_heads, self.world_size
        bpr = self.bytes_per_rank(T)
        recv = self._recv[:S * bpr]
        values = recv.view(torch.bfloat16).as_strided((S, T, H, D_V), (bpr // 2, H * D_V, D_V, 1), 0)
        lses = recv.view(torch.float32).as_strided((S, T, H), (bpr // 4, H, 1), T * H * D_V * 2 // 4)
        return values, lses

    def _check_q(self, q) -> int:
        """q's token count, after checking q is a ``[T, H, d_qk]`` tensor with this object's H and
        T within ``max_num_tokens`` (TypeError / ValueError)."""
        if not isinstance(q, torch.Tensor):
            raise TypeError(f"ContextParallelDecode: expected q to be a tensor, got {type(q).__name__}")
        if q.dim() != 3 or int(q.shape[1]) != self.num_heads:
            raise ValueError(f"ContextParallelDecode: q must be [num_tokens, {self.num_heads}, d_qk] (the heads it "
                             f"was made for), got {list(q.shape)}")
        T = int(q.shape[0])
        self._check_tokens(T)
        return T

    def local_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, *, kv_format: str,
                     softmax_scale: float, lengths: Optional[torch.Tensor] = None,
                     extra_kv_cache: Optional[torch.Tensor] = None, extra_indices: Optional[torch.Tensor] = None,
                     extra_lengths: Optional[torch.Tensor] = None) -> None:
        """Phase 1: :func:`mla_ext.sparse_mla_decode` over this rank's shard (local cache(s) and
        local indices from :class:`PageSharding`), without the sink, into the send buffer."""
        T = self._check_q(q)
        out, lse = self.partial_views(T)
        sparse_mla_decode(q, kv_cache, indices, kv_format=kv_format, softmax_scale=softmax_scale, output=out,
                          workspace=self.workspace.tensor, lengths=lengths, extra_kv_cache=extra_kv_cache,
                          extra_indices=extra_indices, extra_lengths=extra_lengths, attn_sink=None, lse=lse,
                          num_splits=self.num_splits)

    def exchange(self, num_tokens: int) -> None:
        """Phase 2: all-gather every rank's packed partial result (one collective)."""
        self._check_tokens(num_tokens)
        bpr = self.bytes_per_rank(num_tokens)
        _all_gather_single(self._recv[:self.world_size * bpr], self._send[:bpr], group=self.group)
        self._exchanged_tokens = num_tokens

    def merge(self, output: torch.Tensor, lse: Optional[torch.Tensor] = None,
              attn_sink: Optional[torch.Tensor] = None) -> None:
        """Phase 3: merge the gathered states into ``output`` (``[T, H, 512]`` bf16, any
        token/head strides; **mutated**) and ``lse`` (optional ``[T, H]`` fp32; **mutated**,
        sink excluded), folding ``attn_sink`` (``[H]`` fp32) in once. ``T`` must be the token
        count of the preceding :meth:`exchange` (ValueError otherwise: a padded output buffer
        would be merged from the wrong rows of the receive buffer)."""
        T = getattr(self, "_exchanged_tokens", None)
        if T is None:
            raise ValueError("ContextParallelDecode.merge: call exchange() first")
        self._check_outputs(T, output, lse, attn_sink)
        values, lses = self.gathered_views(T)
        merge_attn_states_n(output, lse, values, lses, attn_sink)

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, *, kv_format: str,
                 softmax_scale: float, output: torch.Tensor, lse: Optional[torch.Tensor] = None,
                 lengths: Optional[torch.Tensor] = None, extra_kv_cache: Optional[torch.Tensor] = None,
                 extra_indices: Optional[torch.Tensor] = None, extra_lengths: Optional[torch.Tensor] = None,
                 attn_sink: Optional[torch.Tensor] = None) -> None:
        """One context-parallel decode step of one layer, written in place into ``output``.

        Every rank calls it with the same ``q`` ``[T, H, d_qk]`` (bf16) and ``attn_sink``, and
        with its own local cache(s) (:meth:`PageSharding.shard_kv_cache`), local indices
        (:meth:`PageSharding.localize_indices`) and the lengths that go with them: the global
        ``lengths`` / ``extra_lengths`` for local rows as ``localize_indices`` returns them, or
        the per-rank lengths :func:`compact_indices` returns with compacted rows. On return every rank's ``output``
        ``[T, H, 512]`` bf16 (and ``lse`` ``[T, H]`` fp32, sink excluded) holds the result of
        :func:`mla_ext.sparse_mla_decode` over the union of the shards, sink applied once.
        Arguments as :func:`mla_ext.sparse_mla_decode`. Collective: every rank must call it.
        """
        # q, then the caller's buffers, are checked before any work or collective (so no rank
        # hangs and an error names the caller's argument, not the merge's internal ones).
        self._check_outputs(self._check_q(q), output, lse, attn_sink)
        self.local_decode(q, kv_cache, indices, kv_format=kv_format, softmax_scale=softmax_scale, lengths=lengths,
                          extra_kv_cache=extra_kv_cache, extra_indices=extra_indices, extra_lengths=extra_lengths)
        self.exchange(int(q.shape[0]))
        self.merge(output, lse, attn_sink)
