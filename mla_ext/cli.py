"""The ``mla-ext`` command.

Sub-commands:
- ``mla-ext merge``: merge_attn_states on MLA chunked-prefill shapes (padded V views merged
  straight into a layer-output buffer), verified against the float64 reference and timed; on a
  GPU side by side with a device-to-device copy of the same bytes.
- ``mla-ext info``: how this copy was built and what it runs with.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _int_list(text: str):
    return [int(x) for x in text.split(",") if x]


def _print_table(rows, columns, floatfmt=".5g"):
    from tabulate import tabulate

    table = [[r.get(c, "") for c in columns] for r in rows]
    print(tabulate(table, headers=columns, floatfmt=floatfmt))


def cmd_merge(args) -> int:
    from tqdm import tqdm

    from .bench import measure_merge

    gpu = args.device.startswith("cuda")
    tokens = args.num_tokens or ([2048, 8192] if gpu else [64, 512])
    heads = args.num_heads or ([16, 128] if gpu else [16])
    dtype = getattr(torch, args.dtype)
    shapes = [(t, h) for t in tokens for h in heads]
    rows = []
    for t, h in tqdm(shapes, desc="merge_attn_states", disable=args.no_progress):
        rows.append(measure_merge(t, h, args.head_size, dtype=dtype, device=args.device,
                                  layout=args.layout, with_copy=gpu))
    bad = [r for r in rows if not (r["max_rel_err"] <= 2e-2)]
    cols = ["T", "H", "D", "dtype", "layout", "bytes", "us", "GB/s", "max_rel_err"]
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
              + ", ".join(f"(T={r['T']}, H={r['H']}): err {r['max_rel_err']:.3g}" for r in bad),
              file=sys.stderr)
        return 1
    return 0


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
    p = argparse.ArgumentParser(prog="mla-ext", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command")

    m = sub.add_parser("merge", help="verify and time merge_attn_states on MLA chunked-prefill shapes")
    m.add_argument("--device", default=_default_device(), help="cuda or cpu (default: cuda if present)")
    m.add_argument("--num-tokens", type=_int_list, default=None,
                   help="comma list (default GPU 2048,8192; CPU 64,512)")
    m.add_argument("--num-heads", type=_int_list, default=None, help="comma list (default GPU 16,128; CPU 16)")
    m.add_argument("--head-size", type=int, default=128, help="V head size (default 128, MLA prefill)")
    m.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    m.add_argument("--layout", default="strided", choices=["strided", "contiguous"],
                   help="strided: [..., :D] views of [T,H,192] into a layer-output buffer (default)")
    m.add_argument("--json", help="write results as JSON to this file")
    m.add_argument("--no-progress", action="store_true", help="no progress bar")
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
