"""Sparse MLA decode (DeepSeek V3.2 DSA / DeepSeek V4) over a paged latent KV cache.

Python entry points of ``torch.ops.mla_ext.sparse_mla_decode`` and its workspace sizing, the
fake (meta) implementation for ``torch.compile``, and :class:`DecodeWorkspace`, a caller-owned
split-K scratch buffer reused across layers and decode steps. Contract: DESIGN.md section 4.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional, Union

import torch

from . import _fake_checks
from ._ops import (_grad_enabled, _is_compiling, any_requires_grad, check_same_device, eager_callable,
                   explain_bad_tensor_args, mark_written, refuse_requires_grad, with_autograd_note)
from ._ops import int_arg as _int_arg

_ops = torch.ops.mla_ext
_decode_op = torch.ops.mla_ext.sparse_mla_decode.default
_decode_eager = eager_callable(_decode_op)

__all__ = ["sparse_mla_decode", "sparse_mla_decode_workspace_size", "DecodeWorkspace"]


def _real_arg(fn: str, name: str, value) -> float:
    """``value`` as a Python float: a TypeError naming the argument unless it is a real number
    (int, float, numpy scalar; not a bool, a string or a tensor). An integer beyond the float
    range becomes +-inf, which the op then refuses as not finite (as it does 1e39), instead of
    float()'s OverflowError."""
    if type(value) is float:
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{fn}: expected {name} to be a real number, got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except OverflowError:
        return -math.inf if value < 0 else math.inf


def _splits_arg(fn: str, value) -> int:
    """``num_splits`` as an int in 0..256 (0 = automatic): TypeError / ValueError naming ``fn``."""
    s = _int_arg(fn, "num_splits", value)
    if not 0 <= s <= 256:
        raise ValueError(f"{fn}: expected num_splits 0 (automatic) or 1..256, got {s}")
    return s


DeviceLike = Union[torch.device, str, int, None]


@torch.library.register_fake("mla_ext::sparse_mla_decode")
def _sparse_mla_decode_fake(q, kv_cache, indices, kv_format, softmax_scale, output, workspace,
                            lengths=None, extra_kv_cache=None, extra_indices=None, extra_lengths=None,
                            attn_sink=None, lse=None, num_splits=0):
    check_same_device("sparse_mla_decode", q=q, kv_cache=kv_cache, indices=indices, output=output,
                      workspace=workspace, lengths=lengths, extra_kv_cache=extra_kv_cache,
                      extra_indices=extra_indices, extra_lengths=extra_lengths, attn_sink=attn_sink, lse=lse)
    _fake_checks.check_decode(q, kv_cache, indices, kv_format, softmax_scale, output, workspace, lengths,
                              extra_kv_cache, extra_indices, extra_lengths, attn_sink, lse, num_splits)
    return None


