"""Python entry points of the ops, with their fake (meta) implementations for torch.compile."""
from __future__ import annotations

from typing import Optional

import torch

_ops = torch.ops.mla_ext
# Resolved overloads: calling .default skips the overload lookup on every call (host time).
_merge_op = torch.ops.mla_ext.merge_attn_states.default


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
def _merge_attn_states_fake(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse):
    check_same_device("merge_attn_states", output=output, output_lse=output_lse, prefix_output=prefix_output,
                      prefix_lse=prefix_lse, suffix_output=suffix_output, suffix_lse=suffix_lse)
    return None


def merge_attn_states(
    output: torch.Tensor,
    output_lse: Optional[torch.Tensor],
    prefix_output: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix_output: torch.Tensor,
    suffix_lse: torch.Tensor,
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
        output: ``[num_tokens, num_heads, head_size]`` float32 / float16 / bfloat16.
            **Mutated**: fully written. Any token and head strides; the last dim
            must have stride 1. May alias ``prefix_output`` or ``suffix_output``.
        output_lse: optional ``[num_tokens, num_heads]`` float32, any strides.
            **Mutated**: the merged LSE (natural log). ``None`` skips it.
        prefix_output: ``[num_tokens, num_heads, head_size]``, dtype of ``output``,
            its own token/head strides, last dim stride 1.
        prefix_lse: ``[num_tokens, num_heads]`` float32, any strides (vLLM's
            ``[num_heads, num_tokens]`` buffers pass as ``.T`` views).
        suffix_output: like ``prefix_output``.
        suffix_lse: like ``prefix_lse``.

    Edge cases: an LSE of ``+inf`` or ``-inf`` marks an empty side; one empty
    side selects the other side's values exactly (NaN or garbage in the empty
    side's values cannot leak); both empty gives output 0 and LSE ``-inf``; a NaN
    LSE gives NaN output and LSE. Zero tokens or heads return at once.

    Runs on the tensors' device (CPU or CUDA/ROCm), on the current stream,
    allocates nothing and never synchronises, so it can be captured in a CUDA
    graph. Element offsets are 64-bit.

    Raises:
        RuntimeError: before anything is written, naming the argument, when value
            dtypes differ or are not float32/float16/bfloat16, an LSE is not
            float32, shapes do not match ``output``'s, a last dim is not
            contiguous, tensors are on different devices, or ``output_lse`` has
            the wrong shape.
    """
    _merge_op(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse)
