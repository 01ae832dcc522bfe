"""Argument checks of the fake (meta) implementations, so that torch.compile tracing and meta
tensors refuse what the real ops refuse (csrc/torch/common.h, csrc/torch/decode_params.h) at
trace time instead of at run time.

The subset that depends only on dtypes, dims, shapes and scalar arguments, with the real ops'
wording: not strides, memory overlap, alignment or the workspace size (which depends on the
device's processor count). Shapes may be symbolic: each comparison is a guard, as in any fake.
"""
from __future__ import annotations

import math
import struct

import torch

_VALUE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
# kv_format -> (d_qk it requires or None, cache dtypes, cache row: None = d_qk elements)
_KV_FORMATS = {
    "bf16": (None, (torch.bfloat16,), None),
    "fp8_ds_mla": (576, (torch.uint8, torch.int8, torch.float8_e4m3fn), 656),
    "fp8_ds_mla_fnuz": (576, (torch.uint8, torch.int8, torch.float8_e4m3fnuz), 656),
    "fp8_ds_mla_v4": (512, (torch.uint8, torch.int8, torch.float8_e4m3fn), 584),
    "fp8_ds_mla_v4_fnuz": (512, (torch.uint8, torch.int8, torch.float8_e4m3fnuz), 584),
}
_MAX_SPLITS = 256


def _finite_as_float32(x: float) -> bool:
    """As C++'s isfinite(float(x)): packing raises where the rounded value overflows."""
    try:
        return math.isfinite(struct.unpack("f", struct.pack("f", x))[0])
    except OverflowError:
        return False


def _need(cond, op: str, msg: str) -> None:
    if not cond:
        raise RuntimeError(f"{op}: {msg}")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _lse(op: str, t, name: str, T, H, q=None) -> None:
    """q: the decode op's, whose sizes set num_tokens and num_heads (named in the message)."""
    _need(t.dtype == torch.float32, op, f"expected {name} to be float32, got {_name(t.dtype)}")
    where = "" if q is None else "; num_tokens, num_heads = q.size(0), q.size(1)"
    seen = "" if q is None else f" (q {list(q.shape)})"
    _need(t.dim() == 2 and t.shape[0] == T and t.shape[1] == H, op,
          f"expected {name} of shape [num_tokens, num_heads] = [{T}, {H}] (any strides{where}), got "
          f"{list(t.shape)}{seen}")


def _lse_needs_values(op: str, T, H, D) -> None:
    _need(D > 0 or T == 0 or H == 0, op, f"got head_size 0 with {T} tokens and {H} heads: output_lse would not "
          "be written; pass output_lse=None or head_size >= 1")


def check_merge(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse,
                prefill_tokens_with_context, output_scale) -> None:
    op = "merge_attn_states"
    _need(output.dim() == 3, op,
          f"expected output to be 3-D [num_tokens, num_heads, head_size], got shape {list(output.shape)}")
    T, H, D = output.shape
    _need(D < 2 ** 31, op, f"expected head_size below 2^31 elements, got {D}")
    fp8 = output.dtype in _FP8_DTYPES
    if fp8:
        _need(output_scale is not None, op,
              f"expected output_scale (a float32 tensor of one element) with a {_name(output.dtype)} output, got None")
    else:
        _need(output.dtype in _VALUE_DTYPES, op, "expected output to be float32, float16 or bfloat16 (or "
              f"float8_e4m3fn / float8_e4m3fnuz with output_scale), got {_name(output.dtype)}")
        _need(output_scale is None, op, "expected output_scale to be None: it applies to float8_e4m3fn / "
              f"float8_e4m3fnuz outputs only, and output is {_name(output.dtype)}")
    in_type, in_ref = (prefix_output.dtype, "prefix_output") if fp8 else (output.dtype, "output")
    _need(in_type in _VALUE_DTYPES, op,
          f"expected {in_ref} to be float32, float16 or bfloat16, got {_name(in_type)}")
    for name, t in (("prefix_output", prefix_output), ("suffix_output", suffix_output)):
        _need(t.dim() == 3 and t.shape[0] == T and t.shape[1] == H and t.shape[2] == D, op,
              f"expected output and {name} to have the same shape [num_tokens, num_heads, head_size], got "
              f"output {list(output.shape)} and {name} {list(t.shape)}")
        _need(t.dtype == in_type, op,
              f"expected {name} to have {in_ref}'s dtype {_name(in_type)}, got {_name(t.dtype)}")
    _lse(op, prefix_lse, "prefix_lse", T, H)
    _lse(op, suffix_lse, "suffix_lse", T, H)
    if output_lse is not None:
        _lse(op, output_lse, "output_lse", T, H)
        _lse_needs_values(op, T, H, D)
    if output_scale is not None:
        _need(output_scale.dtype == torch.float32, op,
              f"expected output_scale to be float32, got {_name(output_scale.dtype)}")
        _need(output_scale.numel() == 1, op, "expected output_scale to have exactly one element (a per-tensor "
              f"scale), got shape {list(output_scale.shape)}")
    if prefill_tokens_with_context is not None:
        _need(prefill_tokens_with_context >= 0, op, "expected prefill_tokens_with_context >= 0 (tokens at and "
              f"after it copy the suffix), got {prefill_tokens_with_context}")


