"""SGLang's call shapes for merging two attention states.

SGLang merges the partial results of chunked-prefix MLA prefill with
``sglang.srt.layers.attention.merge_state.merge_state(prefix_output, prefix_lse, suffix_output,
suffix_lse, output=None, output_lse=None)``, which dispatches to ``sgl_kernel.merge_state_v2(v_a,
s_a, v_b, s_b, v_merged=None, s_merged=None)`` (or a Triton kernel). Both take the LSE as
``[num_tokens, num_heads]`` (token-major, unlike vLLM's ``[num_heads, num_tokens]``), natural log,
and return ``(output, output_lse)``, allocating whichever of the two was not given.

The functions here keep those signatures and that return, and run :func:`mla_ext.merge_attn_states`
(whose math and edge cases apply: ``+inf`` / ``-inf`` LSE marks an empty side, both empty gives
output 0 and LSE ``-inf`` where SGLang's kernels give NaN, NaN propagates). Unlike SGLang's CUDA
kernel they take strided value tensors (any token/head strides) and any head size from 1 (SGLang's
needs a multiple of 4 or 8); pass ``output`` and ``output_lse`` to keep the call allocation-free.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .._ops import explain_bad_tensor_args
from .._ops import merge_attn_states as _merge

_OP = "merge_state (SGLang layout)"


def _lse_f32(lse):
    """SGLang's wrappers cast the LSE inputs to float32 (``s.to(torch.float32)``, a copy only when
    they are not float32 already); the same here for floating LSEs. Other dtypes pass through, so
    that the op names them in its error."""
    if isinstance(lse, torch.Tensor) and lse.dtype != torch.float32 and lse.dtype.is_floating_point:
        return lse.to(torch.float32)
    return lse


def merge_state(
    prefix_output: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix_output: torch.Tensor,
    suffix_lse: torch.Tensor,
    output: Optional[torch.Tensor] = None,
    output_lse: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """SGLang-compatible ``merge_state``: the same math as :func:`mla_ext.merge_attn_states`.

    Args:
        prefix_output, suffix_output: ``[num_tokens, num_heads, head_size]`` float32/float16/
            bfloat16, same dtype and shape; any token/head strides (independent of each other),
            last dim stride 1. Not mutated (unless one is ``output``).
        prefix_lse, suffix_lse: ``[num_tokens, num_heads]`` (SGLang's layout), natural log, any
            strides; float32, or another floating dtype, which is cast to a float32 copy first
            (as SGLang's wrappers do). Not mutated. An LSE in vLLM's ``[num_heads, num_tokens]``
            layout is refused by shape, except when num_tokens equals num_heads: then it is read
            transposed, and no check can tell.
        output: optional ``[num_tokens, num_heads, head_size]`` of the inputs' dtype, any
            token/head strides, last dim stride 1; **mutated**; may be the very same view as
            ``prefix_output`` or ``suffix_output`` (in place), must not otherwise share memory
            with an input. ``None``: allocated with ``torch.empty_like(prefix_output)``.
        output_lse: optional ``[num_tokens, num_heads]`` float32, any strides, sharing no memory
            with an input; **mutated**. ``None``: allocated with ``torch.empty_like(prefix_lse,
            dtype=torch.float32)``.

    Returns:
        ``(output, output_lse)``: the tensors written (the ones passed, or the new ones).

    Autograd: as :func:`mla_ext.merge_attn_states`, no backward. A passed output that requires
    grad is refused while grad mode is on; allocated outputs do not require grad, whatever the
    inputs.

    Raises:
        RuntimeError: as :func:`mla_ext.merge_attn_states` (dtypes, shapes, devices, strides,
            overlaps), before anything is written. Its messages name the op's arguments: where
            this function allocated ``output`` / ``output_lse``, a message about them is about
            ``prefix_output`` / ``prefix_lse`` they were made from, and the message says so.
        TypeError: a tensor argument is not a tensor (``None`` for a required one), naming it.
    """
    try:
        prefix_lse = _lse_f32(prefix_lse)
        suffix_lse = _lse_f32(suffix_lse)
        made = []
        if output is None:
            output = torch.empty_like(prefix_output)
            made.append("output as torch.empty_like(prefix_output)")
        if output_lse is None:
            output_lse = torch.empty_like(prefix_lse, dtype=torch.float32)
            made.append("output_lse as torch.empty_like(prefix_lse, dtype=torch.float32)")
        try:
            _merge(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse)
        except RuntimeError as e:
            if not made:
                raise
            # The op's checks met a tensor made here: say what it was made from.
            raise RuntimeError(f"{e}\n({_OP} allocated {' and '.join(made)}, as SGLang does when they are not "
                               "given: a message above about output / output_lse is about prefix_output / "
                               "prefix_lse)") from e
    except (AttributeError, TypeError):
        # A non-tensor met the code above (error path only): name it. The outputs are optional
        # here (None: allocated), so only the inputs are required.
        explain_bad_tensor_args(_OP, dict(prefix_output=prefix_output, prefix_lse=prefix_lse,
                                          suffix_output=suffix_output, suffix_lse=suffix_lse),
                                dict(output=output, output_lse=output_lse))
        raise
    return output, output_lse


def merge_state_v2(
    v_a: torch.Tensor,
    s_a: torch.Tensor,
    v_b: torch.Tensor,
    s_b: torch.Tensor,
    v_merged: Optional[torch.Tensor] = None,
    s_merged: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``sgl_kernel.merge_state_v2``'s names for :func:`merge_state`: ``v_a`` / ``s_a`` the
    prefix's values and ``[num_tokens, num_heads]`` LSE, ``v_b`` / ``s_b`` the suffix's,
    ``v_merged`` / ``s_merged`` the optional outputs (**mutated**). Returns ``(v_merged,
    s_merged)``; everything else as :func:`merge_state` (its errors name the arguments by
    :func:`merge_state`'s names: ``v_a`` is ``prefix_output``, ``s_b`` is ``suffix_lse``)."""
    return merge_state(v_a, s_a, v_b, s_b, v_merged, s_merged)
