"""The ``mla-ext`` command.

Sub-commands:
- ``mla-ext decode``: the attention of one decode step of a DeepSeek model (V4 Flash / Pro,
  V3.2) on this machine: every layer's ``sparse_mla_decode`` on realistic paged caches and index
  sets, one shared workspace, outputs written in place; verified against the float64 reference
  and timed per layer kind against the measured copy / matmul roofline.
- ``mla-ext merge``: merge_attn_states on MLA chunked-prefill shapes (padded V views merged
  straight into a layer-output buffer), verified against the float64 reference and timed; on a
  GPU side by side with a device-to-device copy of the same bytes.
- ``mla-ext info``: how this copy was built and what it runs with.

Exit status: 0 success; 1 a result was off the reference (the rows are named on stderr);
2 bad arguments; 3 ``--plot`` was asked for but the chart could not be drawn (matplotlib missing,
or saving failed; everything else ran);
4 out of memory (device or host).

Test hook (hidden from ``--help``): ``mla-ext decode --test-perturb KIND:TOKEN`` adds a large
error to token TOKEN of the first input set of layer kind KIND (e.g. ``v4_c4:0``) after the op
and the timed runs, and adds that token to the verification sample, so the command must exit 1
naming it (tests/test_cli.py checks this).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from typing import Optional, Tuple

import torch


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _int_list(text: str):
    """A comma list of integers ("1,16"); an empty entry or a non-integer is a usage error."""
    parts = text.split(",")
    if any(not p.strip() for p in parts):
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r} (an empty entry)")
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None


def _print_table(rows, columns, floatfmt=".5g"):
    from tabulate import tabulate

    table = [[r.get(c, "") for c in columns] for r in rows]
    print(tabulate(table, headers=columns, floatfmt=floatfmt))


def _check_device(device: str) -> Optional[str]:
    """An error message for an unusable --device, else None."""
    if device == "cpu":
        return None
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return f"--device {device}: torch {torch.__version__} sees no CUDA/ROCm device"
        return None
    return f"--device must be cpu or cuda[:N], got {device!r}"


def _check_out_paths(**paths) -> Optional[str]:
    """An error message if an output file cannot be written (checked before any work): its
    folder does not exist, it is a folder, two options name one file, or opening it for writing
    fails. The probe works on the file a symbolic link points to (the link stays); a file that
    did not exist is removed again, an existing one is neither truncated nor touched."""
    seen = {}
    for opt, path in paths.items():
        if path is None:
            continue
        real = os.path.realpath(path)
        folder = os.path.dirname(real)
        if not os.path.isdir(folder):
            return f"--{opt} {path}: folder {folder} does not exist"
        if os.path.isdir(real):
            return f"--{opt} {path}: is a folder, expected a file name"
        if real in seen:
            return f"--{opt} {path}: the same file as --{seen[real]}"
        seen[real] = opt
        existed = os.path.exists(real)
        try:
            with open(real, "a"):
                pass
        except OSError as e:
            return f"--{opt} {path}: cannot write it ({e.strerror or e})"
        if not existed:
            os.remove(real)
    return None


# Longest --context accepted: twice the longest context of the models in mla_ext.models (V4: 1M).
MAX_CONTEXT = 1 << 21

# File types the roofline chart can be saved as: matplotlib's savefig formats where it is
# installed (without pgf, which needs a TeX installation), else these; a --plot path without a
# suffix gets ".png".
PLOT_SUFFIXES = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp", "raw", "rgba")


def _plot_suffixes() -> Tuple[str, ...]:
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return PLOT_SUFFIXES
    return tuple(sorted(set(FigureCanvasBase.get_supported_filetypes()) - {"pgf"}))


def _plot_path(path: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """(the --plot path to write, an error message or None): no suffix -> ".png" appended; a
    suffix matplotlib cannot write is an error."""
    if path is None:
        return None, None
    if os.path.isdir(path) or path.endswith(("/", os.sep)):
        return path, f"--plot {path}: is a folder, expected a file name"
    suffix = os.path.splitext(path)[1]
    if not suffix:
        return path + ".png", None
    suffixes = _plot_suffixes()
    if suffix[1:].lower() not in suffixes:
        return path, f"--plot {path}: a chart cannot be saved as {suffix!r}; use one of .{', .'.join(suffixes)}"
    return path, None


def _out_of_memory(e: BaseException) -> bool:
    """A failed allocation: torch's OutOfMemoryError on a GPU, the CPU allocator's RuntimeError."""
    oom = getattr(torch, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "can't allocate memory" in str(e)


def _first_line(e: BaseException) -> str:
    lines = str(e).splitlines()
    return lines[0] if lines else type(e).__name__


def _bar_off(args) -> Optional[bool]:
    """tqdm's ``disable``: True with --no-progress, else None (tqdm then draws the bar only on a
    terminal, so output sent to a file has no carriage-return lines in it)."""
    return True if args.no_progress else None


def _decode_size_error(num_tokens: int, num_heads: int, num_splits: int = 0) -> Optional[str]:
    """The op's own limits on one call (num_tokens x num_heads, the split count), checked on the
    CPU before any work: the first line of its refusal, or None."""
    from ._decode import sparse_mla_decode_workspace_size

    try:
        sparse_mla_decode_workspace_size(num_tokens, num_heads, num_splits=num_splits, device="cpu")
    except (RuntimeError, ValueError, TypeError) as e:
        return _first_line(e)
    return None


def cmd_merge(args) -> int:
    from tqdm import tqdm

    from .bench import MERGE_LSE_TOL, MERGE_OUT_TOL, measure_merge

    def usage(msg: str) -> int:
        print(f"mla-ext merge: error: {msg}", file=sys.stderr)
        return 2

    err = _check_device(args.device) or _check_out_paths(json=args.json)
    if err:
        return usage(err)
    gpu = args.device.startswith("cuda")
    tokens = [2048, 8192] if gpu and args.num_tokens is None else ([64, 512] if args.num_tokens is None
                                                                   else args.num_tokens)
    heads = ([16, 128] if gpu else [16]) if args.num_heads is None else args.num_heads
    if not tokens or not heads or min(tokens) < 1 or min(heads) < 1 or args.head_size < 1:
        return usage("--num-tokens, --num-heads and --head-size must be >= 1")
    dtype = getattr(torch, args.dtype)
    shapes = [(t, h) for t in tokens for h in heads]
    rows = []
    try:
        for t, h in tqdm(shapes, desc="merge_attn_states", disable=_bar_off(args)):
            rows.append(measure_merge(t, h, args.head_size, dtype=dtype, device=args.device,
                                      layout=args.layout, with_copy=gpu))
    except RuntimeError as e:
        if not _out_of_memory(e):
            raise
        print(f"mla-ext merge: out of memory on {args.device} ({_first_line(e)}); use smaller --num-tokens, "
              "--num-heads or --head-size", file=sys.stderr)
        return 4
    bad = [r for r in rows if not (r["max_rel_err"] <= MERGE_OUT_TOL and r["max_lse_err"] <= MERGE_LSE_TOL)]
    cols = ["T", "H", "D", "dtype", "layout", "bytes", "us", "GB/s", "max_rel_err", "max_lse_err"]
    if gpu:
        cols += ["copy_us", "pct_copy"]
    print(f"merge_attn_states on {args.device} ({torch.cuda.get_device_name() if gpu else 'CPU'}), "
          f"median µs per call" + (" under CUDA-graph replay, L2-cold inputs" if gpu else ""))
    _print_table(rows, cols)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "merge", "device": args.device, "rows": rows}, f, indent=2)
    if bad:
        print(f"FAILED verification: {len(bad)} shape(s) off the reference: "
              + ", ".join(f"(T={r['T']}, H={r['H']}): output error {r['max_rel_err']:.3g} (tolerance "
                          f"{MERGE_OUT_TOL:g}), lse error {r['max_lse_err']:.3g} (tolerance {MERGE_LSE_TOL:g})"
                          for r in bad),
              file=sys.stderr)
        return 1
    return 0


DECODE_EPILOG = """\
models (published configurations; sources in mla_ext/models.py):
  deepseek-v4-flash  43 layers: 2 SWA (sliding window 128 only), 21 C4 (window + indexer
                     top-512 of 4:1-compressed rows), 20 C128 (window + all 128:1 rows); 64 heads
  deepseek-v4-pro    61 layers: 30 C4 (top-1024), 31 C128; 128 heads
  deepseek-v3.2      61 layers, all DSA (indexer top-2048 of all tokens); 128 heads
  V4: d_qk 512, fp8_ds_mla_v4 pages of 256 (window) / 64 (C4) / 2 (C128), scale 512^-0.5, sinks.
  V3.2: d_qk 576, fp8_ds_mla pages of 64, scale 192^-0.5 * mscale^2.
  Heads per GPU = heads / tp. --mtp K adds K query tokens per request to every layer; the
  MTP draft layer's own attention is not included.

