"""Developer probe: does raising an argument error from each op crash the process on this torch?

Each case runs in its own subprocess; prints the case, the exit code and the last line.
"""
import subprocess
import sys

CASES = {
    "ws_size_negative": "torch.ops.mla_ext.sparse_mla_decode_workspace_size(-1, 1, 0, -1)",
    "merge_cpu_dtype": "a=torch.randn(2,3,4); mla_ext.merge_attn_states(a,None,a,torch.randn(2,3),a.half(),torch.randn(2,3))",
    "merge_cpu_ok": "a=torch.randn(2,3,4); mla_ext.merge_attn_states(a,None,a,torch.randn(2,3),a,torch.randn(2,3)); print('ran')",
    "merge_cuda_dtype": "a=torch.randn(2,3,4,device='cuda'); l=torch.randn(2,3,device='cuda'); mla_ext.merge_attn_states(a,None,a,l,a.half(),l)",
    "merge_cuda_shape": "a=torch.randn(2,3,4,device='cuda'); l=torch.randn(2,3,device='cuda'); mla_ext.merge_attn_states(a,None,a,l,a[:, :2],l)",
    "merge_cuda_ok": "a=torch.randn(2,3,4,device='cuda'); l=torch.randn(2,3,device='cuda'); mla_ext.merge_attn_states(a,None,a,l,a,l); torch.cuda.synchronize(); print('ran')",
}

for name, body in CASES.items():
    code = ("import faulthandler; faulthandler.enable(); import torch, mla_ext\n"
            f"try:\n    {body}\nexcept RuntimeError as e:\n    print('RuntimeError:', str(e)[:120])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    last = (r.stdout.strip().splitlines() or r.stderr.strip().splitlines() or [""])[-1]
    print(f"{name:20s} rc={r.returncode:4d} {last[:150]}")