def check_merge_n(output, output_lse, values, lses, attn_sink) -> None:
    op = "merge_attn_states_n"
    _need(output.dim() == 3, op,
          f"expected output to be 3-D [num_tokens, num_heads, head_size], got shape {list(output.shape)}")
    T, H, D = output.shape
    _need(D < 2 ** 31, op, f"expected head_size below 2^31 elements, got {D}")
    _need(output.dtype in _VALUE_DTYPES, op,
          f"expected output to be float32, float16 or bfloat16, got {_name(output.dtype)}")
    _need(values.dim() == 4 and values.shape[1] == T and values.shape[2] == H and values.shape[3] == D, op,
          f"expected values of shape [num_states, {T}, {H}, {D}] (num_states, then the shape of output), got "
          f"{list(values.shape)}")
    S = values.shape[0]
    _need(S >= 1, op, f"expected at least one state (values.size(0) >= 1), got {S}")
    _need(values.dtype == output.dtype, op,
          f"expected values to have output's dtype {_name(output.dtype)}, got {_name(values.dtype)}")
    _need(lses.dtype == torch.float32, op, f"expected lses to be float32, got {_name(lses.dtype)}")
    _need(lses.dim() == 3 and lses.shape[0] == S and lses.shape[1] == T and lses.shape[2] == H, op,
          f"expected lses of shape [num_states, num_tokens, num_heads] = [{S}, {T}, {H}] (any strides), got "
          f"{list(lses.shape)}")
    if output_lse is not None:
        _lse(op, output_lse, "output_lse", T, H)
        _lse_needs_values(op, T, H, D)
    if attn_sink is not None:
        _need(attn_sink.dtype == torch.float32, op, f"expected attn_sink to be float32, got {_name(attn_sink.dtype)}")
        _need(attn_sink.dim() == 1 and attn_sink.shape[0] == H, op,
              f"expected attn_sink of shape [num_heads] = [{H}], got {list(attn_sink.shape)}")


def _cache(op: str, c, name: str, kv_format: str, d_qk) -> None:
    _, dtypes, row = _KV_FORMATS[kv_format]
    _need(c.dim() == 3 or (c.dim() == 4 and c.shape[2] == 1), op, f"expected {name} to be [num_pages, page_size, "
          f"row] or [num_pages, page_size, 1, row], got shape {list(c.shape)}")
    fnuz = kv_format.endswith("_fnuz")
    other = kv_format[:-5] if fnuz else kv_format + "_fnuz"
    hint = (f" ({_name(c.dtype)} bytes are kv_format \"{other}\")"
            if kv_format != "bf16" and c.dtype == (torch.float8_e4m3fn if fnuz else torch.float8_e4m3fnuz) else "")
    _need(c.dtype in dtypes, op, f"expected {name} to be "
          f"{' / '.join(_name(d) for d in dtypes)} for kv_format \"{kv_format}\", got {_name(c.dtype)}{hint}")
    _need(c.shape[1] >= 1, op, f"expected {name} to have page_size >= 1, got shape {list(c.shape)}")
    want = d_qk if row is None else row
    _need(c.shape[-1] == want, op,
          f"expected {name} rows of {want} {'elements' if row is None else 'bytes'} for kv_format \"{kv_format}\", "
          f"got shape {list(c.shape)}")