sizes: per-request context lengths are drawn from [0.75, 1.25] x --context (at most 2^21); only
pages holding selected rows are allocated, in random physical order. On a GPU each layer kind gets enough
input sets to exceed the L2 cache (layer j of a kind uses set j % sets), so timings are L2-cold.

exit status: 0 ok; 1 verification failed (rows named on stderr); 2 bad arguments;
3 --plot asked for but no chart written (matplotlib missing or saving failed; the rest ran); 4 out of
memory (device or host).
"""

_TEST_PERTURB_HELP = ("test hook KIND:TOKEN: after the timed runs, add a large error to that token of the "
                      "first input set of layer kind KIND (e.g. v4_c4:0); verification must then fail")


def _parse_perturb(text):
    if text is None:
        return None
    kind, _, token = text.partition(":")
    try:
        return kind, int(token)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--test-perturb: expected KIND:TOKEN, got {text!r}") from None


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    n = torch.get_num_threads()
    return f"CPU ({n} thread{'' if n == 1 else 's'})"


def _fmt_layers(layers) -> str:
    if not layers:
        return "no layer of the step (timing rotation only)"
    shown = ", ".join(str(i) for i in layers[:6])
    return f"layer{'s' if len(layers) > 1 else ''} {shown}{', ...' if len(layers) > 6 else ''}"


def _decode_cp(args, model, heads, kinds, kv_format, batches, context, steps) -> int:
    """``mla-ext decode --cp N``: one :mod:`mla_ext.parallel.runner` run per (batch, layer kind);
    per-step totals use the model's layer counts."""
    import tempfile

    from . import bench
    from .models import KIND_LABELS
    from .parallel import runner

    counts = model.kind_counts()
    lo, hi = bench.context_range(context, args.mtp)

    def runner_argv(b, kind, path):
        argv = ["--cp", str(args.cp), "--layer", kind, "--batch", str(b), "--heads", str(heads),
                "--context", str(lo), str(hi), "--mtp", str(args.mtp), "--kv-format", kv_format,
                "--steps", str(steps), "--seed", str(args.seed), "--json", path,
                "--device", "cuda" if args.device.startswith("cuda") else "cpu"]
        topk = model.topk.get(kind)
        return argv + (["--topk", str(topk)] if topk is not None else [])

    # Every run's arguments are checked before the first starts: a value the runner refuses is a
    # usage error of this command (exit 2), not a failed run (exit 1) after others have run.
    for b in batches:
        for kind in kinds:
            argv = runner_argv(b, kind, os.devnull)
            err = runner._usage_error(runner.build_parser().parse_args(argv))
            if err:
                print(f"mla-ext decode --cp: error: {KIND_LABELS[kind]} batch {b}: {err} (the arguments made for "
                      f"python -m mla_ext.parallel {' '.join(argv)})", file=sys.stderr)
                return 2
    rows, failed = [], False
    with tempfile.TemporaryDirectory() as tmp:
        for b in batches:
            for kind in kinds:
                path = os.path.join(tmp, f"{kind}_{b}.json")
                argv = runner_argv(b, kind, path)
                shown = [a if a != path else "FILE.json" for a in argv]
                print(f"--- {KIND_LABELS[kind]} x {counts[kind]} layers, batch {b}: python -m mla_ext.parallel "
                      + " ".join(shown), flush=True)
                try:
                    runner.main(argv)
                except (SystemExit, Exception) as e:  # verification failed in a rank, bad arguments, ...
                    print(f"mla-ext decode --cp: {KIND_LABELS[kind]} batch {b} failed: {e}", file=sys.stderr)
                    failed = True
                    continue
                with open(path) as f:
                    res = json.load(f)
                res.update(batch=b, kind=KIND_LABELS[kind], layers=counts[kind])
                rows.append(res)
    if rows:
        table = []
        for r in rows:
            ranks = r["ranks"]
            compute = max(x["decode_us"] + x["merge_us"] for x in ranks)
            comm = max(x["comm_us"] for x in ranks)
            step = max(x["step_us"] for x in ranks)
            table.append(dict(batch=r["batch"], kind=r["kind"], layers=r["layers"], compute_us=compute,
                              comm_us=comm, step_us=step, single_us=r["single_us"],
                              step_total_us=step * r["layers"], single_total_us=r["single_us"] * r["layers"],
                              check="ok" if r["ok"] else "FAILED"))
        print(f"context parallel over {args.cp} ranks, per layer kind (slowest rank) and per step of all its layers:")
        _print_table(table, list(table[0]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "decode", "model": args.model, "cp": args.cp, "runs": rows}, f, indent=2)
    return 1 if failed else 0