@with_autograd_note
def sparse_mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    *,
    kv_format: str,
    softmax_scale: float,
    output: torch.Tensor,
    workspace: torch.Tensor,
    lengths: Optional[torch.Tensor] = None,
    extra_kv_cache: Optional[torch.Tensor] = None,
    extra_indices: Optional[torch.Tensor] = None,
    extra_lengths: Optional[torch.Tensor] = None,
    attn_sink: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None,
    num_splits: int = 0,
) -> None:
    """Sparse MLA decode attention, written in place into ``output`` (and ``lse``).

    For every query token ``t`` and head ``h``, over the valid selected rows ``i`` of the main
    set and of the optional extra set together (one softmax over their union; natural log, fp32
    accumulation, ``q.K`` in fp32 from bf16 ``q`` and dequantised ``K``)::

        s_i = softmax_scale * <q[t, h, :d_qk], K_i[:d_qk]>
        m = max_i s_i ;  l = sum_i exp(s_i - m) ;  D = l + exp(attn_sink[h] - m)   (D = l without a sink)
        output[t, h, :] = sum_i exp(s_i - m) * K_i[:512] / D
        lse[t, h]       = m + log(l)                                            (sink excluded)

    ``V`` is the first 512 dims of the row: DeepSeek V3.2 (d_qk 576) drops the 64 RoPE dims,
    DeepSeek V4 (d_qk 512) uses all 512 (RoPE lanes included; the caller un-rotates).
    A token with no valid entry gets output 0 and lse ``-inf``; ``attn_sink[h] = -inf`` means
    no sink, ``+inf`` gives output 0 and NaN gives output NaN (lse unchanged in both; a token
    with no valid entry still gets 0 and ``-inf``). A
    selected row whose score is NaN (a NaN FP8 code or NaN bf16 values in it, or NaN in
    ``q[t, h]``) makes that token and head's output and lse NaN, whatever the split count;
    unselected rows are never read, so NaN there never matters.

    Index validity: an entry ``indices[t, j]`` is skipped (and its row never read) when it is
    < 0, >= ``num_pages * page_size``, or ``j >= lengths[t]``; invalid entries may appear
    anywhere in a row. Duplicate slots count once per occurrence. Cache slots that are never
    selected may hold anything (NaN included).

    Args:
        q: ``[num_tokens, num_heads, d_qk]`` bfloat16, d_qk = 576 (V3.2) or 512 (V4). Any token
            and head strides; last dim stride 1 (on the GPU: 16-byte aligned rows, strides
            multiples of 8 elements). Not mutated.
        kv_cache: the main paged cache in ``kv_format``, ``[num_pages, page_size, row]`` or
            ``[num_pages, page_size, 1, row]``, last dim stride 1. Not mutated.
            ``"bf16"``: bfloat16, row = d_qk elements, any page stride, token stride >= d_qk
            (rows must not overlap; a ``page_size`` of 1 has no token stride to check).
            ``"fp8_ds_mla"`` (DeepSeek V3.2): uint8, row = 656 bytes per token (512 e4m3fn +
            4 fp32 scales, one per 128 elements + 64 bf16 RoPE values); any page stride, token
            stride >= 656 (as for bf16).
            ``"fp8_ds_mla_v4"`` (DeepSeek V4): uint8 view with row = 584 whose page stride
            ``stride(0)`` (bytes, >= ``page_size * 584``, usually padded to a multiple of 576)
            is honoured and whose token stride ``stride(1)`` is 584 (a page is one block of
            bytes); inside a page, ``page_size`` data rows of 576 bytes (448 e4m3fn + 64
            bf16 RoPE) then ``page_size`` groups of 8 bytes (7 UE8M0 scales, one per 64
            elements, + 1 pad). ``page_size`` is ``shape[1]`` and places the scales: pass the
            pages as written (slice dim 0 only; a view slicing dim 1 is read as a cache of
            smaller pages, with the wrong scales).
            ``"fp8_ds_mla_fnuz"`` / ``"fp8_ds_mla_v4_fnuz"``: the same two layouts byte for
            byte, with e4m3fnuz value bytes (bias 8, 0x80 = NaN, 0x7F / 0xFF = +-240) as gfx942
            (MI300) engines may write them; NVIDIA and gfx950 engines write the e4m3fn formats.
            The FP8 formats also accept int8 tensors, or float8 tensors of the format's own
            flavour (float8_e4m3fn / float8_e4m3fnuz), viewing the same bytes. On a GPU the
            cache's data pointer and its page and token strides in bytes must be multiples of
            16 (the packers' tensors are). See :mod:`mla_ext.formats` for packers.
        indices: ``[num_tokens, W]`` int32 global slot ids (``page * page_size + offset``),
            stride 1 along ``W`` (any token stride); ``W`` may be 0. Not mutated.
        kv_format: ``"bf16"``, ``"fp8_ds_mla"``, ``"fp8_ds_mla_v4"``, ``"fp8_ds_mla_fnuz"`` or
            ``"fp8_ds_mla_v4_fnuz"`` (both sets).
        softmax_scale: finite multiplier of ``q.K`` (V3.2: ``192**-0.5 * mscale**2``; V4:
            ``512**-0.5``; see :mod:`mla_ext.reference`). Scores are float32 (the dot product
            ``q.K``, then the scale). A score of -inf (also one below -3.4e38 in float32) weighs
            0 wherever it falls, whatever the split count; a (token, head) whose every score is
            -inf gets output 0 and lse -inf, as an empty row. A score of +inf (also one above
            +3.4e38 in float32, where the float64 reference stays finite) or NaN makes that
            (token, head)'s output and lse NaN; so does an inf or NaN in a selected row's value
            dims, even with weight 0.
        output: ``[num_tokens, num_heads, 512]`` bfloat16. **Mutated**: every element written.
            Any token and head strides whose elements do not overlap; last dim stride 1.
            ``output``, ``lse`` and ``workspace`` share no memory with each other or with any
            other argument (not even ``q``, whose V4 shape is the same); disjoint parts of one
            buffer are fine.
        workspace: 1-D contiguous uint8 tensor on the same device, at least
            :func:`sparse_mla_decode_workspace_size` bytes (a :class:`DecodeWorkspace`'s
            ``.tensor``). **Mutated** (scratch for split-K partial results when more than one
            split is used); its contents on entry do not matter. The op itself checks only the
            bytes this call's split count needs (none for one split), and the automatic count
            depends on the device's processor count, so a workspace that passes on the CPU can
            be too small on a GPU: size it with :func:`sparse_mla_decode_workspace_size`. Its
            data pointer must be 16-byte aligned (a fresh tensor's is) whenever it has any
            bytes, whatever the split count, so that a misaligned one fails on the CPU too.
        lengths: optional ``[num_tokens]`` int32 (any stride): entries at positions
            ``>= lengths[t]`` of ``indices`` are skipped (negative = 0).
        extra_kv_cache, extra_indices, extra_lengths: optional second set (DeepSeek V4
            compressed rows: C4 indexer top-k, C128 all rows) with its own page size, same
            format and rules; ``extra_kv_cache`` and ``extra_indices`` ``[num_tokens, W2]``
            come together, ``extra_lengths [num_tokens]`` only with them.
        attn_sink: optional ``[num_heads]`` float32 (any stride) per-head sink logit (V4):
            adds ``exp(attn_sink[h] - m)`` to the denominator only.
        lse: optional ``[num_tokens, num_heads]`` float32, any strides whose elements do not
            overlap (e.g. a ``.T`` view of a ``[num_heads, num_tokens]`` buffer). **Mutated**:
            the natural-log sum-exp of the scores, sink excluded.
        num_splits: split-K count: 0 = automatic (from num_tokens, num_heads, ``W + W2``, the
            device's processor count and whether the call can take the balanced map below,
            never from tensor contents, so a captured CUDA graph stays valid when indices and
            lengths change; at most 72; at least 2 where the balanced map applies), or 1..256
            explicitly. The workspace grows with the split count (none at one split):
            num_tokens x num_heads x num_splits x 2052 bytes (fp32 partial outputs and LSEs)
            plus num_tokens x 8 bytes (a token map the GPU's balanced map keeps), each section
            rounded up to 256 bytes; :func:`sparse_mla_decode_workspace_size` gives it.
            The call's num_tokens x num_splits splits go num_splits to each token, except for
            V4 FP8 caches with ``W + W2 >= 4096`` (long compressed rows), lengths given and
            2..512 tokens: there each token gets splits in proportion to its effective length
            (at least 1, at most 256; with an explicit num_splits the shares add up to
            num_tokens x num_splits), read on the device at run time, so one long row among
            short ones does not set the call's time. There, with num_splits=0 on a GPU at 1-16
            heads and 0.54 x the processor count to 512 tokens (72-512 on an H200), the
            automatic count is a grid of min(8, 1024 // num_tokens) slots per token (min(8,
            1536 // num_tokens) above 256 tokens; what the workspace holds), and the kernels
            use as many as the rows' mean length asks for: token t takes ceil(S' x num_tokens x
            E_t / sum(E)) slots (4/5 of that product above 256 tokens; at most 256), S' read
            from a table the launcher computes for the shape (C128 sets are sized for the
            longest context, and most rows are far shorter).

    Runs on the tensors' device (CPU with OpenMP, or CUDA/ROCm on the current stream); no
    allocation, no host synchronisation, CUDA-graph capturable. Offsets are 64-bit.

    AUTOGRAD_NOTE (mla_ext._ops.with_autograd_note fills it in)

    Precision: the CPU computes in fp32 from exactly dequantised keys. The GPU's tensor-core path
    feeds keys and probabilities to the MMA as bf16 with fp32 accumulation. Keys are exact there:
    bf16 caches and V4 keys (e4m3 times a power of two) are bf16 values, and V3.2 keys enter as
    their raw e4m3 values with the fp32 scales applied to the per-128-dim partial scores after the
    MMA (and folded into the probabilities for the value product), so only the probabilities are
    rounded to bf16 (relative 2^-9 each). Both FP8 flavours are decoded exactly on every path
    (all 256 byte values); so are V4's UE8M0 scale bytes, except that byte 0 (2^-127, a float32
    subnormal, which the packers never write) reads as 0 on the CPU under
    ``torch.set_flush_denormal(True)``.

    Raises:
        RuntimeError: before anything is written (``output``, ``lse`` and ``workspace`` are
            left untouched), naming the argument: wrong dtype / shape / strides of any tensor,
            unknown ``kv_format``, a cache row that does not match the format or q's d_qk, a V4
            page stride below ``page_size * 584`` bytes or a V4 token stride other than 584, a bf16 /
            V3.2 token stride below the row (rows overlapping), an
            incomplete extra set, tensors on different devices, ``num_splits`` outside 0..256, a
            ``softmax_scale`` not finite as a float32 (beyond 3.4e38), a workspace smaller than
            needed (the message states the bytes needed) or not 16-byte aligned, ``output`` /
            ``lse`` / ``workspace`` sharing memory with each other or with another argument,
            ``output`` / ``lse`` elements sharing memory among themselves (e.g. heads closer
            than 512 elements; ``expand()`` views), (GPU) q or cache rows not 16-byte
            aligned, or ``output`` / ``lse`` / ``workspace`` requiring grad while grad mode is
            on.
        TypeError: ``num_splits`` not an integer (a float, a bool, a tensor), ``softmax_scale`` not a
            real number (a string, a bool, a tensor, ``None``), ``kv_format`` not a string (``None``,
            bytes), or a tensor argument that is not a tensor (``None`` for a required one), naming it.
    """
    splits = _int_arg("sparse_mla_decode", "num_splits", num_splits)
    scale = _real_arg("sparse_mla_decode", "softmax_scale", softmax_scale)
    if not isinstance(kv_format, str):
        raise TypeError(f"sparse_mla_decode: expected kv_format to be a string (e.g. 'fp8_ds_mla_v4'), got "
                        f"{type(kv_format).__name__}")
    compiling = _is_compiling()
    grad = _grad_enabled()
    rec = grad and not compiling
    if grad and any_requires_grad(output, workspace, lse):  # while compiling too (a trace-time check)
        refuse_requires_grad("sparse_mla_decode", ("output", "workspace", "lse"), (output, workspace, lse))
    try:
        (_decode_op if compiling else _decode_eager)(q, kv_cache, indices, kv_format, scale, output, workspace,
                                                     lengths, extra_kv_cache, extra_indices, extra_lengths,
                                                     attn_sink, lse, splits)
    except (RuntimeError, TypeError):
        explain_bad_tensor_args(
            "sparse_mla_decode", dict(q=q, kv_cache=kv_cache, indices=indices, output=output, workspace=workspace),
            dict(lengths=lengths, extra_kv_cache=extra_kv_cache, extra_indices=extra_indices,
                 extra_lengths=extra_lengths, attn_sink=attn_sink, lse=lse))
        raise
    mark_written(rec, (output, workspace) if lse is None else (output, workspace, lse))


