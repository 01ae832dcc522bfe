"""The C API (csrc/capi) built for the CPU SIMT emulator (tests/simt/simt_emu.h), called on CPU
tensors through ctypes: the GPU launchers and the portable kernels an AMD GPU runs (64-lane
wavefronts), or NVIDIA's portable kernels (32-lane warps), executed without a GPU.

Used by tests/test_simt_emu.py. `library(warp)` builds the shared library once per source
state, build flags and compiler version (a hash names its folder, under a private folder of the
user's in the temporary directory) with the host C++ compiler (CXX, default g++).
"""
from __future__ import annotations

import ctypes as C
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
from typing import Optional

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "csrc" / "capi" / "mla_ext_capi.cu", ROOT / "csrc" / "capi" / "mla_ext_capi.h",
           *sorted((ROOT / "csrc" / "include" / "mla_ext").glob("*")),
           *sorted((ROOT / "tests" / "simt").rglob("*.[ch]*"))]
KV_FORMAT = {"bf16": 0, "fp8_ds_mla": 1, "fp8_ds_mla_v4": 2, "fp8_ds_mla_fnuz": 3, "fp8_ds_mla_v4_fnuz": 4}
DTYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def compiler() -> Optional[str]:
    return shutil.which(os.environ.get("CXX", "g++"))


# What each library is built from: the C API, or the emulator's own self-test kernels.
# (capi_probes.cpp: mla_ext_capi.cu and the tests' host-side probes, token_map below.)
TARGETS = {"capi": ROOT / "tests" / "simt" / "capi_probes.cpp", "selftest": ROOT / "tests" / "simt" / "selftest.cpp"}


# MLA_EXT_SIMT_ASAN=1: the libraries are built with AddressSanitizer (the process must preload
# libasan: asan_runtime()), so that a kernel's read or write outside the caller's tensors stops
# the process with a report (a CPU stand-in for compute-sanitizer's memcheck).
ASAN = os.environ.get("MLA_EXT_SIMT_ASAN") == "1"


def asan_runtime() -> Optional[str]:
    """The compiler's AddressSanitizer runtime (for LD_PRELOAD), None where it has none."""
    if compiler() is None:
        return None
    r = subprocess.run([compiler(), "-print-file-name=libasan.so"], capture_output=True, text=True)
    path = r.stdout.strip()
    return path if r.returncode == 0 and os.path.isabs(path) and os.path.exists(path) else None


def build_command(warp: int, source: pathlib.Path, out: pathlib.Path) -> list:
    flags = ["-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer"] if ASAN else ["-O2"]
    # -fno-gnu-unique: the function-local statics (__shared__ arrays, the emulator's state) of
    # each library stay its own; as GNU unique symbols the dynamic linker would share them
    # between the warp-32 and warp-64 builds (and their sizes differ).
    return [compiler(), "-std=c++17", *flags, "-fno-gnu-unique", "-fPIC", "-shared", "-x", "c++",
            "-D__HIP_PLATFORM_AMD__", "-DMLA_EXT_SIMT_EMU", f"-DMLA_EXT_SIMT_WARP={warp}",
            f"-I{ROOT / 'tests' / 'simt'}", f"-I{ROOT / 'csrc' / 'include'}", f"-I{ROOT / 'csrc' / 'capi'}",
            str(source), "-o", str(out)]


_LIBS = {}


def _build(warp: int, target: str) -> C.CDLL:
    h = hashlib.sha256()
    for p in SOURCES:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    h.update(" ".join(build_command(warp, TARGETS[target], pathlib.Path("x"))[:-1]).encode())
    h.update(_compiler_version().encode())
    # One folder per user (mode 0700: another user cannot plant a library there), one
    # subfolder per source state.
    top = pathlib.Path(tempfile.gettempdir()) / f"mla_ext_simt-{os.getuid()}"
    top.mkdir(mode=0o700, exist_ok=True)
    if top.stat().st_uid != os.getuid() or top.stat().st_mode & 0o077:
        raise RuntimeError(f"{top} is not a private folder of this user; remove it")
    folder = top / h.hexdigest()[:12]
    folder.mkdir(exist_ok=True)
    so = folder / f"lib{target}_warp{warp}.so"
    if not so.exists():
        tmp = folder / f".{so.name}.{os.getpid()}"
        r = subprocess.run(build_command(warp, TARGETS[target], tmp), capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"building {TARGETS[target].name} for the SIMT emulator failed:\n{r.stderr[-4000:]}")
        os.replace(tmp, so)
    lib = C.CDLL(str(so))
    lib.mla_ext_simt_last_error.restype = C.c_char_p
    lib.mla_ext_simt_configure.argtypes = [C.c_int, C.c_uint, C.c_int]
    assert lib.mla_ext_simt_warp_size() == warp
    return lib


