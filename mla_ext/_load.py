"""Loads the compiled extension and registers its ops with torch.ops.mla_ext."""
from __future__ import annotations

import glob
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))


def _build_info() -> dict:
    try:
        from ._build_info import BUILD_INFO
    except ImportError:
        return {}
    return dict(BUILD_INFO)


def load_extension() -> str:
    """Load ``mla_ext/_C*.so`` into the process; returns its path.

    Raises ImportError naming the torch found and the torch the extension was
    built for, with the fix, when the library is missing or fails to load.
    """
    candidates = sorted(glob.glob(os.path.join(_HERE, "_C*.so")) + glob.glob(os.path.join(_HERE, "_C*.pyd")))
    info = _build_info()
    built_for = info.get("torch_full_version", "unknown")
    if not candidates:
        raise ImportError(
            "mla_ext: the compiled extension (mla_ext/_C*.so) was not found next to "
            f"{_HERE}. Build it with `make setup` (or `pip install --no-build-isolation -e .`) "
            f"for the installed torch {torch.__version__}.")
    path = candidates[0]
    try:
        torch.ops.load_library(path)
    except OSError as exc:
        raise ImportError(
            f"mla_ext: failed to load {path}: {exc}. The installed torch is {torch.__version__}; "
            f"this extension was built against torch {built_for} "
            f"(CUDA {info.get('cuda_version')}, HIP {info.get('hip_version')}, GPU archs "
            f"{info.get('gpu_arch_list')}) on the stable ABI, which needs torch >= 2.10 and, for a GPU "
            "build, a torch of the same kind (a CUDA N.x build needs a CUDA N.x torch; a CPU build "
            "takes any). Fix: install such a torch, or rebuild for this environment: `make setup` in a "
            "checkout (`pip install --no-build-isolation --force-reinstall -e .`), or "
            "`pip install --no-build-isolation <the source archive>`.") from exc
    return path
