"""Host time of one eager call, the wrappers as shipped against their form before the
thirty-second session (OpOverload.__call__ and torch.autograd.graph.increment_version), in one
process, rounds alternating; next to an eager torch.add(out=) of three 64-element tensors.

  python benchmarks/dev/host_time_ab.py [--rounds 5]

Prints µs per call (the fastest of each variant's rounds, each round the fastest of
mla_ext.bench.host_overhead_us's loops) with grad mode on and under inference_mode.
Merge: 1 x 128 x 512 bf16 with output_lse (the benchmark's host-time shape). Decode: one
token of the V4 window layer, 8 heads.
"""
from __future__ import annotations

import argparse

import torch
from torch.autograd.graph import increment_version
from tabulate import tabulate

import mla_ext
from mla_ext import bench, builders
from mla_ext._decode import _real_arg
from mla_ext._ops import eager_callable, _grad_enabled, _is_compiling, any_requires_grad, int_arg as _int_arg, refuse_requires_grad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    dev = "cuda"
    T, H, D = 1, 128, 512
    g = torch.Generator(device="cpu").manual_seed(0)
    po, so = (torch.randn(T, H, D, generator=g).to(dev, torch.bfloat16) for _ in range(2))
    pl, sl = (torch.randn(T, H, generator=g).to(dev) for _ in range(2))
    out = torch.empty(T, H, D, dtype=torch.bfloat16, device=dev)
    ol = torch.empty(T, H, device=dev)
    a, b, c = (torch.randn(64, device=dev) for _ in range(3))
    merge_op = torch.ops.mla_ext.merge_attn_states.default
    merge_eager = eager_callable(merge_op)

    def merge_before(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse):
        # The wrapper's body before the change (prefill_tokens_with_context and output_scale None).
        rec = _grad_enabled() and not _is_compiling()
        if rec and (getattr(output, "requires_grad", False) or getattr(output_lse, "requires_grad", False)):
            refuse_requires_grad("merge_attn_states", ("output", "output_lse"), (output, output_lse))
        merge_op(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, None, None)
        if rec:
            increment_version((output, output_lse))

    inp = builders.build_decode_inputs("v4_swa", batch=1, num_heads=8, device=dev, seed=1)
    kw = bench._slice_tokens(inp, 0, 1)
    dout = torch.empty(1, 8, 512, dtype=torch.bfloat16, device=dev)
    dlse = torch.empty(1, 8, device=dev)
    ws = mla_ext.DecodeWorkspace(1, 8, device=dev).tensor

    def decode_before(q, kv_cache, indices, kv_format, softmax_scale, output, workspace, lengths=None,
                      extra_kv_cache=None, extra_indices=None, extra_lengths=None, attn_sink=None, lse=None,
                      num_splits=0):
        # The wrapper's body before the change (the packet, recording(), increment_version).
        splits = _int_arg("sparse_mla_decode", "num_splits", num_splits)
        scale = _real_arg("sparse_mla_decode", "softmax_scale", softmax_scale)
        if not isinstance(kv_format, str):
            raise TypeError("kv_format")
        rec = _grad_enabled() and not _is_compiling()
        if rec and any_requires_grad(output, workspace, lse):
            refuse_requires_grad("sparse_mla_decode", ("output", "workspace", "lse"), (output, workspace, lse))
        torch.ops.mla_ext.sparse_mla_decode(q, kv_cache, indices, kv_format, scale, output, workspace, lengths,
                                            extra_kv_cache, extra_indices, extra_lengths, attn_sink, lse, splits)
        if rec:
            increment_version((output, workspace) if lse is None else (output, workspace, lse))

    variants = {
        "torch.add(out=), 64 elements": lambda: torch.add(a, b, out=c),
        "merge: wrapper before": lambda: merge_before(out, ol, po, pl, so, sl),
        "merge: wrapper now": lambda: mla_ext.merge_attn_states(out, ol, po, pl, so, sl),
        "merge: OpOverload, bare": lambda: merge_op(out, ol, po, pl, so, sl, None, None),
        # fiftieth session: the wrapper passes six arguments when the last two are None
        "merge: C++ callable, 8 arguments": lambda: merge_eager(out, ol, po, pl, so, sl, None, None),
        "merge: C++ callable, 6 arguments": lambda: merge_eager(out, ol, po, pl, so, sl),
        "decode: wrapper before": lambda: decode_before(**kw, output=dout, workspace=ws, lse=dlse),
        "decode: wrapper now": lambda: mla_ext.sparse_mla_decode(**kw, output=dout, workspace=ws, lse=dlse),
    }
    best = {(k, m): float("inf") for k in variants for m in ("grad", "inference")}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            best[(name, "grad")] = min(best[(name, "grad")], bench.host_overhead_us(fn))
            with torch.inference_mode():
                best[(name, "inference")] = min(best[(name, "inference")], bench.host_overhead_us(fn))
    rows = [[name, best[(name, "grad")], best[(name, "inference")]] for name in variants]
    print(tabulate(rows, headers=["call", "µs, grad mode on", "µs, inference_mode"], floatfmt=".2f"))


if __name__ == "__main__":
    main()
