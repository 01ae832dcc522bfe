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


def copy_bandwidth_gbs(device="cuda", nbytes: int = 512 << 20) -> float:
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


# ---------------------------------------------------------------------------------------------
# sparse_mla_decode
# ---------------------------------------------------------------------------------------------

# Layer configurations of the benchmark (DESIGN.md §4): (label, builder kind, top-k, context range).
DECODE_LAYERS = {
    "v4_swa": ("v4_swa", None, (32768, 65536)),
    "v4_c4_flash": ("v4_c4", 512, (32768, 65536)),
    "v4_c4_pro": ("v4_c4", 1024, (32768, 65536)),
    "v4_c128": ("v4_c128", None, (1 << 20, 1 << 20)),
    "v4_c128_mixed": ("v4_c128", None, (1 << 20, 1 << 20)),  # one token 8192 rows, the rest ~500
    "v32": ("v32", 2048, (32768, 65536)),
}


def decode_flops(inp) -> int:
    """2 * H * (d_qk + d_v) per selected row (QK^T and PV)."""
    d_qk = inp.q.shape[-1]
    return 2 * inp.num_heads * (d_qk + 512) * inp.num_selected


def _valid_count(indices, lengths, num_slots):
    ok = (indices >= 0) & (indices < num_slots)
    if lengths is not None:
        pos = torch.arange(indices.shape[1], device=indices.device)
        ok &= pos[None, :] < lengths[:, None].long()
    return ok


