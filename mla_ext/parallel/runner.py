"""``python -m mla_ext.parallel --cp N``: context-parallel sparse MLA decode, verified and timed.

Every rank builds the same decode inputs with :func:`mla_ext.builders.build_decode_inputs`
(same seed; checked by a checksum exchange), keeps its shard of the KV pages
(:class:`mla_ext.parallel.PageSharding`), runs :class:`mla_ext.parallel.ContextParallelDecode`
for ``--steps`` steps, checks the merged result on every rank against single-device
``sparse_mla_decode`` on the full cache (and, with ``--reference``, the float64 reference), and
rank 0 prints per-rank times split into compute (local decode, merge) and communication
(the all-gather, which includes waiting for the slowest rank).

Launch: without torchrun it spawns ``--cp`` processes itself (``torch.multiprocessing``,
rendezvous on 127.0.0.1 and a free port); under ``torchrun --nproc_per_node N -m
mla_ext.parallel ...`` it uses torchrun's ranks. GPU: one GPU per rank (``cuda:<local rank>``),
backend NCCL; CPU: backend gloo.

Timing method: per step, a barrier, then CUDA events (GPU) or the host clock (CPU) around each
phase; medians over the steps. ``single_us`` is the single-device decode of the same step on one
device (rank 0), measured the same way. On a CPU the run's threads are ``OMP_NUM_THREADS`` where
it is set (not under torchrun, which sets it to 1 itself), else ``os.cpu_count()``: each rank runs
on 1/N of them and the single-device decode on all of them (the other ranks wait), so the two
columns compare N processes against one process on the same cores.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from typing import List, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .._decode import DecodeWorkspace
from ..builders import LAYER_KINDS, build_decode_inputs
from . import SHARDING_MODES, ContextParallelDecode, PageSharding, compact_indices

OUT_TOL = 2e-2   # max |cp - single| / max |single|: two bf16 roundings (partials, then the merge)
LSE_TOL = 1e-3   # max |cp lse - single lse| (natural log)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m mla_ext.parallel", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cp", type=int, required=True, help="context-parallel ranks (processes)")
    ap.add_argument("--layer", default="v4_c4", choices=sorted(LAYER_KINDS), help="layer kind (default v4_c4)")
    ap.add_argument("--batch", type=int, default=4, help="requests (default 4)")
    ap.add_argument("--heads", type=int, default=16, help="query heads per rank (default 16)")
    ap.add_argument("--context", type=int, nargs=2, default=(2048, 4096), metavar=("LO", "HI"),
                    help="context length range in tokens (default 2048 4096)")
    ap.add_argument("--mtp", type=int, default=0, help="extra speculative tokens per request (default 0)")
    ap.add_argument("--kv-format", default=None, help="cache format (default: the layer's)")
    ap.add_argument("--topk", type=int, default=None, help="top-k width (v4_c4, v32)")
    ap.add_argument("--sharding", default="round_robin", choices=SHARDING_MODES,
                    help="page assignment (default round_robin)")
    ap.add_argument("--device", default=None, choices=("cuda", "cpu"),
                    help="default: cuda when enough GPUs are visible, else cpu")
    ap.add_argument("--backend", default=None, choices=("nccl", "gloo"), help="default: nccl on cuda, gloo on cpu")
    ap.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--num-splits", type=int, default=0, help="split-K of the local decode (0 = automatic)")
    ap.add_argument("--no-compact", dest="compact", action="store_false",
                    help="keep each rank's index rows at full width (foreign slots -1) instead of moving "
                         "its own slots to the front (compact_indices), so a rank walks every position")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference", action="store_true",
                    help="also compare with the float64 reference (slow on large shapes)")
    ap.add_argument("--json", default=None, help="write the results (rank 0) to this file")
    return ap


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Timer:
    """Marks on the device stream (CUDA events) or the host clock; elapsed in µs."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def us(self, a, b) -> float:
        return a.elapsed_time(b) * 1e3 if self.cuda else (b - a) * 1e6


def _valid_rows(indices, lengths, num_slots) -> int:
    if indices is None:
        return 0
    ok = (indices >= 0) & (indices < num_slots)
    if lengths is not None:
        ok &= torch.arange(indices.shape[1], device=indices.device)[None, :] < lengths.reshape(-1, 1)
    return int(ok.sum())


def _max_rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double().cpu(), ref.double().cpu()
    if a.isnan().any():
        return float("nan")
    return float((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30)) if ref.numel() else 0.0