def _indices(op: str, idx, name: str, T) -> None:
    _need(idx.dtype == torch.int32, op, f"expected {name} to be int32, got {_name(idx.dtype)}")
    _need(idx.dim() == 2 and idx.shape[0] == T, op, f"expected {name} of shape [num_tokens, width] with "
          f"num_tokens = q.size(0) = {T}, got {name} {list(idx.shape)}")


def _lengths(op: str, ln, name: str, T) -> None:
    if ln is None:
        return
    _need(ln.dtype == torch.int32, op, f"expected {name} to be int32, got {_name(ln.dtype)}")
    _need(ln.dim() == 1 and ln.shape[0] == T, op, f"expected {name} of shape [num_tokens] = [{T}], got "
          f"{list(ln.shape)}")


def check_decode(q, kv_cache, indices, kv_format, softmax_scale, output, workspace, lengths, extra_kv_cache,
                 extra_indices, extra_lengths, attn_sink, lse, num_splits) -> None:
    op = "sparse_mla_decode"
    _need(q.dtype == torch.bfloat16, op, f"expected q to be bfloat16, got {_name(q.dtype)}")
    _need(q.dim() == 3, op, f"expected q of shape [num_tokens, num_heads, d_qk], got {list(q.shape)}")
    T, H, d_qk = q.shape
    _need(kv_format in _KV_FORMATS, op, f"expected kv_format to be one of {', '.join(_KV_FORMATS)}, got "
          f"\"{kv_format}\"")
    _need(d_qk == 576 or d_qk == 512, op,
          f"expected q's last dim d_qk to be 576 (DeepSeek V3.2) or 512 (DeepSeek V4), got shape {list(q.shape)}")
    need_d = _KV_FORMATS[kv_format][0]
    _need(need_d is None or d_qk == need_d, op,
          f"expected q's d_qk to be {need_d} for kv_format \"{kv_format}\", got shape {list(q.shape)}")
    _cache(op, kv_cache, "kv_cache", kv_format, d_qk)
    _indices(op, indices, "indices", T)
    _lengths(op, lengths, "lengths", T)
    _need((extra_kv_cache is None) == (extra_indices is None), op, "expected extra_kv_cache and extra_indices to "
          "be given together, got " + ("extra_indices without extra_kv_cache" if extra_kv_cache is None
                                       else "extra_kv_cache without extra_indices"))
    _need(extra_lengths is None or extra_indices is not None, op, "expected extra_lengths only together with "
          "extra_indices and extra_kv_cache, got extra_lengths without extra_indices")
    if extra_kv_cache is not None:
        _cache(op, extra_kv_cache, "extra_kv_cache", kv_format, d_qk)
        _indices(op, extra_indices, "extra_indices", T)
        _lengths(op, extra_lengths, "extra_lengths", T)
    if attn_sink is not None:
        _need(attn_sink.dtype == torch.float32, op, f"expected attn_sink to be float32, got {_name(attn_sink.dtype)}")
        _need(attn_sink.dim() == 1 and attn_sink.shape[0] == H, op,
              f"expected attn_sink of shape [num_heads] = [{H}] (num_heads = q.size(1)), got "
              f"{list(attn_sink.shape)} (q {list(q.shape)})")
    _need(output.dtype == torch.bfloat16, op, f"expected output to be bfloat16, got {_name(output.dtype)}")
    _need(output.dim() == 3 and output.shape[0] == T and output.shape[1] == H and output.shape[2] == 512, op,
          f"expected output of shape [num_tokens, num_heads, 512] = [{T}, {H}, 512] (num_tokens, num_heads = "
          f"q.size(0), q.size(1)), got {list(output.shape)} (q {list(q.shape)})")
    if lse is not None:
        _lse(op, lse, "lse", T, H, q)
    _need(workspace.dtype == torch.uint8 and workspace.dim() == 1, op, "expected workspace to be a 1-D uint8 "
          f"tensor, got {_name(workspace.dtype)} of shape {list(workspace.shape)}")
    _need(_finite_as_float32(float(softmax_scale)), op,
          f"expected softmax_scale to be finite as a float32 (|softmax_scale| <= 3.4e38), got {softmax_scale}")
    _need(0 <= num_splits <= _MAX_SPLITS, op,
          f"expected num_splits to be 0 (automatic) or 1..{_MAX_SPLITS}, got {num_splits}")