def make_mixed(inp, rows: int = 500, seed: int = 0):
    """Straggler batch from a C128 build: token 0 keeps all its compressed rows, every other
    token keeps about ``rows`` of them (extra_lengths cut to 450..550)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    T = inp.num_tokens
    cut = torch.randint(rows - 50, rows + 51, (T,), generator=g).to(inp.extra_lengths.device)
    cut[0] = inp.extra_lengths[0]
    inp.extra_lengths = torch.minimum(inp.extra_lengths, cut.to(inp.extra_lengths.dtype))
    from .reference import _num_slots

    valid = _valid_count(inp.indices, inp.lengths, _num_slots(inp.kv_cache)).sum()
    valid += _valid_count(inp.extra_indices, inp.extra_lengths, _num_slots(inp.extra_kv_cache)).sum()
    inp.num_selected = int(valid)
    from .formats import kv_bytes_per_row

    inp.num_kv_bytes = inp.num_selected * kv_bytes_per_row(inp.kv_format, inp.q.shape[-1])
    return inp


def _slice_tokens(inp, t0: int, t1: int) -> dict:
    """op kwargs for tokens [t0, t1) of one build (each slice touches its own requests' rows)."""
    sl = lambda x: None if x is None else x[t0:t1]
    return dict(q=inp.q[t0:t1], kv_cache=inp.kv_cache, indices=inp.indices[t0:t1], kv_format=inp.kv_format,
                softmax_scale=inp.softmax_scale, lengths=sl(inp.lengths), extra_kv_cache=inp.extra_kv_cache,
                extra_indices=sl(inp.extra_indices), extra_lengths=sl(inp.extra_lengths), attn_sink=inp.attn_sink)


_GATHER_SRC = r"""
extern "C" __global__ void gather_rows(const unsigned char* base, const long long* data_off, int data_bytes,
                                       const long long* scale_off, int n, unsigned int* out) {
  // One warp per row: the row's data bytes with 16-byte loads, plus an 8-byte scale row if any.
  int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (row >= n) return;
  const uint4* d = reinterpret_cast<const uint4*>(base + data_off[row]);
  unsigned int acc = 0;
  for (int i = lane; i < data_bytes / 16; i += 32) { uint4 v = d[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (scale_off != nullptr && lane == 0) {
    uint2 s = *reinterpret_cast<const uint2*>(base + scale_off[row]);
    acc ^= s.x ^ s.y;
  }
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) out[row] = acc;
}
"""


def gather_ceiling_us(inp, n_rows: int, rotations: int) -> float:
    """µs for a plain warp-per-row kernel (CuPy) to gather ``n_rows`` random rows of the main
    cache's format (16-byte loads), L2-cold over ``rotations`` sets; NaN when CuPy is missing."""
    try:
        import cupy
    except Exception:
        return float("nan")
    cache = inp.extra_kv_cache if inp.extra_kv_cache is not None else inp.kv_cache
    from .formats import kv_layout

    fmt, d_qk = kv_layout(inp.kv_format), inp.q.shape[-1]
    num_pages, page_size = cache.shape[0], cache.shape[1]
    stride = cache.stride(0) * cache.element_size()
    if fmt == "fp8_ds_mla_v4":
        data_bytes, tok = 576, 576
    else:
        data_bytes = 656 if fmt == "fp8_ds_mla" else 2 * d_qk
        tok = cache.stride(1) * cache.element_size()
    base_ptr = cache.data_ptr()
    kernel = cupy.RawKernel(_GATHER_SRC, "gather_rows")
    sets = []
    for r in range(rotations):
        slots = torch.randint(0, num_pages * page_size, (n_rows,), device=cache.device)
        page, p = slots // page_size, slots % page_size
        doff = page * stride + p * tok
        soff = page * stride + page_size * 576 + p * 8 if fmt == "fp8_ds_mla_v4" else None
        sets.append((doff, soff))
    out = torch.empty(n_rows, dtype=torch.int32, device=cache.device)
    threads = 256
    blocks = (n_rows * 32 + threads - 1) // threads

    def call(doff, soff):
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        with stream:
            kernel((blocks,), (threads,), (cupy.uint64(base_ptr), cupy.uint64(doff.data_ptr()),
                                          cupy.int32(data_bytes),
                                          cupy.uint64(0 if soff is None else soff.data_ptr()),
                                          cupy.int32(n_rows), cupy.uint64(out.data_ptr())))

    return time_graph([lambda d=d, s=s: call(d, s) for d, s in sets])


def measure_decode(layer: str, num_heads: int, num_tokens: int, *, copy_gbs: float, mm_tflops: float,
                   device="cuda", with_gather: bool = True, verify: bool = True, seed: int = 0) -> dict:
    """Build, verify (a sample of tokens vs the float64 reference) and time one decode shape."""
    from ._decode import sparse_mla_decode, sparse_mla_decode_workspace_size
    from .builders import build_decode_inputs
    from .formats import kv_bytes_per_row

    kind, topk, ctx = DECODE_LAYERS[layer]
    row_bytes = kv_bytes_per_row(build_kind_format(kind), 576 if kind == "v32" else 512)
    per_call = num_tokens * (8320 if kind == "v4_c128" else (topk or 128) + 128) * row_bytes
    rot = num_rotations(per_call, cap=16)
    inp = build_decode_inputs(kind, batch=num_tokens * rot, num_heads=num_heads, context_len=ctx,
                              topk=topk, device=device, seed=seed)
    if layer.endswith("mixed"):
        inp = make_mixed(inp)
    T = num_tokens
    ws = torch.empty(sparse_mla_decode_workspace_size(T, num_heads, device=torch.device(device)),
                     dtype=torch.uint8, device=device)
    outs = [torch.empty(T, num_heads, 512, dtype=torch.bfloat16, device=device) for _ in range(rot)]
    lses = [torch.empty(T, num_heads, device=device) for _ in range(rot)]
    calls = [lambda r=r: sparse_mla_decode(**_slice_tokens(inp, r * T, (r + 1) * T), output=outs[r],
                                           workspace=ws, lse=lses[r]) for r in range(rot)]
    row = dict(layer=layer, H=num_heads, T=T, kv_format=inp.kv_format)
    if verify:
        outs[0].fill_(float("nan"))
        calls[0]()
        sample = sorted({0, T // 2, T - 1})
        from . import reference

        k = _slice_tokens(inp, 0, T)
        pick = lambda x: None if x is None else x[sample]
        ref_o, ref_l = reference.sparse_mla_decode(
            k["q"][sample], k["kv_cache"], k["indices"][sample], kv_format=k["kv_format"],
            softmax_scale=k["softmax_scale"], lengths=pick(k["lengths"]), extra_kv_cache=k["extra_kv_cache"],
            extra_indices=pick(k["extra_indices"]), extra_lengths=pick(k["extra_lengths"]),
            attn_sink=k["attn_sink"])
        got = outs[0][sample].double().cpu()
        row["max_rel_err"] = ((got - ref_o.cpu()).abs().max() / ref_o.abs().max().clamp_min(1e-30)).item()
    us = time_graph(calls)
    sel = inp.num_selected / rot
    kv_bytes = inp.num_kv_bytes / rot
    flops = decode_flops(inp) / rot
    row.update(us=us, rows=int(sel), kv_MB=kv_bytes / 1e6, GBps=kv_bytes / us / 1e3, TFLOPs=flops / us / 1e6)
    floor_us = max(kv_bytes / (copy_gbs * 1e3), flops / (mm_tflops * 1e6))
    row["pct_roofline"] = 100.0 * floor_us / us
    if with_gather:
        g_us = gather_ceiling_us(inp, int(sel), rot)
        row["gather_us"] = g_us
        row["pct_gather"] = 100.0 * g_us / us
    del inp, outs, lses, ws
    torch.cuda.empty_cache()
    return row


def build_kind_format(kind: str) -> str:
    from .builders import LAYER_KINDS

    return LAYER_KINDS[kind].default_format