def _lse_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double().cpu(), ref.double().cpu()
    if not torch.equal(torch.isneginf(a), torch.isneginf(ref)) or a.isnan().any():
        return float("nan")
    fin = torch.isfinite(ref)
    return float((a[fin] - ref[fin]).abs().max()) if bool(fin.any()) else 0.0


def cpu_threads(under_torchrun: bool = False) -> int:
    """The threads a CPU run may use: ``OMP_NUM_THREADS`` where it is set to a positive integer
    (the README's advice for steadier timings), else ``os.cpu_count()``. Under torchrun always
    ``os.cpu_count()``: torchrun sets OMP_NUM_THREADS=1 in every worker when the user did not set
    it, and a worker cannot tell the two apart."""
    try:
        n = 0 if under_torchrun else int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        n = 0
    return n if n > 0 else (os.cpu_count() or 1)


def run_rank(rank: int, world: int, local_rank: int, args: argparse.Namespace) -> Optional[dict]:
    """Body of one rank (the process group is initialised). Returns the summary on rank 0."""
    cuda = args.device == "cuda"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    threads = cpu_threads(getattr(args, "under_torchrun", False))
    rank_threads = max(1, threads // world)  # CPU: the ranks split the threads
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(rank_threads)

    inp = build_decode_inputs(args.layer, batch=args.batch, num_heads=args.heads, context_len=tuple(args.context),
                              mtp=args.mtp, kv_format=args.kv_format, topk=args.topk, device=device, seed=args.seed)
    T, H = inp.num_tokens, inp.num_heads

    # every rank must hold the same inputs (same seed): compare exact integer checksums of the bits
    def bits_sum(t):
        t = t.view(torch.int16) if t.element_size() == 2 else t
        return t.sum(dtype=torch.int64)

    sums = [bits_sum(inp.q), bits_sum(inp.indices), bits_sum(inp.kv_cache)]
    if inp.extra_indices is not None:
        sums += [bits_sum(inp.extra_indices), bits_sum(inp.extra_kv_cache)]
    mine = torch.stack(sums).to(device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    if not all(torch.equal(e, every[0]) for e in every):
        raise RuntimeError("mla_ext.parallel: the ranks built different inputs (non-deterministic builder on "
                           "this device?)")

    # shard: local caches and local indices
    sharding = PageSharding(world, rank, args.sharding)
    t0 = time.perf_counter()
    local_cache = sharding.shard_kv_cache(inp.kv_cache)
    ps, npg = inp.kv_cache.shape[1], inp.kv_cache.shape[0]
    local_idx = sharding.localize_indices(inp.indices, page_size=ps, num_pages=npg)
    local_extra_cache = local_extra_idx = None
    if inp.extra_kv_cache is not None:
        local_extra_cache = sharding.shard_kv_cache(inp.extra_kv_cache)
        eps, enpg = inp.extra_kv_cache.shape[1], inp.extra_kv_cache.shape[0]
        local_extra_idx = sharding.localize_indices(inp.extra_indices, page_size=eps, num_pages=enpg)
    if cuda:
        torch.cuda.synchronize()
    shard_ms = (time.perf_counter() - t0) * 1e3
    rows = _valid_rows(local_idx, inp.lengths, local_cache.shape[0] * ps)
    if local_extra_idx is not None:
        rows += _valid_rows(local_extra_idx, inp.extra_lengths, local_extra_cache.shape[0] * eps)

    cp = ContextParallelDecode(T, H, device=device, num_splits=args.num_splits)
    out = torch.full((T, H, 512), float("nan"), dtype=torch.bfloat16, device=device)
    lse = torch.full((T, H), float("nan"), device=device)
    kw = dict(kv_format=inp.kv_format, softmax_scale=inp.softmax_scale, lengths=inp.lengths,
              extra_lengths=inp.extra_lengths)
    local_lengths, local_extra_lengths = inp.lengths, inp.extra_lengths
    if args.compact:  # once per step in an engine; here outside the timed step, like localize_indices
        local_idx, local_lengths = compact_indices(local_idx, inp.lengths)
        if local_extra_idx is not None:
            local_extra_idx, local_extra_lengths = compact_indices(local_extra_idx, inp.extra_lengths)
    local_kw = dict(kw, lengths=local_lengths, extra_lengths=local_extra_lengths,
                    extra_kv_cache=local_extra_cache, extra_indices=local_extra_idx)

    timer = _Timer(cuda)
    times = {"decode_us": [], "comm_us": [], "merge_us": [], "step_us": []}
    for step in range(args.warmup + args.steps):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        m0 = timer.mark()
        cp.local_decode(inp.q, local_cache, local_idx, **local_kw)
        m1 = timer.mark()
        cp.exchange(T)
        m2 = timer.mark()
        cp.merge(out, lse, inp.attn_sink)
        m3 = timer.mark()
        if cuda:
            torch.cuda.synchronize()
        if step >= args.warmup:
            times["decode_us"].append(timer.us(m0, m1))
            times["comm_us"].append(timer.us(m1, m2))
            times["merge_us"].append(timer.us(m2, m3))
            times["step_us"].append(timer.us(m0, m3))

    # verification: single-device decode on the full cache, with the sink
    ref_out = torch.full((T, H, 512), float("nan"), dtype=torch.bfloat16, device=device)
    ref_lse = torch.full((T, H), float("nan"), device=device)
    ws = cp.workspace.tensor
    single = dict(kw, extra_kv_cache=inp.extra_kv_cache, extra_indices=inp.extra_indices, attn_sink=inp.attn_sink)

    def run_single(workspace=ws):
        from .._decode import sparse_mla_decode
        sparse_mla_decode(inp.q, inp.kv_cache, inp.indices, output=ref_out, workspace=workspace, lse=ref_lse,
                          num_splits=args.num_splits, **single)

    run_single()
    res = dict(rank=rank, rows=rows, shard_ms=shard_ms, threads=None if cuda else torch.get_num_threads(),
               out_err=_max_rel(out, ref_out), lse_err=_lse_err(lse, ref_lse),
               **{k: statistics.median(v) if v else float("nan") for k, v in times.items()})
    if args.reference:
        r_o, r_l = inp.reference()
        res["ref_out_err"] = _max_rel(out, r_o)
        res["ref_lse_err"] = _lse_err(lse, r_l)
        res["single_ref_out_err"] = _max_rel(ref_out, r_o)

    # single-device timing on rank 0 only (the others wait: on a CPU they would share cores). On a
    # CPU the single device is the whole machine: the ranks split its threads (cpu_threads), the
    # baseline gets them all
    dist.barrier()
    if rank == 0:
        if not cuda:  # more threads can mean more splits: a workspace sized with all of them
            torch.set_num_threads(threads)
            ws = DecodeWorkspace(T, H, num_splits=args.num_splits, device=device).tensor
        st = []
        for i in range(args.warmup + args.steps):
            if cuda:
                torch.cuda.synchronize()
            a = timer.mark()
            run_single(ws)
            b = timer.mark()
            if cuda:
                torch.cuda.synchronize()
            if i >= args.warmup:
                st.append(timer.us(a, b))
        res["single_us"] = statistics.median(st) if st else float("nan")
        res["single_threads"] = None if cuda else torch.get_num_threads()
        if not cuda:
            torch.set_num_threads(rank_threads)
    dist.barrier()

    gathered: List[Optional[dict]] = [None] * world
    dist.all_gather_object(gathered, res)
    if rank != 0:
        return None
    ok = all(r["out_err"] <= OUT_TOL and r["lse_err"] <= LSE_TOL for r in gathered)
    return dict(ok=ok, world=world, device=str(device) if not cuda else torch.cuda.get_device_name(device),
                backend=dist.get_backend(), layer=args.layer, kv_format=inp.kv_format, sharding=args.sharding, compact=args.compact,
                num_tokens=T, num_heads=H, num_selected=inp.num_selected,
                comm_bytes_per_rank=cp.bytes_per_rank(T), single_us=gathered[0]["single_us"],
                single_threads=gathered[0]["single_threads"], ranks=gathered)


def report(summary: dict, out=sys.stdout) -> None:
    from tabulate import tabulate

    cols = ["rank", "rows", "decode_us", "comm_us", "merge_us", "step_us", "out_err", "lse_err"]
    extra = [c for c in ("ref_out_err", "ref_lse_err") if c in summary["ranks"][0]]
    print(f"context-parallel sparse_mla_decode: {summary['layer']} ({summary['kv_format']}), "
          f"{summary['world']} ranks on {summary['device']} ({summary['backend']}), {summary['sharding']} pages{', compacted indices' if summary.get('compact') else ''}, "
          f"T={summary['num_tokens']} H={summary['num_heads']}, {summary['num_selected']} selected rows, "
          f"{summary['comm_bytes_per_rank']} B all-gathered per rank", file=out)
    print(tabulate([[r.get(c, "") for c in cols + extra] for r in summary["ranks"]], headers=cols + extra,
                   floatfmt=".4g"), file=out)
    r0 = summary["ranks"]
    compute = max(r["decode_us"] + r["merge_us"] for r in r0)
    comm = max(r["comm_us"] for r in r0)
    print(f"per step (slowest rank): compute {compute:.4g} us (decode + merge), communication {comm:.4g} us "
          f"(all-gather incl. waiting for the slowest rank), step {max(r['step_us'] for r in r0):.4g} us; "
          f"single-device decode {summary['single_us']:.4g} us"
          + (f" ({summary['single_threads']} threads; each rank {r0[0]['threads']})"
             if summary.get("single_threads") else ""), file=out)
    print(f"verify against single-device decode (out max rel err <= {OUT_TOL}, lse max abs err <= {LSE_TOL}): "
          f"{'ok' if summary['ok'] else 'FAILED'}", file=out)


def _spawned(local_rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    _run_initialised(local_rank, world, local_rank, args)


def _run_initialised(rank: int, world: int, local_rank: int, args: argparse.Namespace) -> None:
    kw = {}
    if args.device == "cuda":
        kw["device_id"] = torch.device("cuda", local_rank)
    dist.init_process_group(args.backend, rank=rank, world_size=world, **kw)
    try:
        summary = run_rank(rank, world, local_rank, args)
        if rank == 0:
            report(summary)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(summary, f, indent=2)
            if not summary["ok"]:
                raise SystemExit("mla_ext.parallel: verification FAILED")
    finally:
        dist.destroy_process_group()


def _usage_error(args: argparse.Namespace) -> Optional[str]:
    """What is wrong with the arguments, checked before any rank starts (so a bad value is a
    one-line usage error, exit 2, not a failure inside every rank or a bogus verification result);
    None when they are usable."""
    from ..cli import MAX_CONTEXT, _check_out_paths, _decode_size_error

    kind = LAYER_KINDS[args.layer]
    if args.cp < 1:
        return f"--cp must be >= 1, got {args.cp}"
    if args.batch < 1 or args.heads < 1 or args.mtp < 0:
        return f"--batch and --heads must be >= 1 and --mtp >= 0, got {args.batch}, {args.heads}, {args.mtp}"
    lo, hi = args.context
    if not 1 + args.mtp <= lo <= hi <= MAX_CONTEXT:
        return f"--context LO HI must satisfy 1 + --mtp <= LO <= HI <= {MAX_CONTEXT}, got {lo} {hi}"
    if args.kv_format is not None and args.kv_format not in kind.formats:
        return f"--kv-format for --layer {args.layer} must be one of {kind.formats}, got {args.kv_format!r}"
    if args.topk is not None and (kind.topk is None or args.topk < 1):
        return (f"--topk is not a parameter of --layer {args.layer}" if kind.topk is None
                else f"--topk must be >= 1, got {args.topk}")
    if args.steps < 1 or args.warmup < 0:
        return f"--steps must be >= 1 and --warmup >= 0, got {args.steps}, {args.warmup}"
    err = _decode_size_error(args.batch * (1 + args.mtp), args.heads, args.num_splits)
    if err:
        return f"--num-splits {args.num_splits} / --batch / --heads: {err}"
    return _check_out_paths(json=args.json)


def main(argv: Optional[List[str]] = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    err = _usage_error(args)
    if err:
        ap.error(err)
    under_torchrun = all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"))
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun else args.cp
    if under_torchrun and world != args.cp:
        raise SystemExit(f"--cp {args.cp} differs from torchrun's WORLD_SIZE {world}")
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "cpu"
    if args.device == "cuda" and torch.cuda.device_count() < (int(os.environ.get("LOCAL_WORLD_SIZE", world))
                                                               if under_torchrun else world):
        raise SystemExit(f"--device cuda with {world} ranks needs {world} visible GPUs, "
                         f"found {torch.cuda.device_count()}")
    if args.device == "cpu" and args.backend == "nccl":  # given, or chosen by default just above
        ap.error("--backend nccl needs --device cuda (gloo runs on the CPU)")
    if args.backend is None:
        args.backend = "nccl" if args.device == "cuda" else "gloo"
    if args.device == "cuda":
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (all-gather does not need it)
    args.under_torchrun = under_torchrun
    if under_torchrun:
        _run_initialised(int(os.environ["RANK"]), world, int(os.environ["LOCAL_RANK"]), args)
    else:
        mp.spawn(_spawned, args=(world, _free_port(), args), nprocs=world, join=True)
    return 0