def _resolve_device(fn: str, device: DeviceLike) -> torch.device:
    """The CPU or an indexed CUDA device (None: the current CUDA device if any, else the CPU; an
    int: that CUDA index). TypeError for a bool or another type, ValueError for an index outside 0..127,
    an unparsable string or another device type, RuntimeError for CUDA without CUDA."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise TypeError(f"{fn}: expected device to be a torch.device, a string or a CUDA device index, got "
                        f"{type(device).__name__}")
    if isinstance(device, int):
        # torch.device wraps indices past its 8-bit range (256 -> cuda:0) or fails to unpack them.
        if not 0 <= device <= 127:
            raise ValueError(f"{fn}: expected a CUDA device index in 0..127, got {device}")
        device = torch.device("cuda", device)
    elif isinstance(device, str):
        try:
            parsed = torch.device(device)
        except RuntimeError:
            raise ValueError(f"{fn}: expected device to be 'cpu', 'cuda' or 'cuda:<index>', got {device!r}") from None
        written = device.rsplit(":", 1)[-1] if ":" in device else ""
        if parsed.type == "cuda" and written.isdigit() and int(written) != parsed.index:  # wrapped, as above
            raise ValueError(f"{fn}: expected a CUDA device index in 0..127, got {device!r}")
        device = parsed
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise ValueError(f"{fn}: expected a CPU or CUDA device, got {device}")
    if not torch.cuda.is_available():
        raise RuntimeError(f"{fn}: expected device 'cpu' or an available CUDA device, got '{device}' but "
                           f"torch {torch.__version__} sees no CUDA device")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _device_ordinal(device: torch.device) -> int:
    """-1 for the CPU, else the CUDA index (the op's device argument)."""
    return -1 if device.type == "cpu" else device.index

def sparse_mla_decode_workspace_size(num_tokens: int, num_heads: int, *, num_splits: int = 0,
                                     device: DeviceLike = None) -> int:
    """Workspace bytes :func:`sparse_mla_decode` needs for any call with at most ``num_tokens``
    query tokens and at most ``num_heads`` heads, under the same ``num_splits`` setting.

    Args:
        num_tokens: upper bound of the calls' num_tokens (>= 0).
        num_heads: upper bound of the calls' num_heads (>= 0).
        num_splits: 0 (automatic: the maximum the policy can pick over every smaller shape and
            any index width on this device) or the explicit 1..256 the calls will pass.
        device: where the calls run: a CPU or CUDA ``torch.device`` / string / CUDA index
            (an int >= 0); ``None`` = the current CUDA device when CUDA is available, else the
            CPU. The automatic split count depends on the device's processor count (CUDA:
            multiprocessor count; CPU: OpenMP threads, so size a CPU workspace after
            ``torch.set_num_threads``).

    Returns:
        bytes (int; 0 when no split-K scratch is needed, e.g. ``num_splits=1``).

    A host-side query, meant for allocation time: ``torch.compile(fullgraph=True)`` cannot trace
    it (size the workspace outside the compiled function; :meth:`DecodeWorkspace.check` is
    skipped while compiling).

    Raises:
        RuntimeError: negative sizes, ``num_tokens x num_heads`` above 2^43, ``num_splits``
            outside 0..256, a CUDA device where torch sees none or on a CPU-only build of mla_ext.
        ValueError: a device that is neither CPU nor CUDA (or a string that names none, or an
            index outside 0..127).
        TypeError: a size or ``num_splits`` that is not an integer (e.g. a float), a device of
            another type (e.g. a bool).
    """
    fn = "sparse_mla_decode_workspace_size"
    return int(_ops.sparse_mla_decode_workspace_size(_int_arg(fn, "num_tokens", num_tokens),
                                                     _int_arg(fn, "num_heads", num_heads),
                                                     _int_arg(fn, "num_splits", num_splits),
                                                     _device_ordinal(_resolve_device(fn, device))))



class DecodeWorkspace:
    """A split-K workspace for :func:`sparse_mla_decode`, allocated once and reused across
    layers and decode steps (allocate it before capturing a CUDA graph).

    Args:
        max_num_tokens: the most query tokens a call will have.
        num_heads: the most heads a call will have.
        num_splits: the ``num_splits`` the calls pass (0 = automatic).
        device: where the calls run (CPU or CUDA; ``None``, the default: the current CUDA
            device when CUDA is available, else the CPU, as
            :func:`sparse_mla_decode_workspace_size`).

    Raises:
        ValueError: ``max_num_tokens`` or ``num_heads`` negative, ``num_splits`` outside
            0..256, a device that is neither CPU nor CUDA (or a string that names none, or an
            index outside 0..127).
        TypeError: a size or ``num_splits`` that is not an integer, a device of another type.
        RuntimeError: ``max_num_tokens x num_heads`` above 2^43, a CUDA device where torch sees
            none or on a CPU-only build of mla_ext.

    Attributes:
        tensor: the 1-D uint8 workspace (pass as ``workspace=``); ``nbytes`` bytes, contents
            undefined (the op never needs it zeroed).
        max_num_tokens, num_heads, num_splits, device, nbytes.

    ``ws.check(num_tokens, num_heads)`` returns :attr:`tensor` after checking that a call of
    that size fits (``workspace=ws.check(T, H)``); see :meth:`check`.
    """

    def __init__(self, max_num_tokens: int, num_heads: int, *, num_splits: int = 0,
                 device: DeviceLike = None):
        fn = "DecodeWorkspace"
        max_num_tokens = _int_arg(fn, "max_num_tokens", max_num_tokens)
        num_heads = _int_arg(fn, "num_heads", num_heads)
        num_splits = _int_arg(fn, "num_splits", num_splits)
        if max_num_tokens < 0 or num_heads < 0:
            raise ValueError(f"{fn}: expected max_num_tokens >= 0 and num_heads >= 0, got "
                             f"max_num_tokens={max_num_tokens}, num_heads={num_heads}")
        num_splits = _splits_arg(fn, num_splits)
        dev = _resolve_device(fn, device)  # as sparse_mla_decode_workspace_size
        self.max_num_tokens = int(max_num_tokens)
        self.num_heads = int(num_heads)
        self.num_splits = int(num_splits)
        self.device = dev
        try:
            self.nbytes = sparse_mla_decode_workspace_size(self.max_num_tokens, self.num_heads,
                                                           num_splits=self.num_splits, device=dev)
        except RuntimeError as e:  # the size query's limits, in this constructor's names
            msg = str(e).replace("sparse_mla_decode_workspace_size:", f"{fn}:", 1)
            raise RuntimeError(msg.replace("num_tokens x num_heads", "max_num_tokens x num_heads", 1)) from None
        self.tensor = torch.empty(self.nbytes, dtype=torch.uint8, device=dev)

    def check(self, num_tokens: int, num_heads: int, num_splits: Optional[int] = None) -> torch.Tensor:
        """Return :attr:`tensor` after checking that a call with ``num_tokens`` tokens and
        ``num_heads`` heads (and ``num_splits``, default this workspace's) fits.

        Inside a function being compiled by ``torch.compile`` (``torch.compiler.is_compiling()``)
        it returns :attr:`tensor` unchecked, so that ``workspace=ws.check(T, H)`` traces without a
        graph break (the size query is a host-side call); :func:`sparse_mla_decode` itself still
        refuses a workspace that is too small when the compiled code runs.

        Raises:
            ValueError: the call exceeds the sizes this workspace was made for (or a size is
                negative), or uses another
                split setting that needs more bytes, or ``num_splits`` outside 0..256.
            TypeError: a size or ``num_splits`` that is not an integer.
        """
        if torch.compiler.is_compiling():
            return self.tensor
        fn = "DecodeWorkspace.check"
        num_tokens = _int_arg(fn, "num_tokens", num_tokens)
        num_heads = _int_arg(fn, "num_heads", num_heads)
        s = self.num_splits if num_splits is None else _splits_arg(fn, num_splits)
        if not (0 <= num_tokens <= self.max_num_tokens and 0 <= num_heads <= self.num_heads):
            raise ValueError(
                f"{fn}: made for 0 <= num_tokens <= {self.max_num_tokens}, 0 <= num_heads <= "
                f"{self.num_heads}, got num_tokens={num_tokens}, num_heads={num_heads}")
        need = sparse_mla_decode_workspace_size(num_tokens, num_heads, num_splits=s, device=self.device)
        if need > self.nbytes:
            raise ValueError(f"{fn}: num_splits={s} needs {need} bytes, this workspace has "
                             f"{self.nbytes} (made for num_splits={self.num_splits})")
        return self.tensor

    def __repr__(self) -> str:
        return (f"DecodeWorkspace(max_num_tokens={self.max_num_tokens}, num_heads={self.num_heads}, "
                f"num_splits={self.num_splits}, device={self.device}, nbytes={self.nbytes})")