def cmd_decode(args) -> int:
    from tqdm import tqdm

    from . import bench
    from ._decode import DecodeWorkspace
    from .models import KIND_LABELS, get_model

    def usage(msg: str) -> int:
        print(f"mla-ext decode: error: {msg}", file=sys.stderr)
        return 2

    args.plot, err = _plot_path(args.plot)
    err = err or _check_device(args.device) or _check_out_paths(json=args.json, plot=args.plot)
    if err:
        return usage(err)
    gpu = args.device.startswith("cuda")
    try:
        model = get_model(args.model)
        heads = model.heads_per_gpu(args.tp)
        kinds = model.select(args.layers)
    except ValueError as e:
        return usage(str(e))
    kv_format = args.kv_format or model.default_kv_format()
    if kv_format not in model.kv_formats():
        return usage(f"--kv-format for {args.model} must be one of {model.kv_formats()}, got {kv_format!r}")
    batches = ([64] if gpu else [4]) if args.batch is None else args.batch
    context = (32768 if gpu else 4096) if args.context is None else args.context
    steps = (20 if gpu else 2) if args.steps is None else args.steps
    for flag, value, low in (("--batch", min(batches), 1), ("--context", context, 1),
                             ("--steps", steps, 1), ("--mtp", args.mtp, 0)):
        if value < low:
            return usage(f"{flag} must be >= {low}, got {value}")
    if context > MAX_CONTEXT:
        return usage(f"--context must be <= {MAX_CONTEXT} tokens (twice the longest context of the models here; "
                     f"the input builders hold a per-token array of that length), got {context}")
    err = _decode_size_error(max(batches) * (1 + args.mtp), heads)
    if err:
        return usage(f"--batch {max(batches)} x {1 + args.mtp} query tokens x {heads} heads: {err}")
    if context < 1 + args.mtp:
        print(f"mla-ext decode: --context {context} is below 1 + --mtp = {1 + args.mtp} query tokens per request; "
              f"each request gets {1 + args.mtp}", file=sys.stderr)
    if args.sets is not None and args.sets < 1:
        return usage("--sets must be >= 1")
    if args.cp < 1:
        return usage(f"--cp must be >= 1, got {args.cp}")
    if args.cp > 1:
        ignored = [f for f, v in (("--plot", args.plot), ("--sets", args.sets),
                                  ("--test-perturb", args.test_perturb)) if v is not None]
        if ignored:  # the context-parallel runner times one input set per rank and draws no chart
            return usage(f"{' and '.join(ignored)} cannot be combined with --cp {args.cp} "
                         "(the context-parallel run has no roofline chart and one input set per rank)")
        if gpu and torch.cuda.device_count() < args.cp:  # one GPU per rank
            return usage(f"--cp {args.cp} on {args.device} needs {args.cp} visible GPUs (one per rank), "
                         f"found {torch.cuda.device_count()}")
    perturb = args.test_perturb
    if perturb is not None and (perturb[0] not in kinds or not 0 <= perturb[1] < min(batches) * (1 + args.mtp)):
        return usage(f"--test-perturb {perturb[0]}:{perturb[1]}: needs a layer kind that runs ({', '.join(kinds)}) "
                     f"and a token below {min(batches) * (1 + args.mtp)}")
    plot_ok = args.plot is None or importlib.util.find_spec("matplotlib") is not None
    if not plot_ok:
        print(f"mla-ext decode: matplotlib is not installed, so --plot {args.plot} will not be written "
              "(pip install matplotlib); running the rest", file=sys.stderr)

    if args.cp > 1:
        return _decode_cp(args, model, heads, kinds, kv_format, batches, context, steps)

    counts = model.kind_counts()
    n_layers = sum(counts[k] for k in kinds)
    print(f"{model.describe()}; running {n_layers} layer(s): "
          + ", ".join(f"{counts[k]} {KIND_LABELS[k]}" for k in kinds))
    print(f"TP {args.tp}: {heads} heads per GPU; batch {','.join(map(str, batches))} x {1 + args.mtp} query "
          f"token(s); context ~{context} (per request {bench.context_range(context, args.mtp)[0]}.."
          f"{bench.context_range(context, args.mtp)[1]}); kv_format {kv_format}; "
          f"{_device_name(args.device)}", flush=True)

    bar = tqdm(total=len(batches) * (3 * len(kinds) + steps) + 2, desc="mla-ext decode", unit="step",
               disable=_bar_off(args), file=sys.stderr, leave=False)
    results = []
    try:
        bar.set_postfix_str("ceilings")
        copy_gbs = bench.copy_bandwidth_gbs(args.device, nbytes=(512 << 20) if gpu else (64 << 20))
        bar.update(1)
        mm_tflops = bench.matmul_tflops(args.device, n=8192 if gpu else 1024)
        bar.update(1)
        ws = DecodeWorkspace(max(batches) * (1 + args.mtp), heads, device=args.device)
        for i, b in enumerate(batches):
            results.append(bench.run_model_decode(
                model, batch=b, num_heads=heads, context_len=context, kinds=kinds, workspace=ws,
                device=args.device, mtp=args.mtp, kv_format=kv_format, steps=steps, copy_gbs=copy_gbs,
                mm_tflops=mm_tflops, sets=args.sets, seed=args.seed + i, progress=bar,
                perturb=perturb if i == 0 else None))
    except RuntimeError as e:
        if not _out_of_memory(e):
            raise
        bar.close()
        print(f"mla-ext decode: out of memory on {args.device} ({_first_line(e)}); use a smaller --batch or "
              "--context, or fewer input sets (--sets)", file=sys.stderr)
        return 4
    bar.close()

    mm_dtype = str(bench.matmul_dtype(args.device)).replace("torch.", "")
    print(f"ceilings (measured now): copy {copy_gbs:.0f} GB/s (read + write), {mm_dtype} matmul "
          f"{mm_tflops:.3g} TFLOP/s; workspace {ws.nbytes} bytes shared by every layer")
    print("per layer kind: µs per call (median" + (", CUDA-graph replay, L2-cold inputs)" if gpu else ")")
          + ", rows/call: KV rows gathered per call (mean over the kind's input sets), GB/s of KV bytes, TFLOP/s at 2·H·(d_qk+512) per row, % of the roofline "
          "max(bytes/copy, flops/matmul), µs per step = µs per call x layers")
    table = []
    for res in results:
        for r in res["rows"]:
            table.append({"B": r["batch"], "kind": KIND_LABELS[r["kind"]], "layers": r["layers"], "T": r["T"],
                          "H": r["H"], "rows/call": r["rows"], "KV MB": r["kv_MB"], "us": r["us"], "GB/s": r["GBps"],
                          "TFLOP/s": r["TFLOPs"], "roof us": r.get("roofline_us"), "% roof": r.get("pct_roofline"),
                          "bound": r.get("bound", ""), "us/step": r["step_us"],
                          "check": f"ok ({r['verified_rows']} rows)" if r["verify_ok"] else "FAILED"})
    columns = list(table[0])
    # 4 significant digits, but whole µs per step (".4g" put 15750 as 1.575e+04)
    _print_table(table, columns, floatfmt=[".0f" if c == "us/step" else ".4g" for c in columns])
    for res in results:
        print(f"batch {res['batch']}: attention per decode step {res['step_sum_us']:.1f} µs (sum over "
              f"{res['step_layers']} layers of µs per call x layers); measured step {res['step_measured_us']:.1f} µs "
              f"({res['step_layers']} calls in model order, median of {steps}); caches {res['cache_bytes'] / 1e9:.3g} GB")

    failures = [dict(f, batch=res["batch"]) for res in results for f in res["failures"]]
    per_kind = {k: dict(verified_rows=sum(r["verified_rows"] for res in results for r in res["rows"] if r["kind"] == k),
                        ok=all(r["verify_ok"] for res in results for r in res["rows"] if r["kind"] == k))
                for k in kinds}
    report = dict(command="decode", model=model.name, model_name=model.hf_name, num_layers=model.num_layers,
                  layer_counts=counts, compress_ratios=list(model.compress_ratios or []) or None,
                  topk=model.topk, tp=args.tp, num_heads=model.num_heads, heads_per_gpu=heads, context=context,
                  mtp=args.mtp, kv_format=kv_format, layers=args.layers, kinds=kinds, steps=steps,
                  device=args.device, device_name=_device_name(args.device),
                  ceilings=dict(copy_GBps=copy_gbs, matmul_TFLOPs=mm_tflops, matmul_dtype=mm_dtype),
                  workspace_bytes=ws.nbytes, batches=results,
                  verification=dict(ok=not failures, per_kind=per_kind), failures=failures)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    rc = 0
    if failures:
        print(f"FAILED verification: {len(failures)} row(s) off the float64 reference:", file=sys.stderr)
        for f in failures:
            ds_layers = model.layers_of(f["kind"])
            print(f"  batch {f['batch']}, {KIND_LABELS[f['kind']]} ({f['kind']}) input set {f['set']} "
                  f"({_fmt_layers(f['layers'])} of {len(ds_layers)}): token {f['token']} (request {f['request']}, "
                  f"query {f['query']}): {f['problem']}", file=sys.stderr)
        rc = 1
    if args.plot:
        if not plot_ok:
            print(f"mla-ext decode: --plot {args.plot} not written: matplotlib is not installed "
                  "(pip install matplotlib)", file=sys.stderr)
            rc = rc or 3
        else:
            try:
                bench.plot_decode_roofline(report, args.plot)
                print(f"roofline chart written to {args.plot}")
            except Exception as e:  # the report is complete; only the chart failed
                print(f"mla-ext decode: --plot {args.plot} not written: {_first_line(e)}", file=sys.stderr)
                rc = rc or 3
    return rc


