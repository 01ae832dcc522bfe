"""Timing helpers shared by the ``mla-ext`` command and ``benchmarks/``.

GPU timings follow one method: the call under test is captured in a CUDA graph
that cycles through enough input sets to exceed the L2 cache (so DRAM serves
them), the graph is replayed many times, and the median per-call time of the
replays (CUDA events) is reported. Ceilings (a device-to-device copy, a bf16
matmul) are measured in the same process with the same method, so results are
quoted as ratios against them.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch

L2_FLUSH_BYTES = 256 << 20  # rotate inputs through at least this much memory


def num_rotations(bytes_per_call: int, min_bytes: int = L2_FLUSH_BYTES, cap: int = 64) -> int:
    """Input sets needed so one pass over them touches at least ``min_bytes``."""
    return max(2, min(cap, -(-min_bytes // max(1, bytes_per_call))))


def time_graph(calls: Sequence[Callable[[], None]], *, replays: int = 30, warmup: int = 3) -> float:
    """Median µs per call: ``calls`` (one per input set) captured in one CUDA graph, replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:  # warm up outside the capture (module load, lazy init)
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for fn in calls:
            fn()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return statistics.median(times)


def time_cpu(fn: Callable[[], None], *, repeat: int = 5, min_seconds: float = 0.05) -> float:
    """Median µs per call on the host (for CPU runs)."""
    fn()
    times = []
    for _ in range(repeat):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            if time.perf_counter() - t0 >= min_seconds:
                break
        times.append((time.perf_counter() - t0) * 1e6 / n)
    return statistics.median(times)


def copy_ceiling_us(total_bytes: int, device="cuda") -> float:
    """µs of a device-to-device copy moving ``total_bytes`` (read + write), L2-cold."""
    n = max(1, total_bytes // 2)
    sets = num_rotations(2 * n)
    src = [torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255) for _ in range(sets)]
    dst = [torch.empty(n, dtype=torch.uint8, device=device) for _ in range(sets)]
    us = time_graph([lambda s=s, d=d: d.copy_(s) for s, d in zip(src, dst)])
    del src, dst
    return us


def copy_bandwidth_gbs(device="cuda", nbytes: int = 2 << 30) -> float:
    """Measured device-to-device copy bandwidth in GB/s (bytes read + written)."""
    us = copy_ceiling_us(nbytes, device)
    return nbytes / us / 1e3


def matmul_tflops(device="cuda", n: int = 8192) -> float:
    """Measured dense bf16 matmul rate (TFLOP/s) on random data."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    us = time_graph([lambda: torch.matmul(a, b, out=c)], replays=10)
    return 2 * n**3 / us / 1e6


def host_overhead_us(fn: Callable[[], None], iters: int = 2000) -> float:
    """Host µs per eager call (launch cost, no synchronisation inside the loop)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6 / iters


# ---------------------------------------------------------------------------------------------
# merge_attn_states
# ---------------------------------------------------------------------------------------------

def merge_bytes(T: int, H: int, D: int, dtype: torch.dtype, with_lse: bool = True) -> int:
    """Bytes a merge must move: two value reads + one write, plus LSE reads/write."""
    esize = torch.empty((), dtype=dtype).element_size()
    return 3 * T * H * D * esize + (3 if with_lse else 2) * T * H * 4


def make_merge_inputs(T: int, H: int, D: int, dtype: torch.dtype, device, *, layout: str = "contiguous",
                      seed: int = 0):
    """One set of merge inputs.

    layout ``"contiguous"``: values ``[T, H, D]``; ``"strided"``: the MLA chunked-prefill case,
    values are ``[..., :D]`` views of ``[T, H, Dpad]`` (Dpad = 192 for D = 128, D + 64 otherwise,
    i.e. V inside the QK head size) and the output is a ``[T, H, D]`` view of a ``[T + 8, H * D]``
    layer-output buffer at token offset 8. LSEs are vLLM-style ``[H, T]`` buffers passed as ``.T``.
    """
    g = torch.Generator(device=device).manual_seed(seed)
    pad = (192 if D == 128 else D + 64) if layout == "strided" else D

    def vals():
        return torch.randn(T, H, pad, device=device, dtype=dtype, generator=g)[..., :D]

    pa, pb = vals(), vals()
    la = (torch.randn(H, T, device=device, generator=g) * 2).T
    lb = (torch.randn(H, T, device=device, generator=g) * 2).T
    if layout == "strided":
        out = torch.empty(T + 8, H * D, device=device, dtype=dtype)[8:].view(T, H, D)
    else:
        out = torch.empty(T, H, D, device=device, dtype=dtype)
    out_lse = torch.empty(H, T, device=device).T
    return out, out_lse, pa, la, pb, lb


def verify_merge(args, rows: int = 64) -> float:
    """Max error of a sample of rows against the float64 reference, relative to max |ref|."""
    from . import reference

    out, out_lse, pa, la, pb, lb = args
    T = out.shape[0]
    idx = torch.linspace(0, T - 1, min(T, rows), device=out.device).long().unique()
    ref_o, ref_l = reference.merge_attn_states(pa[idx].cpu(), la[idx].cpu(), pb[idx].cpu(), lb[idx].cpu())
    err = ((out[idx].double().cpu() - ref_o).abs().max() / ref_o.abs().max().clamp_min(1e-30)).item()
    lse_err = (out_lse[idx].double().cpu() - ref_l).abs().max().item()
    if not (err == err) or not (lse_err == lse_err):
        return float("nan")
    return max(err, lse_err * 1e-3)


def measure_merge(T: int, H: int, D: int, *, dtype=torch.bfloat16, device="cuda", layout="contiguous",
                  with_copy: bool = True, host: bool = False) -> dict:
    """Verify and time ``merge_attn_states`` for one shape; GPU runs include the copy ceiling."""
    from ._ops import merge_attn_states

    nbytes = merge_bytes(T, H, D, dtype)
    first = make_merge_inputs(T, H, D, dtype, device, layout=layout)
    for t in (first[0], first[1]):
        t.fill_(float("nan"))
    merge_attn_states(*first)
    err = verify_merge(first)
    row = dict(T=T, H=H, D=D, dtype=str(dtype).replace("torch.", ""), layout=layout, bytes=nbytes,
               max_rel_err=err)
    if str(device).startswith("cuda"):
        sets = [first] + [make_merge_inputs(T, H, D, dtype, device, layout=layout, seed=i + 1)
                          for i in range(num_rotations(nbytes) - 1)]
        us = time_graph([lambda a=a: merge_attn_states(*a) for a in sets])
        row["us"] = us
        row["GB/s"] = nbytes / us / 1e3
        if with_copy:
            cu = copy_ceiling_us(nbytes, device)
            row["copy_us"] = cu
            row["pct_copy"] = 100.0 * cu / us
        if host:
            row["host_us"] = host_overhead_us(lambda: merge_attn_states(*first))
        del sets
    else:
        us = time_cpu(lambda: merge_attn_states(*first))
        row["us"] = us
        row["GB/s"] = nbytes / us / 1e3
    return row
