"""examples/engine_step.py, the README's engine calls on made-up tensors, runs and its results
match the float64 references (on the CPU, and on the GPU where there is one)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_engine_step_example(device):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "engine_step.py"), "--device", device],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "ok"
    assert lines[0].startswith("sparse_mla_decode (4 tokens x 8 heads") and "max error" in lines[0]
    assert lines[1].startswith("merge_attn_states") and "max error" in lines[1]
    assert lines[2] == "the same layer through mla_ext.compat.flashmla: bit-identical"


def test_engine_step_example_without_a_gpu():
    """--device cuda where torch sees no GPU: a one-line usage error (exit 2), not a traceback
    from the first .to('cuda')."""
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "engine_step.py"), "--device", "cuda"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "--device cuda: this torch sees no CUDA/ROCm device" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