def cmd_info(args) -> int:
    import mla_ext
    from ._load import _build_info

    info = _build_info()
    lines = [
        ("mla_ext version", mla_ext.__version__),
        ("library", mla_ext._LIBRARY_PATH),
        ("git commit", info.get("commit")),
        ("built against torch", info.get("torch_full_version")),
        ("running with torch", torch.__version__),
        ("stable ABI target", info.get("stable_abi_target")),
        ("CUDA (build)", info.get("cuda_version")),
        ("HIP (build)", info.get("hip_version")),
        ("GPU arch list", info.get("gpu_arch_list")),
        ("ops with GPU kernels", ", ".join(info.get("gpu_ops") or []) or "none (CPU-only build)"),
        ("GPU visible", torch.cuda.get_device_name() if torch.cuda.is_available() else "none"),
    ]
    for k, v in lines:
        print(f"{k:22s} {v}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mla-ext", description=__doc__.split("\nTest hook")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command")

    d = sub.add_parser("decode", help="the attention of one decode step of a DeepSeek model: verify and time it",
                       description="Run the sparse_mla_decode of every attention layer of a DeepSeek model for a\n"
                                   "few decode steps on realistic paged caches (one shared workspace, outputs\n"
                                   "written in place), verify sampled rows of every layer kind against the float64\n"
                                   "reference, and report µs, GB/s, TFLOP/s and % of the measured roofline per\n"
                                   "layer kind, plus the attention time of a whole step.",
                       epilog=DECODE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    from .models import LAYER_SELECTIONS, MODELS

    d.add_argument("--model", default="deepseek-v4-flash", choices=list(MODELS), help="default deepseek-v4-flash")
    d.add_argument("--tp", type=int, default=8, help="tensor-parallel size: heads per GPU = heads / tp (default 8)")
    d.add_argument("--batch", type=_int_list, default=None,
                   help="requests per step, comma list for several (default GPU 64, CPU 4)")
    d.add_argument("--context", type=int, default=None,
                   help=f"typical context length in tokens (default GPU 32768, CPU 4096; at most {MAX_CONTEXT})")
    d.add_argument("--mtp", type=int, default=0, help="speculative (MTP) query tokens per request (default 0)")
    d.add_argument("--kv-format", default=None,
                   choices=["fp8_ds_mla_v4", "fp8_ds_mla", "bf16", "fp8_ds_mla_v4_fnuz", "fp8_ds_mla_fnuz"],
                   help="cache format (default: the model's FP8 format; *_fnuz: e4m3fnuz values, "
                        "as gfx942 engines may write them)")
    d.add_argument("--cp", type=int, default=1,
                   help="context-parallel ranks: >1 spreads each layer kind's KV pages over N processes "
                        "(N GPUs with NCCL, or CPU processes with gloo, which split the cores, or OMP_NUM_THREADS "
                        "threads where set), verifies against single-device decode (one GPU, or one process on "
                        "all of them), times both and splits the "
                        "step time into compute and communication (default 1; no --plot or --sets)")
    d.add_argument("--device", default=_default_device(), help="cuda or cpu (default: cuda if present)")
    d.add_argument("--layers", default="all", choices=list(LAYER_SELECTIONS),
                   help="which layer kinds run (default all; dsa = V3.2)")
    d.add_argument("--steps", type=int, default=None, help="timed decode steps (default GPU 20, CPU 2)")
    d.add_argument("--sets", type=int, default=None,
                   help="input sets per layer kind (default: GPU enough that their selected rows span 256 MiB, "
                        "past the L2, fewer where their caches would pass a quarter of GPU memory; CPU 2)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--json", help="write the full report as JSON to this file")
    d.add_argument("--plot", help="write a roofline chart to this file (needs matplotlib; the suffix picks the "
                                  "format: .png, .pdf, .svg, ...; none: .png is appended)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar (none either way when stderr is not a terminal)")
    d.add_argument("--test-perturb", type=_parse_perturb, default=None, help=argparse.SUPPRESS)
    d.set_defaults(func=cmd_decode)

    m = sub.add_parser("merge", help="verify and time merge_attn_states on MLA chunked-prefill shapes",
                       description="Merge two partial attention results of MLA chunked prefill (the V part of\n"
                                   "[T, H, 192] or [T, H, 576] outputs, LSEs as .T views of vLLM's [H, T]\n"
                                   "buffers) straight into a layer-output view with merge_attn_states; verify\n"
                                   "against the float64 reference and time it (on a GPU beside a device copy of\n"
                                   "the same bytes). Exit status 0 ok, 1 verification failed, 2 bad arguments.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("--device", default=_default_device(), help="cuda or cpu (default: cuda if present)")
    m.add_argument("--num-tokens", type=_int_list, default=None,
                   help="comma list (default GPU 2048,8192; CPU 64,512)")
    m.add_argument("--num-heads", type=_int_list, default=None, help="comma list (default GPU 16,128; CPU 16)")
    m.add_argument("--head-size", type=int, default=128, help="V head size (default 128, MLA prefill)")
    m.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="value dtype (default bfloat16)")
    m.add_argument("--layout", default="strided", choices=["strided", "contiguous"],
                   help="strided: [..., :D] views of [T,H,192] into a layer-output buffer (default)")
    m.add_argument("--json", help="write results as JSON to this file")
    m.add_argument("--no-progress", action="store_true", help="no progress bar (none either way when stderr is not a terminal)")
    m.set_defaults(func=cmd_merge)

    i = sub.add_parser("info", help="print how this copy of mla_ext was built")
    i.set_defaults(func=cmd_info)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
