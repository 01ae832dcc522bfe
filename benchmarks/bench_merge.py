"""merge_attn_states benchmark (GPU): the op side by side with a device-to-device copy of the
same bytes, measured in the same run.

Method (mla_ext.bench): CUDA-graph replay, inputs rotated through >= 256 MiB so L2 does not
serve them, median of the replays. Bytes = two value reads + one write + LSE traffic.
Layouts: contiguous [T, H, D]; strided = values [..., :D] of [T, H, 192] (D = 128) or
[T, H, D + 64] (D = 512), output a [T, H, D] view at a token offset of a [T + 8, H * D] buffer,
LSEs as .T views of [H, T]. Also the host time of a plain eager call (no graph), next to\nan eager torch.add(out=) on the same machine.

Usage: python benchmarks/bench_merge.py [--json FILE]
"""
import argparse
import json

import torch
from tabulate import tabulate

from mla_ext.bench import require_gpu, copy_bandwidth_gbs, host_overhead_us, measure_merge, time_graph

SHAPES = [(1, 128, 512), (64, 128, 512), (256, 16, 512), (4096, 128, 128), (8192, 128, 128),
          (16384, 16, 128)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    args = ap.parse_args()
    require_gpu("bench_merge.py")
    bw = copy_bandwidth_gbs(nbytes=512 << 20)
    # The smallest a kernel node costs under the same timing: 64 one-element fill kernels.
    tiny = [torch.empty(1, device="cuda") for _ in range(64)]
    floor_us = time_graph([lambda x=x: x.fill_(1.0) for x in tiny])
    # Host-time reference on this machine: an eager torch.add(out=) of three small tensors.
    a, b, c = (torch.randn(64, device="cuda") for _ in range(3))
    add_host_us = host_overhead_us(lambda: torch.add(a, b, out=c))
    rows = []
    for layout in ("contiguous", "strided"):
        for T, H, D in SHAPES:
            rows.append(measure_merge(T, H, D, layout=layout, host=(layout == "contiguous" and T == 1)))
    cols = ["layout", "T", "H", "D", "bytes", "us", "copy_us", "pct_copy", "GB/s", "max_rel_err", "max_lse_err", "host_us"]
    print(f"\nmerge_attn_states, bf16, {torch.cuda.get_device_name()}, copy bandwidth {bw:.0f} GB/s "
          f"(512 MiB, read+write); one-element fill kernel {floor_us:.2f} us per node; "
          f"host time of an eager torch.add(out=) {add_host_us:.2f} us")
    print(tabulate([[r.get(c, "") for c in cols] for r in rows], headers=cols, floatfmt=".5g"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_GBps": bw, "kernel_floor_us": floor_us, "torch_add_host_us": add_host_us, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
