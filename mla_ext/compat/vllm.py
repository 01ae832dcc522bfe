"""vLLM's call shape for merge_attn_states.

vLLM keeps LSE buffers as ``[num_heads, num_tokens]``; mla_ext takes any LSE
strides, so they are passed as zero-copy transposed views.
"""
from __future__ import annotations

from typing import Optional

import torch

from .._ops import explain_bad_merge_args
from .._ops import merge_attn_states as _merge


def merge_attn_states(
    output: torch.Tensor,
    prefix_output: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix_output: torch.Tensor,
    suffix_lse: torch.Tensor,
    output_lse: Optional[torch.Tensor] = None,
    prefill_tokens_with_context: Optional[int] = None,
    output_scale: Optional[torch.Tensor] = None,
) -> None:
    """vLLM-compatible ``merge_attn_states``: same math as :func:`mla_ext.merge_attn_states`.

    The LSE buffers are taken in vLLM's ``[num_heads, num_tokens]`` layout and passed on as
    zero-copy transposed views; everything else (math, edge cases: ``+inf`` / ``-inf`` LSE
    marks an empty side, NaN propagates; aliasing rules; autograd) is
    :func:`mla_ext.merge_attn_states`'s.

    Args:
        output: ``[num_tokens, num_heads, head_size]`` float32/float16/bfloat16 (the inputs'
            dtype) or float8_e4m3fn/float8_e4m3fnuz with ``output_scale``; **mutated**; any
            token/head strides, last dim stride 1; may be the very same view as
            ``prefix_output`` or ``suffix_output`` (in place), must not otherwise share memory
            with an input.
        prefix_output, suffix_output: ``[num_tokens, num_heads, head_size]``, same dtype; any
            token/head strides (independent of each other and of ``output``), last dim stride
            1. Not mutated (unless one is ``output``).
        prefix_lse, suffix_lse: ``[num_heads, num_tokens]`` float32 (vLLM's layout), natural
            log, any strides. Not mutated.
        output_lse: optional ``[num_heads, num_tokens]`` float32, any strides, **mutated**.
        prefill_tokens_with_context: optional int; tokens at and after it copy the suffix
            (values and LSE) instead of merging (decode tokens packed after the prefills).
        output_scale: float32 one-element per-tensor scale of an FP8 ``output``: the merged
            value is multiplied by the fp32 ``1 / output_scale`` (as vLLM's kernel does) and
            saturated to the format's max (448 / 240).

    Raises:
        RuntimeError: as :func:`mla_ext.merge_attn_states` (shapes are checked on
            the transposed ``[num_tokens, num_heads]`` views; that includes refusing an
            ``output`` / ``output_lse`` that requires grad while grad mode is on).
        TypeError: ``prefill_tokens_with_context`` is not an integer (a float, a bool, a
            tensor), or a tensor argument is not a tensor (``None`` for a required one), naming it.
    """
    try:
        for name, lse in (("prefix_lse", prefix_lse), ("suffix_lse", suffix_lse), ("output_lse", output_lse)):
            if lse is not None and lse.dim() != 2:
                raise RuntimeError(f"merge_attn_states (vLLM layout): expected {name} to be 2-D "
                                   f"[num_heads, num_tokens], got shape {list(lse.shape)}")
        if output.dim() == 3:
            want = (output.shape[1], output.shape[0])
            for name, lse in (("prefix_lse", prefix_lse), ("suffix_lse", suffix_lse), ("output_lse", output_lse)):
                if lse is not None and tuple(lse.shape) != want:
                    raise RuntimeError(f"merge_attn_states (vLLM layout): expected {name} of shape "
                                       f"[num_heads, num_tokens] = [{want[0]}, {want[1]}], got {list(lse.shape)}")
        _merge(output, None if output_lse is None else output_lse.transpose(0, 1),
               prefix_output, prefix_lse.transpose(0, 1), suffix_output, suffix_lse.transpose(0, 1),
               prefill_tokens_with_context, output_scale)
    except AttributeError:
        # A non-tensor met the checks or transposes here: name it (error path only).
        explain_bad_merge_args("merge_attn_states (vLLM layout)", output, output_lse, prefix_output, prefix_lse,
                               suffix_output, suffix_lse, output_scale)
        raise