def _compiler_version() -> str:
    r = subprocess.run([compiler(), "--version"], capture_output=True, text=True)
    return r.stdout


def selftest_library(warp: int) -> C.CDLL:
    """tests/simt/selftest.cpp's kernels on the emulator, built if needed."""
    key = ("selftest", warp)
    if key not in _LIBS:
        _LIBS[key] = _build(warp, "selftest")
    return _LIBS[key]


def library(warp: int) -> C.CDLL:
    """The emulated C API for `warp`-lane warps (32 or 64), built if needed."""
    if warp in _LIBS:
        return _LIBS[warp]
    lib = _build(warp, "capi")
    lib.mla_ext_status_string.restype = C.c_char_p
    lib.mla_ext_sparse_mla_decode_workspace_size_for.restype = C.c_size_t
    lib.mla_ext_sparse_mla_decode_workspace_size_for.argtypes = [C.c_longlong, C.c_longlong, C.c_int, C.c_int]
    lib.mla_ext_sparse_mla_decode_num_splits.argtypes = [C.c_longlong, C.c_longlong, C.c_longlong, C.c_int]
    lib.mla_ext_sparse_mla_decode_num_splits_for.argtypes = [C.c_void_p, C.c_int]
    assert lib.mla_ext_sparse_decode_params_size() == C.sizeof(DecodeParams)
    assert lib.mla_ext_merge_params_size() == C.sizeof(MergeParams)
    assert lib.mla_ext_merge_n_params_size() == C.sizeof(MergeNParams)
    _LIBS[warp] = lib
    return lib


class KvSet(C.Structure):
    _fields_ = [("cache", C.c_void_p), ("page_stride_bytes", C.c_int64), ("token_stride_bytes", C.c_int64),
                ("page_size", C.c_int64), ("num_slots", C.c_int64), ("indices", C.c_void_p),
                ("indices_stride_token", C.c_int64), ("width", C.c_int64), ("lengths", C.c_void_p),
                ("lengths_stride", C.c_int64)]


class DecodeParams(C.Structure):
    _fields_ = [("kv_format", C.c_int32), ("d_qk", C.c_int32), ("num_tokens", C.c_int64), ("num_heads", C.c_int64),
                ("softmax_scale", C.c_float), ("q", C.c_void_p), ("q_stride_token", C.c_int64),
                ("q_stride_head", C.c_int64), ("main", KvSet), ("extra", KvSet), ("attn_sink", C.c_void_p),
                ("attn_sink_stride", C.c_int64), ("output", C.c_void_p), ("output_stride_token", C.c_int64),
                ("output_stride_head", C.c_int64), ("lse", C.c_void_p), ("lse_stride_token", C.c_int64),
                ("lse_stride_head", C.c_int64), ("num_splits", C.c_int32), ("force_portable", C.c_uint8),
                ("head_tile", C.c_int32), ("smem_limit", C.c_int64)]


class MergeParams(C.Structure):
    _fields_ = [("dtype", C.c_int32), ("num_tokens", C.c_int64), ("num_heads", C.c_int64), ("head_size", C.c_int64),
                ("output", C.c_void_p), ("output_stride_token", C.c_int64), ("output_stride_head", C.c_int64),
                ("output_lse", C.c_void_p), ("output_lse_stride_token", C.c_int64),
                ("output_lse_stride_head", C.c_int64),
                ("prefix_output", C.c_void_p), ("prefix_stride_token", C.c_int64), ("prefix_stride_head", C.c_int64),
                ("prefix_lse", C.c_void_p), ("prefix_lse_stride_token", C.c_int64),
                ("prefix_lse_stride_head", C.c_int64),
                ("suffix_output", C.c_void_p), ("suffix_stride_token", C.c_int64), ("suffix_stride_head", C.c_int64),
                ("suffix_lse", C.c_void_p), ("suffix_lse_stride_token", C.c_int64),
                ("suffix_lse_stride_head", C.c_int64),
                ("output_kind", C.c_int32), ("has_prefill_tokens_with_context", C.c_int32),
                ("prefill_tokens_with_context", C.c_int64), ("output_scale", C.c_void_p)]


