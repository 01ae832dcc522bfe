"""One decode shape, called a few times, for Nsight Compute.

Usage (GPU machine):
  ncu --clock-control none -k regex:decode_split --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      python3 tests/gpu_dev/profile_decode.py v4_c4 16 64
Arguments: layer kind (v4_swa, v4_c4, v4_c128, v32), num_heads, num_tokens[, context_len
[, num_splits]] (context default: drawn from [24576, 40960]; the benchmark's C128 layer uses
1048576, 8192 compressed rows; num_splits default 0, the automatic count).
"""
import sys

import torch

import mla_ext
from mla_ext.builders import build_decode_inputs

kind, heads, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ctx = int(sys.argv[4]) if len(sys.argv) > 4 else (24576, 40960)
splits = int(sys.argv[5]) if len(sys.argv) > 5 else 0
inp = build_decode_inputs(kind, batch=tokens, num_heads=heads, context_len=ctx, device="cuda")
out = torch.empty(tokens, heads, 512, dtype=torch.bfloat16, device="cuda")
ws = mla_ext.DecodeWorkspace(tokens, heads, num_splits=splits, device="cuda")
for _ in range(4):
    mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, inp.indices, output=out, workspace=ws.tensor, num_splits=splits,
                             **inp.op_kwargs())
torch.cuda.synchronize()
print(kind, heads, tokens, splits, "ok")
