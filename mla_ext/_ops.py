"""Python entry points of the ops, with their fake (meta) implementations for torch.compile."""
from __future__ import annotations

import operator
from typing import Optional

import torch
from torch.autograd.graph import increment_version

from . import _fake_checks

_ops = torch.ops.mla_ext
# Resolved overloads: calling .default skips the overload lookup on every call (host time).
_merge_op = torch.ops.mla_ext.merge_attn_states.default
_merge_n_op = torch.ops.mla_ext.merge_attn_states_n.default


def eager_callable(overload):
    """The C++ callable that ``overload.__call__`` forwards to (``OpOverload._op``), for eager
    calls: the same dispatcher entry (modes, subclasses and fake tensors intercept it alike) with
    one Python frame less, ~0.2 us of host time per call. ``torch.compile`` cannot trace it, so the
    wrappers call ``overload`` itself while compiling."""
    return getattr(overload, "_op", overload)


_merge_eager = eager_callable(_merge_op)
_merge_n_eager = eager_callable(_merge_n_op)


def is_integer_dtype(dtype: torch.dtype) -> bool:
    """An integer dtype (not floating, complex or bool): what slot ids, indices and bytes take."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def int_arg(fn: str, name: str, value) -> int:
    """``value`` as an int: a TypeError naming the argument for floats, bools and other
    non-integers (``int()`` would silently truncate 2.5 to 2; ``True`` is not a count), a
    RuntimeError for values outside int64 (the ops' integer type). A tensor is refused too,
    even one integer element: reading it would synchronise the host with its device (and fail
    under CUDA-graph capture), where these arguments are host-side shape decisions."""
    if type(value) is int and -(2**63) <= value < 2**63:  # the common case first (host time)
        return value
    if isinstance(value, bool):
        raise TypeError(f"{fn}: expected {name} to be an integer, got {value!r}")
    if isinstance(value, torch.Tensor):
        raise TypeError(f"{fn}: expected {name} to be an integer, got a tensor ({value.dtype}, shape "
                        f"{tuple(value.shape)}, {value.device}); pass a Python int")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{fn}: expected {name} to be an integer, got {value!r}") from None
    if not -(2**63) <= v < 2**63:
        raise RuntimeError(f"{fn}: expected {name} to fit in int64, got {v}")
    return v


def explain_bad_tensor_args(op: str, required: dict, optional: dict) -> None:
    """After an op call failed: raise a TypeError naming the first argument that is not a tensor
    (required) or neither None nor a tensor (optional), if any, else a RuntimeError naming the
    first tensor that is not dense (a sparse or other non-strided layout, which torch's dispatcher
    refuses before the op sees it); torch's own messages for these (e.g. from a None passed as a
    required tensor) do not name the argument. Returns otherwise, and the caller re-raises the
    original error. Only runs on the error path (no host time on successful calls)."""
    for name, t in required.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: expected {name} to be a torch.Tensor, got {type(t).__name__}")
    for name, t in optional.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: expected {name} to be a torch.Tensor or None, got {type(t).__name__}")
    for name, t in (*required.items(), *optional.items()):
        if t is not None and t.layout != torch.strided:
            raise RuntimeError(f"{op}: expected {name} to be a dense (strided) tensor, got layout {t.layout}")


def explain_bad_merge_args(op: str, output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse,
                           output_scale) -> None:
    """explain_bad_tensor_args for merge_attn_states' tensors (its own and the vLLM wrapper's)."""
    explain_bad_tensor_args(
        op, dict(output=output, prefix_output=prefix_output, prefix_lse=prefix_lse, suffix_output=suffix_output,
                 suffix_lse=suffix_lse),
        dict(output_lse=output_lse, output_scale=output_scale))


def refuse_requires_grad(op: str, names: tuple, tensors: tuple) -> None:
    """With grad mode on (eager, or while torch.compile traces the wrapper: the check is static
    there), before an op writes ``tensors``
    (``names[i]`` for ``tensors[i]``; ``None`` and non-tensors skipped, the op names those):
    refuse a tensor that requires grad (RuntimeError naming it). The ops have no backward, so
    writing such a tensor would leave autograd a wrong history: a leaf (or a view of one) is what
    torch's own in-place ops refuse, and a non-leaf would keep its old ``grad_fn``, so a later
    backward would run and give wrong gradients. The wrappers call it only when one of them
    requires grad (their fast check is two attribute reads)."""
    for name, t in zip(names, tensors):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise RuntimeError(f"{op}: {name} requires grad; the op has no backward, so it cannot write it while "
                               "grad mode is on (call it under torch.no_grad() or torch.inference_mode(), or pass "
                               "a tensor that does not require grad)")


def _pick_bump_versions():
    """torch's own C++ function behind ``increment_version`` when it takes an iterable of
    tensors, the form the public wrapper calls it with (~0.1 us less per call than the wrapper),
    else the public one. Checked with an empty tuple: no tensor is made, so no op runs at import
    for an active mode to see."""
    fast = getattr(torch._C, "_increment_version", None)
    if fast is not None:
        try:
            fast(())
            return fast
        except (TypeError, RuntimeError):  # another signature: use the public function
            pass
    return increment_version


_bump_versions = _pick_bump_versions()


def mark_written(rec: bool, tensors: tuple) -> None:
    """Record in autograd that the op wrote ``tensors`` in place (their version counters, as
    torch's own in-place ops do), so that a tensor saved for backward and overwritten by the op
    makes backward fail instead of using the new values. ``rec``: whether autograd records
    (grad mode on, not compiling), read before the call; ~0.2-0.3 us when it is true. A tuple
    of tensors, no ``None``. Under ``torch.no_grad()`` nothing is bumped (unlike torch's in-place
    ops; the public docstrings say so): a graph built earlier with grad mode on and run backward
    after such a call does not notice the overwrite. Nor inside torch.compile: the compiled
    graph applies the op's writes to its inputs without bumping their versions (the op has no
    autograd kernel), which a bump while tracing would not change."""
    if rec:
        _bump_versions(tensors)


_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling


def any_requires_grad(a, b, c=None) -> bool:
    """Whether any of the tensors requires grad (None and non-tensors: no)."""
    try:
        return a.requires_grad or (b is not None and b.requires_grad) or (c is not None and c.requires_grad)
    except AttributeError:
        return False


# The autograd paragraph of every public op's docstring (one text, filled in at import).
_AUTOGRAD_NOTE = """\
    Not differentiable: inputs that require grad are read as constants (the outputs do not
    require grad, and no gradient flows back through the call). With grad mode on, the written
    tensors' version counters are bumped as by torch's in-place ops (a backward that needs a
    saved tensor this overwrote then fails). With grad mode off (``torch.no_grad()``) they are
    not (host time on the serving path): a later backward through a graph that saved a tensor
    overwritten then uses the new values without an error, where torch's in-place ops would
    make it fail. Inside ``torch.compile`` they are not bumped either (the op has no autograd
    kernel, so the compiled graph applies its writes unseen by autograd): there too such a
    backward uses the new values. With grad mode on, a written tensor that requires grad, leaf
    or not, is refused (RuntimeError, naming it: with no backward the op would leave it a wrong
    history), also inside ``torch.compile`` (checked while tracing; with ``fullgraph=True``
    Dynamo's error quotes it). The ``torch.ops.mla_ext`` ops themselves do not look at autograd
    state. Unlike torch's in-place ops, it writes an inference tensor outside
    ``torch.inference_mode()`` (checking would cost every eager call host time; such a tensor
    cannot be in an autograd graph).
"""
_AUTOGRAD_MARKER = "    AUTOGRAD_NOTE (mla_ext._ops.with_autograd_note fills it in)\n"


def with_autograd_note(fn):
    """Decorator: put the shared autograd paragraph into ``fn``'s docstring at its marker line."""
    if fn.__doc__:  # (None under python -OO)
        fn.__doc__ = fn.__doc__.replace(_AUTOGRAD_MARKER, _AUTOGRAD_NOTE)
    return fn


def check_same_device(op: str, **tensors) -> None:
    """Raise RuntimeError when the given tensors (None skipped) are not all on one device.

    Used by the fake (meta) implementations: a mix of meta and real tensors dispatches there,
    and must fail like the real kernels do instead of silently writing nothing."""
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if first is None:
            first = (name, t.device)
        elif t.device != first[1]:
            raise RuntimeError(f"{op}: expected {name} on the same device as {first[0]} ({first[1]}), "
                               f"got {t.device}")


@torch.library.register_fake("mla_ext::merge_attn_states")
def _merge_attn_states_fake(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse,
                            prefill_tokens_with_context=None, output_scale=None):
    check_same_device("merge_attn_states", output=output, output_lse=output_lse, prefix_output=prefix_output,
                      prefix_lse=prefix_lse, suffix_output=suffix_output, suffix_lse=suffix_lse,
                      output_scale=output_scale)
    _fake_checks.check_merge(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse,
                             prefill_tokens_with_context, output_scale)
    return None


@torch.library.register_fake("mla_ext::merge_attn_states_n")
def _merge_attn_states_n_fake(output, output_lse, values, lses, attn_sink=None):
    check_same_device("merge_attn_states_n", output=output, output_lse=output_lse, values=values, lses=lses,
                      attn_sink=attn_sink)
    _fake_checks.check_merge_n(output, output_lse, values, lses, attn_sink)
    return None


@with_autograd_note
def merge_attn_states(
    output: torch.Tensor,
    output_lse: Optional[torch.Tensor],
    prefix_output: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix_output: torch.Tensor,
    suffix_lse: torch.Tensor,
    prefill_tokens_with_context: Optional[int] = None,
    output_scale: Optional[torch.Tensor] = None,
) -> None:
    """Merge two partial attention results over disjoint key sets, in place.

    For every token ``t`` and head ``h`` (natural-log LSE, fp32 arithmetic)::

        m = max(a, b)                     a = prefix_lse[t, h], b = suffix_lse[t, h]
        output[t, h]     = (e^(a-m) prefix_output[t, h] + e^(b-m) suffix_output[t, h]) / (e^(a-m) + e^(b-m))
        output_lse[t, h] = m + log(e^(a-m) + e^(b-m))

    Typical use: MLA chunked prefill, where ``prefix`` is attention over the cached
    context and ``suffix`` over the new tokens; ``output`` can be a view straight
    into the layer's output buffer (no copy).

    Args:
        output: ``[num_tokens, num_heads, head_size]`` float32 / float16 / bfloat16
            (the inputs' dtype), or float8_e4m3fn / float8_e4m3fnuz together with
            ``output_scale``. **Mutated**: fully written. Any token and head strides whose
            elements do not overlap; the last dim must have stride 1. May be the very same view as
            ``prefix_output`` or ``suffix_output`` (in place: same data pointer, dtype,
            shape and strides); any other overlap with an input, or with an LSE or
            ``output_scale``, is refused.
        output_lse: optional ``[num_tokens, num_heads]`` float32, any strides, sharing no
            byte with any other argument (``output``, the inputs, ``output_scale``; disjoint
            fields of one buffer are fine). **Mutated**: the merged LSE (natural log).
            ``None`` skips it.
        prefix_output: ``[num_tokens, num_heads, head_size]`` float32 / float16 /
            bfloat16 (``output``'s dtype unless ``output`` is FP8), its own
            token/head strides, last dim stride 1.
        prefix_lse: ``[num_tokens, num_heads]`` float32, any strides (vLLM's
            ``[num_heads, num_tokens]`` buffers pass as ``.T`` views).
        suffix_output: like ``prefix_output`` (same dtype).
        suffix_lse: like ``prefix_lse``.
        prefill_tokens_with_context: optional int >= 0. Tokens ``t >=`` it have no
            prefix (e.g. decode tokens packed after the prefills of a chunked-prefill
            batch): their ``output`` is ``suffix_output`` copied (bit-exact, or
            quantised for an FP8 output) and their ``output_lse`` is ``suffix_lse``
            copied verbatim; ``prefix_output`` and ``prefix_lse`` are not read for
            them. Values above ``num_tokens`` mean every token merges; ``None``
            (default): every token merges.
        output_scale: optional float32 tensor of exactly one element (any shape, on
            ``output``'s device), the per-tensor static scale of an FP8 ``output``;
            required for FP8 and rejected otherwise. Each output element is the
            fp32 merged value times the fp32 ``1 / output_scale`` (as vLLM computes it; at a
            rounding tie this can differ from an exact division by one FP8 step),
            saturated to the format's largest finite value (448 for e4m3fn, 240 for
            e4m3fnuz; +-inf saturate too), rounded to nearest even; NaN stays NaN.
            The scale is read on the device at run time (a captured CUDA graph
            picks up a new value); it should be positive and finite, with a finite
            reciprocal (>= 2.94e-39: below that ``1 / output_scale`` is inf and an
            exactly-zero merged value becomes NaN, 0 x inf). LSEs are not scaled.

    Edge cases: an LSE of ``+inf`` or ``-inf`` marks an empty side; one empty
    side selects the other side's values exactly (NaN or garbage in the empty
    side's values cannot leak); both empty gives output 0 and LSE ``-inf``; a NaN
    LSE gives NaN output and LSE. Zero tokens or heads return at once; so does head_size 0
    without ``output_lse`` (with one it is refused: the LSE would not be written).

    Runs on the tensors' device (CPU or CUDA/ROCm), on the current stream,
    allocates nothing and never synchronises, so it can be captured in a CUDA
    graph. Element offsets are 64-bit.

    AUTOGRAD_NOTE (mla_ext._ops.with_autograd_note fills it in)

    Raises:
        RuntimeError: before anything is written, naming the argument, when value
            dtypes differ or are not float32/float16/bfloat16 (output: or FP8), an
            LSE is not float32, shapes do not match ``output``'s, a last dim is not
            contiguous, tensors are on different devices, ``output_lse`` has the
            wrong shape or shares memory with another argument, ``output`` overlaps an input
            other than as the very same view or shares memory with an LSE or
            ``output_scale``, an FP8 output comes
            without ``output_scale`` (or a scale with a non-FP8 output),
            ``output_scale`` is not float32 / not one element / on another device,
            ``prefill_tokens_with_context < 0`` or beyond int64, head_size is 2^31 or more or
            0 with an ``output_lse`` (and tokens and heads), or ``output`` / ``output_lse``
            elements share memory among themselves (e.g. heads closer than head_size
            elements apart; ``expand()`` views), or ``output`` / ``output_lse`` requires
            grad while grad mode is on.
        TypeError: ``prefill_tokens_with_context`` is not an integer (a float, a bool, a tensor), or a
            tensor argument is not a tensor (``None`` for a required one), naming it.
    """
    ctx = (None if prefill_tokens_with_context is None
           else int_arg("merge_attn_states", "prefill_tokens_with_context", prefill_tokens_with_context))
    # any_requires_grad() and mark_written() inlined (host time of the hottest call).
    compiling = _is_compiling()
    grad = _grad_enabled()
    rec = grad and not compiling
    if grad and (getattr(output, "requires_grad", False) or getattr(output_lse, "requires_grad", False)):
        refuse_requires_grad("merge_attn_states", ("output", "output_lse"), (output, output_lse))
    try:
        if ctx is None and output_scale is None and not compiling:
            # The schema's defaults for the last two: two arguments fewer to parse (~0.1 us per call).
            _merge_eager(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse)
        else:
            (_merge_op if compiling else _merge_eager)(output, output_lse, prefix_output, prefix_lse, suffix_output,
                                                       suffix_lse, ctx, output_scale)
    except (RuntimeError, TypeError):
        explain_bad_merge_args("merge_attn_states", output, output_lse, prefix_output, prefix_lse, suffix_output,
                               suffix_lse, output_scale)
        raise
    if rec:
        _bump_versions((output,) if output_lse is None else (output, output_lse))


@with_autograd_note
def merge_attn_states_n(
    output: torch.Tensor,
    output_lse: Optional[torch.Tensor],
    values: torch.Tensor,
    lses: torch.Tensor,
    attn_sink: Optional[torch.Tensor] = None,
) -> None:
    """Merge ``num_states`` partial attention results over disjoint key sets at once, in place.

    The S-way form of :func:`merge_attn_states` (e.g. the per-rank partial results of
    context-parallel decode, or split-K partials): for every token ``t`` and head ``h``,
    over the non-empty states ``s`` (natural-log LSE, fp32 arithmetic)::

        m = max_s lses[s, t, h] ;  w_s = exp(lses[s, t, h] - m)
        output[t, h]     = sum_s w_s * values[s, t, h] / (sum_s w_s + exp(attn_sink[h] - m))
        output_lse[t, h] = m + log(sum_s w_s)                       (sink excluded)

    (no ``attn_sink``: the ``exp(attn_sink[h] - m)`` term is 0.)

    One pass over memory: each state's values are read once and the output written once
    (no chain of S-1 two-way merges through intermediate buffers).

    Args:
        output: ``[num_tokens, num_heads, head_size]`` float32 / float16 / bfloat16.
            **Mutated**: fully written. Any token and head strides whose elements do not
            overlap, last dim stride 1. May be the very same view as one state ``values[s]`` (in place: same data
            pointer, shape and strides; every state is read before the output element is
            written); any other overlap with ``values``, ``lses``, ``output_lse`` or
            ``attn_sink`` is refused.
        output_lse: optional ``[num_tokens, num_heads]`` float32, any strides, sharing no
            element with ``lses``. **Mutated**: the merged LSE. ``None`` skips it.
        values: ``[num_states, num_tokens, num_heads, head_size]`` of ``output``'s dtype,
            any state, token and head strides, last dim stride 1; ``num_states >= 1``
            (no upper limit). Not mutated.
        lses: ``[num_states, num_tokens, num_heads]`` float32, any strides (e.g. a
            permuted view of ``[num_states, num_heads, num_tokens]`` buffers). Not mutated.
        attn_sink: optional ``[num_heads]`` float32 (any stride) per-head sink logit
            (DeepSeek V4), added to the denominator exactly as :func:`mla_ext.sparse_mla_decode`
            does, and left out of ``output_lse`` as there. States computed *without* the sink
            and merged *with* it equal one decode over the union of their keys with the sink
            (the sink enters once; see :mod:`mla_ext.parallel`). ``-inf`` = no sink,
            ``+inf`` gives output 0. Not mutated.

    Edge cases (per token and head): an LSE of ``+inf`` or ``-inf`` marks an empty state,
    whose values are never read; every state empty gives output 0 and LSE ``-inf`` (sink or
    not); exactly one non-empty state is selected exactly (its values copied bit for bit, its
    LSE) when there is no sink (or it is ``-inf``), and scaled by ``1 / (1 + exp(sink -
    lse))`` otherwise; any NaN LSE gives NaN output and LSE; a NaN sink gives NaN output
    where some state is non-empty (with every state empty the 0 / ``-inf`` rule wins).
    Zero tokens or heads return at once; so does head_size 0 without ``output_lse`` (with
    one it is refused: the LSE would not be written).

    Runs on the tensors' device (CPU or CUDA/ROCm), on the current stream, allocates
    nothing and never synchronises (CUDA-graph capturable). Offsets are 64-bit.

    AUTOGRAD_NOTE (mla_ext._ops.with_autograd_note fills it in)

    Raises:
        RuntimeError: before anything is written, naming the argument, when ``values`` is
            not 4-D ``[num_states, *output.shape]`` or has no state, dtypes differ or are
            not float32/float16/bfloat16, ``lses`` / ``output_lse`` are not float32 or have
            the wrong shape, ``output_lse`` shares memory with ``lses`` or ``attn_sink``,
            ``output`` overlaps ``values`` other than as one state's very same view or
            shares memory with ``lses`` / ``output_lse`` / ``attn_sink``, a last dim is not
            contiguous, ``attn_sink`` is not float32 ``[num_heads]``, tensors are on
            different devices, ``output`` / ``output_lse`` elements share memory among
            themselves, head_size is 2^31 or more, or 0 with an ``output_lse`` (and tokens and
            heads), or ``output`` / ``output_lse`` requires grad while grad mode is on.
        TypeError: a tensor argument that is not a tensor (``None`` for a required one),
            naming it.
    """
    compiling = _is_compiling()
    grad = _grad_enabled()
    rec = grad and not compiling
    if grad and any_requires_grad(output, output_lse):
        refuse_requires_grad("merge_attn_states_n", ("output", "output_lse"), (output, output_lse))
    try:
        (_merge_n_op if compiling else _merge_n_eager)(output, output_lse, values, lses, attn_sink)
    except (RuntimeError, TypeError):
        explain_bad_tensor_args("merge_attn_states_n", dict(output=output, values=values, lses=lses),
                                dict(output_lse=output_lse, attn_sink=attn_sink))
        raise
    mark_written(rec, (output,) if output_lse is None else (output, output_lse))