class MergeNParams(C.Structure):
    _fields_ = [("dtype", C.c_int32), ("num_states", C.c_int64), ("num_tokens", C.c_int64),
                ("num_heads", C.c_int64), ("head_size", C.c_int64),
                ("output", C.c_void_p), ("output_stride_token", C.c_int64), ("output_stride_head", C.c_int64),
                ("output_lse", C.c_void_p), ("output_lse_stride_token", C.c_int64),
                ("output_lse_stride_head", C.c_int64),
                ("values", C.c_void_p), ("values_stride_state", C.c_int64), ("values_stride_token", C.c_int64),
                ("values_stride_head", C.c_int64),
                ("lses", C.c_void_p), ("lses_stride_state", C.c_int64), ("lses_stride_token", C.c_int64),
                ("lses_stride_head", C.c_int64), ("attn_sink", C.c_void_p), ("attn_sink_stride", C.c_int64)]


def _ptr(t: Optional[torch.Tensor]):
    return None if t is None else t.data_ptr()


class SimtError(RuntimeError):
    pass


def _status(lib, rc: int, what: str) -> None:
    if rc != 0:
        raise SimtError(f"{what}: {lib.mla_ext_status_string(rc).decode()} "
                        f"({lib.mla_ext_simt_last_error().decode()})")


def configure(lib, order: int = 0, seed: int = 1, num_cus: int = 8) -> None:
    """Thread / block order (0 forward, 1 reversed, 2 threads shuffled by seed) and the CU count."""
    lib.mla_ext_simt_configure(order, seed, num_cus)


def counters(lib) -> dict:
    c = (C.c_ulonglong * 5)()
    lib.mla_ext_simt_counters(c)
    return dict(zip(("launches", "blocks", "switches", "warp_collectives", "barriers"), c))


def kernels(lib) -> dict:
    """{kernel signature (template arguments included): launches} since the library was loaded."""
    lib.mla_ext_simt_kernels.restype = C.c_size_t
    n = lib.mla_ext_simt_kernels(None, 0)
    buf = C.create_string_buffer(n)
    lib.mla_ext_simt_kernels(buf, n)
    out = {}
    for line in buf.value.decode().splitlines():
        count, sig = line.split(" ", 1)
        out[sig] = int(count)
    return out


def _kv_set(cache: torch.Tensor, fmt: str, indices: torch.Tensor, lengths: Optional[torch.Tensor]) -> KvSet:
    c = cache if cache.dim() == 3 else cache.reshape(cache.shape[0], cache.shape[1], -1)
    es = c.element_size()
    s = KvSet()
    s.cache = c.data_ptr()
    s.page_stride_bytes = c.stride(0) * es
    s.token_stride_bytes = c.stride(1) * es
    s.page_size = c.shape[1]
    s.num_slots = c.shape[0] * c.shape[1]
    s.indices = indices.data_ptr()
    s.indices_stride_token = indices.stride(0)
    s.width = indices.shape[1]
    s.lengths = _ptr(lengths)
    s.lengths_stride = 0 if lengths is None else lengths.stride(0)
    return s


def decode_workspace_bytes(lib, T: int, H: int, num_splits: int, num_cus: int) -> int:
    return int(lib.mla_ext_sparse_mla_decode_workspace_size_for(T, H, num_splits, num_cus))


def _decode_params(q, kv_cache, indices, kv_format, softmax_scale, output, *, lengths=None, extra_kv_cache=None,
                   extra_indices=None, extra_lengths=None, attn_sink=None, lse=None, num_splits=0,
                   head_tile=0) -> DecodeParams:
    p = DecodeParams()
    p.kv_format = KV_FORMAT[kv_format]
    p.d_qk = q.shape[2]
    p.num_tokens, p.num_heads = q.shape[0], q.shape[1]
    p.softmax_scale = softmax_scale
    p.q, p.q_stride_token, p.q_stride_head = q.data_ptr(), q.stride(0), q.stride(1)
    p.main = _kv_set(kv_cache, kv_format, indices, lengths)
    if extra_kv_cache is not None:
        p.extra = _kv_set(extra_kv_cache, kv_format, extra_indices, extra_lengths)
    p.attn_sink = _ptr(attn_sink)
    p.attn_sink_stride = 0 if attn_sink is None else attn_sink.stride(0)
    p.output, p.output_stride_token, p.output_stride_head = output.data_ptr(), output.stride(0), output.stride(1)
    if lse is not None:
        p.lse, p.lse_stride_token, p.lse_stride_head = lse.data_ptr(), lse.stride(0), lse.stride(1)
    p.num_splits = num_splits
    p.head_tile = head_tile
    return p


def sparse_mla_decode(lib, *, workspace, num_cus=8, **args) -> None:
    """mla_ext_sparse_mla_decode on CPU tensors (the torch op's argument names and layouts)."""
    p = _decode_params(**args)
    ws_bytes = workspace.numel() if workspace is not None else 0
    rc = lib.mla_ext_sparse_mla_decode(C.byref(p), C.c_void_p(_ptr(workspace)), C.c_size_t(ws_bytes), num_cus, None)
    _status(lib, rc, "mla_ext_sparse_mla_decode")


