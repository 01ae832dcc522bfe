"""Shared test fixtures: devices (CPU always, CUDA when present), poisoning, tolerances."""
import os
import re
from typing import Optional

import pytest
import torch


def _worker_threads():
    """Under pytest-xdist, each worker's share of the cores (at least 1), else None. By default
    every worker's torch would use all cores for the float64 references: 16 workers x 16 threads
    on the 16-core GPU machine. An OMP_NUM_THREADS the user set is kept."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if os.environ.get("PYTEST_XDIST_WORKER") is None or not workers or "OMP_NUM_THREADS" in os.environ:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, int(workers)))


_THREADS = _worker_threads()
if _THREADS is not None:
    torch.set_num_threads(_THREADS)
    os.environ["OMP_NUM_THREADS"] = str(_THREADS)  # the tests' fresh-process children inherit it

HAS_GPU = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_GPU else [])

requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA/ROCm device")


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN (floats) or 0xFF bytes so unwritten elements are caught."""
    if t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(-1)
    return t


def make_merge_case(T, H, D, dtype, device, *, gen_seed=None, pad_to=None):
    """A merge's inputs on fresh random data: prefix / suffix values ``[T, H, D]`` of ``dtype``
    (``[..., :D]`` views of ``[T, H, pad_to]`` when given, as MLA's padded values) and float32
    ``[T, H]`` LSEs (N(0, 9)). ``gen_seed`` fixes them; by default each call draws new ones."""
    g = torch.Generator().manual_seed(gen_seed if gen_seed is not None else torch.seed() % 2**31)

    def vals():
        width = pad_to or D
        full = torch.randn(T, H, width, generator=g).to(dtype).to(device)
        return full[..., :D]

    pa, pb = vals(), vals()
    la = (torch.randn(T, H, generator=g) * 3).to(device)
    lb = (torch.randn(T, H, generator=g) * 3).to(device)
    return pa, la, pb, lb


# Max abs error allowed relative to max |reference|, by output dtype (inputs rounded to that dtype).
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def assert_close_rel(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "output",
                     magnitude: Optional[torch.Tensor] = None):
    """max |out - ref| within TOL[dtype] of max |ref|, or of max ``magnitude`` where given: for a
    weighted sum, the same sum of its terms' absolute values, which bounds its rounding error where
    the terms cancel and max |ref| does not (a 1 x 1 x 1 fp32 merge whose two terms nearly cancel:
    0.0006 out of ~1 failed at 2.5e-6 of |ref| with an error of ~1.5e-9)."""
    out = out.double().cpu()
    ref = ref.double().cpu()
    assert not torch.isnan(out).any(), f"{what}: NaN in result (unwritten or wrong)"
    base = ref if magnitude is None else magnitude.double().cpu()
    scale = base.abs().max().clamp_min(1e-30)
    err = (out - ref).abs().max() / scale
    against = "max |ref|" if magnitude is None else "the largest sum of the terms' magnitudes"
    assert err <= TOL[dtype], f"{what}: max error {err:.3g} (relative to {against}) > {TOL[dtype]}"


def e4m3_reference_table(fnuz: bool) -> torch.Tensor:
    """float64 [256]: the value of every e4m3 byte, from the bit fields (independent of torch's
    float8 types and of the library). e4m3fn (OCP): bias 7, S.1111.111 NaN, 0x80 = -0.
    e4m3fnuz: bias 8, 0x80 the only NaN, 0x7F / 0xFF = +-240, no infinities either way."""
    bias = 8 if fnuz else 7
    vals = []
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 0x7
        if (fnuz and b == 0x80) or (not fnuz and (b & 0x7F) == 0x7F):
            vals.append(float("nan"))
        elif e == 0:
            vals.append(sign * (m / 8.0) * 2.0 ** (1 - bias))
        else:
            vals.append(sign * (1.0 + m / 8.0) * 2.0 ** (e - bias))
    return torch.tensor(vals, dtype=torch.float64)


def assert_fake_refuses_like_op(op, cpu_args: dict, changes: dict, words: str) -> None:
    """`op` (a torch.ops overload) on CPU tensors and on meta copies of them (its fake kernel, what
    torch.compile traces with): the valid call passes on meta; with each argument in `changes`
    replaced by f(args), both refuse with a RuntimeError containing `words`."""
    meta = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in cpu_args.items()}
    op(*meta.values())
    for args in (cpu_args, meta):
        bad = dict(args)
        for k, f in changes.items():
            bad[k] = f(args)
        with pytest.raises(RuntimeError, match=re.escape(words)):
            op(*bad.values())


def ops_seen_by_function_mode(fn) -> list:
    """The functions a torch function mode sees while fn() runs (the wrappers call an overload's
    C++ callable in eager mode; a mode must still see the OpOverload)."""
    from torch.overrides import TorchFunctionMode

    seen = []

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Record():
        fn()
    return seen


def loaded_cuda_runtime():
    """The CUDA runtime library this process (torch, and the extension through it) has loaded, via
    ctypes; None when none is loaded (CPU builds, ROCm). For tests of the runtime's per-thread
    last-error slot, which the ops must neither blame on their launches nor clear."""
    import ctypes

    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libcudart.so" in line}
    if not paths:
        return None
    lib = ctypes.CDLL(sorted(paths)[0])
    lib.cudaGetErrorName.restype = ctypes.c_char_p
    return lib


def leave_runtime_error_pending(lib) -> int:
    """Make a runtime call fail (set an invalid device) so its error is pending, as a caller's
    unchecked failure would be; returns the error code (cudaPeekAtLastError reads it)."""
    err = lib.cudaSetDevice(1 << 20)
    assert err != 0 and lib.cudaPeekAtLastError() == err
    return err


_TEST_TIMES = os.environ.get("MLA_EXT_TEST_TIMES")


def pytest_runtest_logreport(report):
    """With the environment variable MLA_EXT_TEST_TIMES set to a path: one line per test phase
    (seconds, phase, outcome, test id), appended as each phase ends, so that a GPU run cut off by
    its time limit (the device calls' 600 s) still says which tests took the time. Written by the
    controlling process only (with pytest-xdist, workers' reports reach it as they finish)."""
    if not _TEST_TIMES or os.environ.get("PYTEST_XDIST_WORKER") is not None:
        return
    with open(_TEST_TIMES, "a") as f:
        f.write(f"{report.duration:8.2f} {report.when:8s} {report.outcome:8s} {report.nodeid}\n")
