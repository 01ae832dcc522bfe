"""Timing helpers shared by the ``mla-ext`` command and ``benchmarks/``.

GPU timings follow one method: the call under test is captured in a CUDA graph
that cycles through enough input sets to exceed the L2 cache (so DRAM serves
them), the graph is replayed many times, and the median per-call time of the
replays (CUDA events) is reported. Ceilings (a device-to-device copy, a bf16
matmul) are measured in the same process with the same method, so results are
quoted as ratios against them.
"""
from __future__ import annotations

import functools
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

L2_FLUSH_BYTES = 256 << 20  # rotate inputs through at least this much memory


def require_gpu(script: str) -> None:
    """Exit with a one-line message (status 1) when torch sees no CUDA/ROCm device: the
    benchmarks time GPU kernels against GPU ceilings."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{script}: this benchmark needs a CUDA/ROCm GPU; torch {torch.__version__} sees none "
                         "(on the CPU, `mla-ext decode` and `mla-ext merge` verify and time small sizes)")


def num_rotations(bytes_per_call: int, min_bytes: int = L2_FLUSH_BYTES, cap: int = 4096) -> int:
    """Input sets needed so one pass over them touches at least ``min_bytes`` (at least 2, at most
    ``cap``: calls under 64 KiB are not made L2-cold). Until the twenty-ninth session the cap was
    64, so calls under 4 MiB (a 1 x 128 x 512 merge: 25 MB over 64 sets, which the H200's 50 MB L2
    holds) and their copy ceilings were timed L2-warm."""
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
    """µs of a device-to-device copy moving ``total_bytes`` (read + write), L2-cold on a GPU;
    on the CPU a host memcpy of the same bytes (median of :func:`time_cpu`)."""
    n = max(1, total_bytes // 2)
    if torch.device(device).type == "cpu":
        src = torch.empty(n, dtype=torch.uint8).random_(0, 255)
        dst = torch.empty(n, dtype=torch.uint8)
        return time_cpu(lambda: dst.copy_(src), repeat=3, min_seconds=0.02)
    sets = num_rotations(2 * n)
    src = [torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255) for _ in range(sets)]
    dst = [torch.empty(n, dtype=torch.uint8, device=device) for _ in range(sets)]
    us = time_graph([lambda s=s, d=d: d.copy_(s) for s, d in zip(src, dst)])
    del src, dst
    return us


def copy_bandwidth_gbs(device="cuda", nbytes: int = 512 << 20) -> float:
    """Measured copy bandwidth in GB/s (bytes read + written): device-to-device on a GPU,
    host memcpy on the CPU (pass a smaller ``nbytes`` there, e.g. 64 MiB)."""
    us = copy_ceiling_us(nbytes, device)
    return nbytes / us / 1e3


def matmul_dtype(device) -> torch.dtype:
    """Dtype of the matmul ceiling: bf16 on a GPU (the decode's MMA inputs), fp32 on the CPU
    (the CPU decode computes in fp32)."""
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def matmul_tflops(device="cuda", n: int = 8192) -> float:
    """Measured dense matmul rate (TFLOP/s) on random data, in :func:`matmul_dtype` (pass a
    smaller ``n`` on the CPU, e.g. 1024)."""
    dtype = matmul_dtype(device)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    if torch.device(device).type == "cpu":
        us = time_cpu(lambda: torch.matmul(a, b, out=c), repeat=3, min_seconds=0.02)
    else:
        us = time_graph([lambda: torch.matmul(a, b, out=c)], replays=10)
    return 2 * n**3 / us / 1e6


def host_overhead_us(fn: Callable[[], None], iters: int = 200, rounds: int = 10) -> float:
    """Host µs per eager call: the fastest of ``rounds`` timed loops of ``iters`` calls.

    Few enough calls per loop that the launch queue never fills (a full queue makes the
    host wait for the GPU, so the loop would time the GPU instead), and the minimum over
    loops drops scheduler noise. No synchronisation inside a loop."""
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, time.perf_counter() - t0)
    torch.cuda.synchronize()
    return best * 1e6 / iters


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


# What `mla-ext merge` accepts against the float64 reference: the output's max error relative
# to max |reference| (bf16 / fp16 rounding), and the merged LSE's max absolute error in nats (a
# float32 log-sum-exp of two float32 LSEs: ~1e-6).
MERGE_OUT_TOL, MERGE_LSE_TOL = 2e-2, 1e-3


def verify_merge(args, rows: int = 64) -> tuple:
    """(output error, LSE error) of a sample of rows against the float64 reference: the output's
    max absolute error over max |reference|, the LSE's max absolute error (nats); NaN for both
    where either has a NaN."""
    from . import reference

    out, out_lse, pa, la, pb, lb = args
    T = out.shape[0]
    idx = torch.linspace(0, T - 1, min(T, rows), device=out.device).long().unique()
    ref_o, ref_l = reference.merge_attn_states(pa[idx].cpu(), la[idx].cpu(), pb[idx].cpu(), lb[idx].cpu())
    err = ((out[idx].double().cpu() - ref_o).abs().max() / ref_o.abs().max().clamp_min(1e-30)).item()
    lse_err = (out_lse[idx].double().cpu() - ref_l).abs().max().item()
    if not (err == err) or not (lse_err == lse_err):
        return float("nan"), float("nan")
    return err, lse_err


def measure_merge(T: int, H: int, D: int, *, dtype=torch.bfloat16, device="cuda", layout="contiguous",
                  with_copy: bool = True, host: bool = False) -> dict:
    """Verify and time ``merge_attn_states`` for one shape; GPU runs include the copy ceiling.

    On a GPU each shape starts from an emptied caching allocator, so a result does not depend
    on which shapes ran before: on an H200, 16384 x 16 x 128 measured 98% of the copy in a fresh
    process and 91% right after 8192 x 128 x 128's inputs had been freed into the cache
    (torch.add of the same tensors unchanged; benchmarks/dev/merge_state.py, NOTES.md)."""
    from ._ops import merge_attn_states

    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()
    nbytes = merge_bytes(T, H, D, dtype)
    first = make_merge_inputs(T, H, D, dtype, device, layout=layout)
    for t in (first[0], first[1]):
        t.fill_(float("nan"))
    merge_attn_states(*first)
    err, lse_err = verify_merge(first)
    row = dict(T=T, H=H, D=D, dtype=str(dtype).replace("torch.", ""), layout=layout, bytes=nbytes,
               max_rel_err=err, max_lse_err=lse_err)
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


def decode_rows_per_token(kind: str, context_len: int, topk: Optional[int] = None) -> int:
    """Upper estimate of the rows one query token selects in a layer of ``kind`` at
    ``context_len`` tokens (sizes the L2-cold rotation before anything is built)."""
    from .builders import LAYER_KINDS

    k = LAYER_KINDS[kind]
    top = k.topk if topk is None else topk
    window = k.window or 0
    if kind == "v32":
        return min(top, context_len)
    if k.compress_ratio is None:
        return window
    compressed = context_len // k.compress_ratio
    return window + (min(top, compressed) if k.topk is not None else compressed)


def decode_request_cache_bytes(kind: str, context_len: int, kv_format: Optional[str] = None,
                               topk: Optional[int] = None) -> int:
    """Upper estimate of the cache bytes the builders allocate for one request of ``kind`` at
    ``context_len`` tokens: the window's pages (plus three), and the pages of the compressed or
    top-k rows, a top-k set at most one page per selected row. Measured on the CPU (64K tokens;
    1M): window 0.37 (0.60) MB, C4 8.9 (19.1), V3.2 38 (83), C128 at 1M 5.3; this gives 0.60
    (0.60), 10.2 (19.7), 43 (86) and 5.4."""
    from .builders import LAYER_KINDS
    from .formats import kv_bytes_per_row

    k = LAYER_KINDS[kind]
    top = k.topk if topk is None else topk
    row = kv_bytes_per_row(kv_format or k.default_format, k.d_qk)

    def paged(n: int, page: int, selected: Optional[int]) -> int:
        pages = -(-n // page)
        return (pages if selected is None else min(pages, selected)) * page

    rows = 0
    if k.window:
        rows += (-(-k.window // k.page_size) + 3) * k.page_size
    if k.compress_ratio:
        rows += paged(-(-context_len // k.compress_ratio), k.extra_page_size, top if k.topk else None)
    if k.window is None and k.compress_ratio is None:
        rows += paged(context_len, k.page_size, top)
    return rows * row


def decode_num_sets(kind: str, num_tokens: int, context_len: int, topk: Optional[int] = None,
                    kv_format: Optional[str] = None, cap: int = 4096,
                    max_cache_bytes: Optional[int] = None) -> int:
    """Input sets one GPU timing cycles through so that their selected rows span 256 MiB, far
    past the L2 cache (:func:`num_rotations` of the estimated KV bytes per call, at most ``cap``).

    Until the twenty-ninth session the cap was 16, so one-token calls of the window, C4 and
    V3.2 layers (75 KB-1.3 MB of rows per call) were timed with their rows in the H200's 50 MB
    L2. One token at the benchmark's contexts now takes 3,592 (window), 719 / 400 (C4 Flash /
    Pro), 200 (V3.2) and 56 (C128) sets; each set holds its own requests' caches, measured on
    the CPU at 0.37, 8.9, 38 and 5.3 MB per request (window, C4, V3.2 at 64K tokens, C128 at 1M),
    so at most ~7.6 GB per layer. ``max_cache_bytes`` (the GPU callers pass a quarter of the
    device's memory, split over the layer kinds built together) bounds the sets' caches,
    :func:`decode_request_cache_bytes` per token (an upper bound: a request has 1 + mtp tokens),
    at the cost of fewer sets: a V3.2 request at 1M tokens holds 83 MB."""
    from .builders import LAYER_KINDS
    from .formats import kv_bytes_per_row

    k = LAYER_KINDS[kind]
    row_bytes = kv_bytes_per_row(kv_format or k.default_format, k.d_qk)
    sets = num_rotations(num_tokens * decode_rows_per_token(kind, context_len, topk) * row_bytes, cap=cap)
    if max_cache_bytes is not None:
        per_set = max(1, num_tokens) * decode_request_cache_bytes(kind, context_len, kv_format, topk)
        sets = max(2, min(sets, max_cache_bytes // per_set))
    return sets


def decode_cache_budget(device, kinds: int = 1) -> int:
    """Bytes of request caches one layer kind's timing sets may hold on ``device`` (CUDA): a
    quarter of its memory, split over ``kinds`` kinds built at the same time."""
    return torch.cuda.get_device_properties(torch.device(device)).total_memory // (4 * max(1, kinds))


class DecodeSets:
    """``sets`` independent inputs of one layer kind with preallocated outputs: the token slices
    ``[r * T, (r + 1) * T)`` of one :func:`mla_ext.builders.build_decode_inputs` build of
    ``batch * sets`` requests, so each set has its own requests, pages and rows (an engine's
    different layers, or L2-cold rotations of one call).

    Attributes:
        kind: builder layer kind. inp: the whole build (:class:`mla_ext.builders.DecodeInputs`).
        num_tokens: T per set (batch x (1 + mtp)). num_heads: H. sets: number of sets.
        outputs: per set ``[T, H, 512]`` bf16; lses: per set ``[T, H]`` fp32 (written by
            :meth:`call`).
        kwargs: per set the op's input keyword arguments.
    """

    def __init__(self, kind: str, inp, num_tokens: int, sets: int):
        from ._decode import sparse_mla_decode

        self._op = sparse_mla_decode
        self.kind = kind
        self.inp = inp
        self.num_tokens = num_tokens
        self.num_heads = inp.num_heads
        self.sets = sets
        dev = inp.q.device
        self.outputs = [torch.empty(num_tokens, self.num_heads, 512, dtype=torch.bfloat16, device=dev)
                        for _ in range(sets)]
        self.lses = [torch.empty(num_tokens, self.num_heads, device=dev) for _ in range(sets)]
        self.kwargs = [_slice_tokens(inp, r * num_tokens, (r + 1) * num_tokens) for r in range(sets)]

    def call(self, r: int, workspace: torch.Tensor, num_splits: int = 0) -> None:
        """One ``sparse_mla_decode`` on set ``r``, written into ``outputs[r]`` / ``lses[r]``
        (``num_splits`` as the op's: 0 automatic)."""
        self._op(**self.kwargs[r], output=self.outputs[r], workspace=workspace, lse=self.lses[r],
                 num_splits=num_splits)

    def calls(self, workspace: torch.Tensor, num_splits: int = 0) -> List[Callable[[], None]]:
        """One call per set, in set order (:meth:`call`)."""
        return [functools.partial(self.call, r, workspace, num_splits) for r in range(self.sets)]

    def poison(self) -> None:
        """NaN into every output and lse (an element the op does not write stays NaN)."""
        for t in self.outputs + self.lses:
            t.fill_(float("nan"))

    @property
    def rows_per_call(self) -> float:
        return self.inp.num_selected / self.sets

    @property
    def kv_bytes_per_call(self) -> float:
        return self.inp.num_kv_bytes / self.sets

    @property
    def flops_per_call(self) -> float:
        return decode_flops(self.inp) / self.sets

    @property
    def cache_bytes(self) -> int:
        """Bytes of the cache tensors' storage (both sets of a V4 layer)."""
        caches = [c for c in (self.inp.kv_cache, self.inp.extra_kv_cache) if c is not None]
        return sum(c.untyped_storage().nbytes() for c in caches)


def build_decode_sets(kind: str, *, batch: int, num_heads: int, context_len, sets: int = 1, mtp: int = 0,
                      kv_format: Optional[str] = None, topk: Optional[int] = None, device="cpu",
                      seed: int = 0, mixed: bool = False, row_placement: str = "pages") -> DecodeSets:
    """Build :class:`DecodeSets`: ``sets`` inputs of ``batch`` requests (``1 + mtp`` query tokens
    each) of layer ``kind``; arguments as :func:`mla_ext.builders.build_decode_inputs`.
    ``mixed``: apply :func:`make_mixed` (C128 straggler batch)."""
    from .builders import build_decode_inputs

    inp = build_decode_inputs(kind, batch=batch * sets, num_heads=num_heads, context_len=context_len,
                              mtp=mtp, kv_format=kv_format, topk=topk, device=device, seed=seed,
                              row_placement=row_placement)
    if mixed:
        inp = make_mixed(inp)
    return DecodeSets(kind, inp, batch * (1 + mtp), sets)


def verify_decode_sets(ds: DecodeSets, samples: Dict[int, Sequence[int]]) -> List[dict]:
    """Compare sampled tokens of the sets' outputs with the float64 reference.

    Args:
        ds: the sets, after the op wrote ``ds.outputs`` / ``ds.lses``.
        samples: set index -> token indices (within the set) to check.

    Returns:
        one dict per sampled token: ``set``, ``token``, ``out_err`` (max |out - ref| relative to
        max |ref| over that set's sampled tokens), ``lse_err`` (:func:`mla_ext.reference.lse_error`:
        max abs over finite reference entries, relative beyond |lse| 1024), ``out_tol`` /
        ``lse_tol`` (:func:`mla_ext.reference.decode_tolerances`), ``ok`` and ``problem`` (why not
        ok, else "").
    """
    from . import reference

    out_tol, lse_tol = reference.decode_tolerances(ds.outputs[0].device.type, ds.inp.kv_format)
    results = []
    for r, tokens in sorted(samples.items()):
        tok = sorted(set(int(t) for t in tokens))
        k = ds.kwargs[r]
        pick = lambda x: None if x is None else x[tok]
        ref_o, ref_l = reference.sparse_mla_decode(
            k["q"][tok], k["kv_cache"], k["indices"][tok], kv_format=k["kv_format"],
            softmax_scale=k["softmax_scale"], lengths=pick(k["lengths"]), extra_kv_cache=k["extra_kv_cache"],
            extra_indices=pick(k["extra_indices"]), extra_lengths=pick(k["extra_lengths"]),
            attn_sink=k["attn_sink"])
        ref_o, ref_l = ref_o.cpu(), ref_l.cpu()
        got_o = ds.outputs[r][tok].double().cpu()
        got_l = ds.lses[r][tok].double().cpu()
        scale = ref_o.abs().max().clamp_min(1e-30)
        for i, t in enumerate(tok):
            out_err = ((got_o[i] - ref_o[i]).abs().max() / scale).item()
            fin = ~torch.isneginf(ref_l[i])
            lse_err = reference.lse_error(got_l[i], ref_l[i])
            problem = ""
            if bool(torch.isnan(got_o[i]).any()) or bool(torch.isnan(got_l[i]).any()):
                problem = "NaN in output or lse (unwritten or wrong)"
            elif not torch.equal(torch.isneginf(got_l[i]), ~fin):
                problem = "lse -inf pattern differs from the reference"
            elif not out_err <= out_tol:
                problem = f"output error {out_err:.3g} (relative to max |ref|) > {out_tol:g}"
            elif not lse_err <= lse_tol:
                problem = f"lse error {lse_err:.3g} > {lse_tol:g}"
            results.append(dict(set=r, token=t, out_err=out_err, lse_err=lse_err, out_tol=out_tol,
                                lse_tol=lse_tol, ok=not problem, problem=problem))
    return results


def decode_metrics(us: float, kv_bytes: float, flops: float, copy_gbs: Optional[float] = None,
                   mm_tflops: Optional[float] = None) -> dict:
    """Rates of one decode call taking ``us`` µs: ``GBps`` (KV bytes gathered / time),
    ``TFLOPs``, and with both ceilings ``roofline_us`` = max(kv_bytes / copy bandwidth, flops /
    matmul rate), ``pct_roofline`` = 100 x roofline_us / us and ``bound`` ("memory"/"compute")."""
    row = dict(us=us, GBps=kv_bytes / us / 1e3, TFLOPs=flops / us / 1e6)
    if copy_gbs and mm_tflops:
        mem_us, mma_us = kv_bytes / (copy_gbs * 1e3), flops / (mm_tflops * 1e6)
        row.update(roofline_us=max(mem_us, mma_us), pct_roofline=100.0 * max(mem_us, mma_us) / us,
                   bound="memory" if mem_us >= mma_us else "compute")
    return row


def compare_to_baseline(rows: List[dict], baseline_rows: Sequence[dict]) -> int:
    """Set ``us_base`` (the baseline's µs) and ``vs_base`` (``us / us_base``: below 1 is faster)
    on each row of ``rows`` whose (layer, H, T) a row of ``baseline_rows`` has, both lists as
    bench_decode.py's ``--json`` file holds them (another build, an environment switch, an
    earlier run). Rows without a match, or where either time is not a positive number (a shape
    that ran out of memory), get neither key. Returns the number of rows compared."""
    def key(r):
        return (r.get("layer"), r.get("H"), r.get("T"))

    base = {key(r): r.get("us") for r in baseline_rows}
    n = 0
    for r in rows:
        b, us = base.get(key(r)), r.get("us")
        if isinstance(b, (int, float)) and isinstance(us, (int, float)) and b > 0 and us > 0:
            r["us_base"], r["vs_base"] = float(b), float(us) / float(b)
            n += 1
    return n


def time_calls(calls: Sequence[Callable[[], None]], device, *, replays: int = 30) -> float:
    """Median µs per call of ``calls`` run in order: CUDA-graph replay (:func:`time_graph`) on a
    GPU, :func:`time_cpu` over the whole sequence on the CPU."""
    if torch.device(device).type == "cpu":
        return time_cpu(lambda: [fn() for fn in calls], repeat=3, min_seconds=0.02) / len(calls)
    return time_graph(calls, replays=replays)


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


def parse_decode_shapes(spec: str) -> List[Tuple[str, int, int]]:
    """``"layer:num_heads:num_tokens,..."`` (layers of :data:`DECODE_LAYERS`) as a list of
    ``(layer, num_heads, num_tokens)``; ValueError naming the bad item otherwise."""
    shapes = []
    for item in spec.split(","):
        parts = item.split(":")
        if len(parts) != 3 or parts[0] not in DECODE_LAYERS or not (parts[1].isdigit() and parts[2].isdigit()):
            raise ValueError(f"expected layer:num_heads:num_tokens with a layer of {sorted(DECODE_LAYERS)}, "
                             f"got {item!r}")
        shapes.append((parts[0], int(parts[1]), int(parts[2])))
    return shapes


def sweep_shapes(parser, spec: str, script: str) -> List[Tuple[str, int, int]]:
    """For the GPU sweep scripts (tests/gpu_dev): ``spec`` parsed by :func:`parse_decode_shapes`
    (``parser.error`` on a bad item), then :func:`require_gpu`."""
    try:
        shapes = parse_decode_shapes(spec)
    except ValueError as e:
        parser.error(f"--shapes: {e}")
    require_gpu(script)
    return shapes


def build_layer_sets(layer: str, *, num_tokens: int, num_heads: int, device="cuda", seed: int = 0,
                     row_placement: str = "pages") -> DecodeSets:
    """:class:`DecodeSets` for one shape of :data:`DECODE_LAYERS` (its top-k, context lengths and
    straggler mix): on a GPU as many input sets as keep the timed calls L2-cold
    (:func:`decode_num_sets`), on the CPU one. ``row_placement``: as
    :func:`mla_ext.builders.build_decode_inputs`."""
    kind, topk, ctx = DECODE_LAYERS[layer]
    gpu = torch.device(device).type != "cpu"
    sets = decode_num_sets(kind, num_tokens, ctx[1], topk, max_cache_bytes=decode_cache_budget(device)) if gpu else 1
    return build_decode_sets(kind, batch=num_tokens, num_heads=num_heads, context_len=ctx, sets=sets,
                             topk=topk, device=device, seed=seed, mixed=layer.endswith("mixed"),
                             row_placement=row_placement)


def measure_decode(layer: str, num_heads: int, num_tokens: int, *, copy_gbs: float, mm_tflops: float,
                   device="cuda", with_gather: bool = True, verify: bool = True, seed: int = 0) -> dict:
    """Build, verify (a sample of tokens vs the float64 reference) and time one decode shape
    of :data:`DECODE_LAYERS` (on a GPU over L2-cold rotations, as :func:`time_calls`)."""
    from ._decode import DecodeWorkspace

    gpu = torch.device(device).type != "cpu"
    ds = build_layer_sets(layer, num_tokens=num_tokens, num_heads=num_heads, device=device, seed=seed)
    T = num_tokens
    ws = DecodeWorkspace(T, num_heads, device=device)
    row = dict(layer=layer, H=num_heads, T=T, kv_format=ds.inp.kv_format)
    if verify:
        ds.poison()
        ds.call(0, ws.tensor)
        row["max_rel_err"] = max(v["out_err"] for v in verify_decode_sets(ds, {0: [0, T // 2, T - 1]}))
    us = time_calls(ds.calls(ws.tensor), device)
    row.update(rows=int(ds.rows_per_call), kv_MB=ds.kv_bytes_per_call / 1e6)
    row.update(decode_metrics(us, ds.kv_bytes_per_call, ds.flops_per_call, copy_gbs, mm_tflops))
    if with_gather and gpu:
        g_us = gather_ceiling_us(ds.inp, int(ds.rows_per_call), ds.sets)
        row["gather_us"] = g_us
        row["pct_gather"] = 100.0 * g_us / us
    del ds, ws
    if gpu:
        torch.cuda.empty_cache()
    return row


# ---------------------------------------------------------------------------------------------
# one decode step of a whole model (``mla-ext decode``)
# ---------------------------------------------------------------------------------------------

def context_range(context_len: int, mtp: int = 0) -> tuple:
    """Per-request context lengths drawn around ``context_len``: the inclusive range
    [3/4, 5/4] x context_len, never below 1 + mtp (the query tokens themselves) and never above
    ``mla_ext.cli.MAX_CONTEXT`` (2^21, the longest ``--context`` the commands take)."""
    from .cli import MAX_CONTEXT

    lo = max(1 + mtp, context_len * 3 // 4)
    return lo, max(lo, min(context_len * 5 // 4, MAX_CONTEXT))


def _sample_tokens(ds: DecodeSets, perturb: Optional[tuple]) -> Dict[int, List[int]]:
    """Tokens 0, T/2 and T-1 of the first and the last set (plus a perturbed row, if any)."""
    T = ds.num_tokens
    picks = sorted({0, T // 2, T - 1})
    samples = {0: list(picks), ds.sets - 1: list(picks)}
    if perturb is not None and perturb[0] == ds.kind:
        samples[0].append(perturb[1])
    return samples


def run_model_decode(model, *, batch: int, num_heads: int, context_len: int, kinds: Sequence[str],
                     workspace, device, mtp: int = 0, kv_format: Optional[str] = None, steps: int = 3,
                     copy_gbs: Optional[float] = None, mm_tflops: Optional[float] = None,
                     sets: Optional[int] = None, seed: int = 0, progress=None,
                     perturb: Optional[tuple] = None) -> dict:
    """The attention of one decode step of ``model`` (a :class:`mla_ext.models.ModelPreset`):
    build, time and verify every layer kind in ``kinds``.

    Per layer kind, :func:`build_decode_sets` makes ``sets`` input sets (default: on a GPU the
    L2-cold rotation :func:`decode_num_sets`, on the CPU 2) of ``batch`` requests with
    ``1 + mtp`` query tokens each and context lengths :func:`context_range`; the j-th layer of
    a kind uses set ``j % sets``. Every call reuses ``workspace`` (a
    :class:`mla_ext.DecodeWorkspace` made for at least batch x (1 + mtp) tokens and
    ``num_heads``) and writes into the set's preallocated output and lse, poisoned (NaN) first.

    Timing: per kind, the median µs per call over its sets (:func:`time_calls`: CUDA-graph
    replay with L2-cold inputs on a GPU); then the whole step, every selected layer in model
    order, run ``steps`` times (one CUDA graph replayed ``steps`` times on a GPU; eagerly on
    the CPU) -> median µs per step. Verification (after the timed runs, so it checks what they
    wrote): no NaN anywhere in any set's output or lse, and tokens 0, T/2, T-1 of the first and
    last set against the float64 reference (:func:`verify_decode_sets`).

    Args (beyond the above): ``copy_gbs`` / ``mm_tflops``: measured ceilings for the roofline
    (None: no roofline columns); ``progress``: a tqdm bar (updated once per build, per timed
    kind, per step and per verified kind) or None; ``perturb``: test hook ``(kind, token)``,
    adds a large error to that token of set 0 of that kind after the timed runs (verification
    must then fail naming it).

    Returns:
        dict with ``batch``, ``num_tokens``, ``rows`` (one dict per kind: timing, rates,
        roofline, ``step_us`` = µs per call x layers of the kind, verification summary),
        ``step_sum_us`` (sum of the kinds' step_us), ``step_measured_us``, ``cache_bytes``,
        ``failures`` (list of dicts naming kind, set, layers, token, request, query, problem).
    """
    gpu = torch.device(device).type != "cpu"
    T = batch * (1 + mtp)
    ctx = context_range(context_len, mtp)
    ws = workspace.check(T, num_heads)

    def tick(what: str, n: int = 1):
        if progress is not None:
            progress.set_postfix_str(what, refresh=False)
            progress.update(n)

    built: Dict[str, DecodeSets] = {}
    for i, kind in enumerate(kinds):
        topk = model.topk.get(kind)
        n_sets = sets or (decode_num_sets(kind, T, ctx[1], topk, kv_format,
                                          max_cache_bytes=decode_cache_budget(device, len(kinds))) if gpu else 2)
        built[kind] = build_decode_sets(kind, batch=batch, num_heads=num_heads, context_len=ctx, sets=n_sets,
                                        mtp=mtp, kv_format=kv_format, topk=topk, device=device,
                                        seed=seed + 1000 * i)
        built[kind].poison()
        tick(f"built {kind}")

    per_kind_us = {}
    for kind in kinds:
        per_kind_us[kind] = time_calls(built[kind].calls(ws), device)
        tick(f"timed {kind}")

    # the step: every selected layer in model order, layer j of a kind on set j % sets
    used = {k: 0 for k in built}
    calls = []
    for kind_of_layer in model.layer_kinds:
        if kind_of_layer in built:
            ds = built[kind_of_layer]
            calls.append(functools.partial(ds.call, used[kind_of_layer] % ds.sets, ws))
            used[kind_of_layer] += 1
    if gpu:
        step_us = time_graph(calls, replays=steps, warmup=1) * len(calls)
        tick("step", steps)
    else:
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            for fn in calls:
                fn()
            times.append((time.perf_counter() - t0) * 1e6)
            tick("step")
        step_us = statistics.median(times)

    if perturb is not None and perturb[0] in built:
        o = built[perturb[0]].outputs[0]
        o[perturb[1]] += 0.5 * o.float().abs().max().to(o.dtype) + 1.0

    rows, failures = [], []
    for kind in kinds:
        ds = built[kind]
        layer_ids = model.layers_of(kind)
        checks = verify_decode_sets(ds, _sample_tokens(ds, perturb))
        for r in range(ds.sets):  # every element written, everywhere
            bad = torch.isnan(ds.outputs[r].float()).flatten(1).any(1) | torch.isnan(ds.lses[r]).any(1)
            for t in bad.nonzero().flatten().tolist()[:4]:
                checks.append(dict(set=r, token=t, out_err=float("nan"), lse_err=float("nan"), ok=False,
                                   problem="NaN in output or lse (unwritten or wrong)"))
        for c in checks:
            if not c["ok"]:
                failures.append(dict(kind=kind, set=c["set"], layers=layer_ids[c["set"]::ds.sets],
                                     token=c["token"], request=c["token"] // (1 + mtp),
                                     query=c["token"] % (1 + mtp), problem=c["problem"]))
        sampled = [c for c in checks if c["out_err"] == c["out_err"]]
        out_tol, lse_tol = checks[0]["out_tol"], checks[0]["lse_tol"]
        us = per_kind_us[kind]
        row = dict(batch=batch, kind=kind, layers=len(layer_ids), T=T, H=num_heads, kv_format=ds.inp.kv_format,
                   sets=ds.sets, rows=ds.rows_per_call, kv_MB=ds.kv_bytes_per_call / 1e6,
                   flops=ds.flops_per_call)
        row.update(decode_metrics(us, ds.kv_bytes_per_call, ds.flops_per_call, copy_gbs, mm_tflops))
        row.update(step_us=us * len(layer_ids), verified_rows=len(sampled),
                   max_out_err=max(c["out_err"] for c in sampled), max_lse_err=max(c["lse_err"] for c in sampled),
                   out_tol=out_tol, lse_tol=lse_tol, verify_ok=all(c["ok"] for c in checks))
        rows.append(row)
        tick(f"verified {kind}")

    result = dict(batch=batch, num_tokens=T, context_range=list(ctx), rows=rows,
                  step_layers=len(calls), step_sum_us=sum(r["step_us"] for r in rows), step_measured_us=step_us,
                  cache_bytes=sum(ds.cache_bytes for ds in built.values()), failures=failures)
    del built, calls
    if gpu:
        torch.cuda.empty_cache()
    return result


def plot_decode_roofline(report: dict, path: str) -> None:
    """Roofline chart of an ``mla-ext decode`` report (its JSON dict), written to ``path`` (the
    format from its suffix, as matplotlib's ``savefig``: ``.png``, ``.pdf``, ``.svg``, ...).

    Left: the roofline, TFLOP/s against arithmetic intensity (FLOP per KV byte gathered), with
    the ceiling min(matmul rate, copy bandwidth x intensity) from the report's measured ceilings
    and one point per (layer kind, batch) at its achieved rate (marker = kind, colour = batch).
    A decode's intensity is 2·H·(d_qk+512) / bytes per row, so at one head count every V4 layer
    kind sits at the same intensity; the right panel therefore also shows, per layer kind and
    batch, the achieved µs per call next to the roofline µs (bar label: % of the roofline).

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: the report has no ceilings (nothing to draw a roofline from).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .models import KIND_LABELS

    ceil = report.get("ceilings") or {}
    bw, mm = ceil.get("copy_GBps"), ceil.get("matmul_TFLOPs")
    if not bw or not mm:
        raise ValueError("the report has no measured ceilings to draw a roofline")
    rows = [r for b in report["batches"] for r in b["rows"]]
    ai = [r["flops"] / (r["kv_MB"] * 1e6) for r in rows]
    knee = mm * 1e3 / bw
    lo, hi = min(ai + [knee]) / 8, max(ai + [knee]) * 8
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    markers = {"v4_swa": "o", "v4_c4": "s", "v4_c128": "^", "v32": "D"}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    batches = list(dict.fromkeys(r["batch"] for r in rows))
    label = lambda r: f"{KIND_LABELS.get(r['kind'], r['kind'])} B={r['batch']}"

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.5), gridspec_kw=dict(width_ratios=[1.1, 1]))
    ax.plot(xs, [min(mm, bw * x / 1e3) for x in xs], color="black", lw=1.5,
            label=f"ceiling: copy {bw:.0f} GB/s, {ceil.get('matmul_dtype', '')} matmul {mm:.3g} TFLOP/s")
    for x, r in zip(ai, rows):
        ax.scatter([x], [r["TFLOPs"]], marker=markers.get(r["kind"], "o"), s=45, zorder=3,
                   color=colors[batches.index(r["batch"]) % len(colors)],
                   label=f"{label(r)}: {r['TFLOPs']:.3g} TFLOP/s ({r.get('pct_roofline', 0):.0f}%)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per KV byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("roofline: achieved per layer kind and batch", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)  # below: never over a point

    ypos = list(range(len(rows)))
    bx.barh([y + 0.2 for y in ypos], [r["us"] for r in rows], height=0.4, color="tab:blue", label="achieved µs/call")
    bx.barh([y - 0.2 for y in ypos], [r.get("roofline_us", 0) for r in rows], height=0.4, color="tab:gray",
            label="roofline µs/call (max of bytes/copy, flops/matmul)")
    for y, r in zip(ypos, rows):
        bx.annotate(f"{r.get('pct_roofline', 0):.0f}% ({r['layers']} layers)", (r["us"], y + 0.2),
                    textcoords="offset points", xytext=(4, -3), fontsize=7)
    bx.set_yticks(ypos)
    bx.set_yticklabels([label(r) for r in rows], fontsize=8)
    bx.invert_yaxis()
    bx.set_xlabel("µs per call")
    bx.set_title("achieved vs roofline time per call", fontsize=10)
    bx.margins(x=0.25)
    bx.legend(fontsize=7, loc="upper right")
    fig.suptitle(f"{report['model_name']} decode attention, {report['heads_per_gpu']} heads/GPU (TP {report['tp']}),"
                 f" context ~{report['context']}, {report['kv_format']}, on {report['device_name']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