def num_splits_for(lib, *, num_cus=8, **args) -> int:
    """mla_ext_sparse_mla_decode_num_splits_for of the call `args` (sparse_mla_decode's
    arguments, workspace and num_cus aside) on num_cus processors."""
    p = _decode_params(**args)
    return int(lib.mla_ext_sparse_mla_decode_num_splits_for(C.byref(p), num_cus))


def token_map(lib, workspace: torch.Tensor, *, num_cus=8, **args):
    """(the token map the decode of `args` left in `workspace`, the host's map): two [T, 2]
    int64 tensors of {first cell, cell count} per token (tests/simt/capi_probes.cpp), or None
    where the call runs no token map (one split, or not the balanced map)."""
    p = _decode_params(**args)
    T = p.num_tokens
    host = torch.zeros(T, 2, dtype=torch.int32)
    offset = C.c_longlong(0)
    rc = lib.mla_ext_simt_token_map(C.byref(p), num_cus, C.c_void_p(host.data_ptr()), C.byref(offset))
    assert rc >= 0, "mla_ext_simt_token_map refused the arguments"
    if rc == 1:
        return None
    kernel = workspace[offset.value:offset.value + 8 * T].view(torch.int32).view(T, 2)
    # (uint32 fields, all below 2^31)
    return kernel.to(torch.int64), host.to(torch.int64)


FP8_OUTPUT = {torch.float8_e4m3fn: 1, torch.float8_e4m3fnuz: 2}


def merge_attn_states(lib, output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, *,
                      output_scale=None, prefill_tokens_with_context=None) -> None:
    """mla_ext_merge_attn_states on CPU tensors ([T, H, D] values, [T, H] fp32 LSEs, any strides;
    an FP8 output takes a one-element fp32 output_scale)."""
    p = MergeParams()
    p.dtype = DTYPE[prefix_output.dtype]
    p.output_kind = FP8_OUTPUT.get(output.dtype, 0)
    p.output_scale = _ptr(output_scale)
    if prefill_tokens_with_context is not None:
        p.has_prefill_tokens_with_context = 1
        p.prefill_tokens_with_context = prefill_tokens_with_context
    p.num_tokens, p.num_heads, p.head_size = output.shape
    p.output, p.output_stride_token, p.output_stride_head = output.data_ptr(), output.stride(0), output.stride(1)
    if output_lse is not None:
        p.output_lse = output_lse.data_ptr()
        p.output_lse_stride_token, p.output_lse_stride_head = output_lse.stride()
    p.prefix_output, p.prefix_stride_token, p.prefix_stride_head = (
        prefix_output.data_ptr(), prefix_output.stride(0), prefix_output.stride(1))
    p.prefix_lse = prefix_lse.data_ptr()
    p.prefix_lse_stride_token, p.prefix_lse_stride_head = prefix_lse.stride()
    p.suffix_output, p.suffix_stride_token, p.suffix_stride_head = (
        suffix_output.data_ptr(), suffix_output.stride(0), suffix_output.stride(1))
    p.suffix_lse = suffix_lse.data_ptr()
    p.suffix_lse_stride_token, p.suffix_lse_stride_head = suffix_lse.stride()
    _status(lib, lib.mla_ext_merge_attn_states(C.byref(p), 0, None), "mla_ext_merge_attn_states")


def merge_attn_states_n(lib, output, output_lse, values, lses, attn_sink=None) -> None:
    """mla_ext_merge_attn_states_n on CPU tensors ([S, T, H, D] values, [S, T, H] fp32 LSEs)."""
    p = MergeNParams()
    p.dtype = DTYPE[output.dtype]
    p.num_states = values.shape[0]
    p.num_tokens, p.num_heads, p.head_size = output.shape
    p.output, p.output_stride_token, p.output_stride_head = output.data_ptr(), output.stride(0), output.stride(1)
    if output_lse is not None:
        p.output_lse = output_lse.data_ptr()
        p.output_lse_stride_token, p.output_lse_stride_head = output_lse.stride()
    p.values = values.data_ptr()
    p.values_stride_state, p.values_stride_token, p.values_stride_head = values.stride()[:3]
    p.lses = lses.data_ptr()
    p.lses_stride_state, p.lses_stride_token, p.lses_stride_head = lses.stride()
    p.attn_sink = _ptr(attn_sink)
    p.attn_sink_stride = 0 if attn_sink is None else attn_sink.stride(0)
    _status(lib, lib.mla_ext_merge_attn_states_n(C.byref(p), 0, None), "mla_ext_merge_attn_states_n")
