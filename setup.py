"""Build of the mla_ext torch extension (torch.utils.cpp_extension).

One extension, ``mla_ext._C``, written against the LibTorch stable ABI
(TORCH_TARGET_VERSION 2.10), so one build serves every torch >= 2.10:
- a CUDA extension when the installed torch has CUDA and nvcc is found;
- the same sources hipified by torch when the installed torch is a ROCm build;
- a CPU-only extension otherwise (every machine gets a working package).

Environment:
- MLA_EXT_FORCE_CPU=1      build the CPU-only extension even if CUDA is present.
- MLA_EXT_REQUIRE_GPU=1    fail instead of building the CPU-only extension when the GPU one
                           cannot be built (a CUDA / ROCm wheel job that must not ship a CPU one).
- TORCH_CUDA_ARCH_LIST     CUDA archs (default below); PYTORCH_ROCM_ARCH for ROCm.
- MAX_JOBS                 parallel compile jobs (honoured by torch's ninja build).
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import setuptools
from setuptools import setup

ROOT = Path(__file__).resolve().parent

# Default GPU targets: Ampere, Hopper with its arch-specific instructions (wgmma,
# setmaxnreg: compiled only for 9.0a), and PTX for newer GPUs.
DEFAULT_CUDA_ARCH_LIST = "8.0;9.0a;10.0+PTX"
DEFAULT_ROCM_ARCH = "gfx942;gfx950"
STABLE_ABI_TARGET = "0x020a000000000000"  # torch 2.10
LICENSE = "Apache-2.0"  # SPDX



def read_sources():
    """Groups of csrc/sources.txt (shared with CMakeLists.txt)."""
    groups = {"include": [], "cpu": [], "gpu": []}
    for line in (ROOT / "csrc" / "sources.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            group, path = line.split()
            if group in groups:  # other groups (public, capi) are CMake's
                groups[group].append(path)
    return groups


def license_metadata():
    """The SPDX license as this setuptools takes it (pyproject.toml declares it dynamic):
    license_expression (PEP 639) on setuptools >= 77, the older License field before."""
    try:
        major = int(setuptools.__version__.split(".")[0])
    except ValueError:
        major = 0
    return {"license_expression": LICENSE} if major >= 77 else {"license": LICENSE}


def git_commit():
    """This checkout's commit; "unknown" outside one (an unpacked sdist, also one unpacked inside
    another project's repository, whose commit is not this source's)."""
    try:
        run = lambda *a: subprocess.check_output(["git", *a], cwd=ROOT, stderr=subprocess.DEVNULL, text=True).strip()
        if Path(run("rev-parse", "--show-toplevel")).resolve() != ROOT:
            return "unknown"
        return run("rev-parse", "--short=12", "HEAD")
    except Exception:
        return "unknown"


def nvcc_version(cuda_home):
    """(major, minor) of the nvcc under cuda_home, or None when it cannot be run or read."""
    try:
        out = subprocess.check_output([os.path.join(cuda_home, "bin", "nvcc"), "--version"],
                                      stderr=subprocess.STDOUT, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def default_cuda_arch_list(nvcc):
    """DEFAULT_CUDA_ARCH_LIST without the targets this nvcc cannot compile (sm_100 needs
    CUDA >= 12.8). The PTX for newer GPUs then goes with 8.0: PTX of an arch-specific target
    (compute_90a) runs on compute capability 9.0 only, so "9.0a+PTX" would leave Blackwell with
    no kernel image."""
    if nvcc is not None and nvcc < (12, 8):
        return "8.0+PTX;9.0a"
    return DEFAULT_CUDA_ARCH_LIST


def isolated_build_env(torch) -> bool:
    """Whether torch comes from a build front end's temporary environment (pip's build isolation,
    `python -m build` without --no-isolation), i.e. not from the environment that will import
    the extension."""
    where = os.path.dirname(os.path.abspath(torch.__file__))
    return any(tag in where for tag in ("pip-build-env-", f"{os.sep}build-env-"))


def main():
    os.chdir(ROOT)  # source paths are relative to the repository root
    import torch
    from torch.utils import cpp_extension

    is_rocm = torch.version.hip is not None
    want_gpu = os.environ.get("MLA_EXT_FORCE_CPU", "0") != "1"
    has_gpu_toolchain = (cpp_extension.ROCM_HOME if is_rocm else cpp_extension.CUDA_HOME) is not None
    build_gpu = want_gpu and (torch.version.cuda is not None or is_rocm) and has_gpu_toolchain
    if not build_gpu:
        why = ("MLA_EXT_FORCE_CPU=1" if not want_gpu else
               f"torch {torch.__version__} is a CPU build" if torch.version.cuda is None and not is_rocm else
               "no ROCm toolkit found (ROCM_HOME)" if is_rocm else
               "no CUDA toolkit found (set CUDA_HOME to the folder holding bin/nvcc)")
        if os.environ.get("MLA_EXT_REQUIRE_GPU", "0") == "1":
            raise SystemExit(f"mla_ext: MLA_EXT_REQUIRE_GPU=1 but the GPU extension cannot be built: {why}")
    variant = ("CPU-only (" + why + ")" if not build_gpu else
               f"ROCm {torch.version.hip}" if is_rocm else f"CUDA {torch.version.cuda}")
    print(f"mla_ext: building the {variant} extension against torch {torch.__version__}", file=sys.stderr)
    if isolated_build_env(torch):
        print(f"mla_ext: WARNING: this torch ({torch.__version__}, {os.path.dirname(torch.__file__)}) is the build "
              "front end's isolated environment's, not the one that will import the extension: a CUDA build "
              "loads only with a torch of the same CUDA major version, a CPU build with any. To build against "
              "the installed torch, install with --no-build-isolation (pip) or --no-isolation (python -m build).",
              file=sys.stderr)

    if build_gpu and not is_rocm:
        nvcc = nvcc_version(cpp_extension.CUDA_HOME)
        torch_cuda = tuple(int(x) for x in torch.version.cuda.split(".")[:2])
        if nvcc is not None and nvcc[0] != torch_cuda[0]:
            # torch's extension build refuses a toolkit of another major version, deep inside a
            # traceback that ends with an unrelated setuptools hint; say it here in one line.
            raise SystemExit(
                f"mla_ext: the CUDA toolkit at {cpp_extension.CUDA_HOME} is CUDA {nvcc[0]}.{nvcc[1]}, but torch "
                f"{torch.__version__} was built with CUDA {torch.version.cuda}; torch builds extensions only with "
                f"a toolkit of the same major version. Set CUDA_HOME to a CUDA {torch_cuda[0]}.x toolkit, install "
                f"a torch built for CUDA {nvcc[0]}, or set MLA_EXT_FORCE_CPU=1 for the CPU-only extension.")
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", default_cuda_arch_list(nvcc))
    if build_gpu and is_rocm:
        os.environ.setdefault("PYTORCH_ROCM_ARCH", DEFAULT_ROCM_ARCH)

    common = ["-O3", "-std=c++17", f"-DTORCH_TARGET_VERSION={STABLE_ABI_TARGET}"]
    cxx = common + ["-fopenmp", "-fvisibility=hidden", "-g0"]  # -g0: Python's CFLAGS add -g
    groups = read_sources()
    include_dirs = [str(ROOT / d) for d in groups["include"]]
    sources = list(groups["cpu"])
    kwargs = dict(
        name="mla_ext._C",
        sources=sources,
        include_dirs=include_dirs,
        extra_link_args=["-fopenmp"],
        py_limited_api=True,
    )
    if build_gpu:
        sources += groups["gpu"]
        nvcc = common + ["-DUSE_CUDA"]
        # Hidden visibility for the GPU object too (as cxx): without it the .so exported ~230
        # mla_ext:: launcher templates and per-device static flags, which could bind to another
        # copy of the kernel headers loaded in the same process.
        if not is_rocm:
            nvcc += ["--expt-relaxed-constexpr", "-lineinfo", "-Xcompiler=-fvisibility=hidden"]
        else:
            cxx += ["-DUSE_ROCM"]
            nvcc += ["-DUSE_ROCM", "-fvisibility=hidden"]
        ext = cpp_extension.CUDAExtension(extra_compile_args={"cxx": cxx + ["-DUSE_CUDA", "-DMLA_EXT_WITH_GPU"],
                                                              "nvcc": nvcc},
                                          **kwargs)
    else:
        ext = cpp_extension.CppExtension(extra_compile_args={"cxx": cxx}, **kwargs)

    write_build_info(torch, build_gpu, is_rocm)
    setup(
        ext_modules=[ext],
        cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
        options={"bdist_wheel": {"py_limited_api": "cp310"}},
        **license_metadata(),
    )


def write_build_info(torch, build_gpu, is_rocm):
    info = {
        "commit": git_commit(),
        "torch_built_against": torch.__version__.split("+")[0],
        "torch_full_version": torch.__version__,
        "cuda_version": torch.version.cuda if build_gpu and not is_rocm else None,
        "hip_version": torch.version.hip if build_gpu and is_rocm else None,
        "gpu_arch_list": (os.environ.get("PYTORCH_ROCM_ARCH") if is_rocm else
                          os.environ.get("TORCH_CUDA_ARCH_LIST")) if build_gpu else None,
        "stable_abi_target": "2.10",
        "gpu_ops": ["merge_attn_states", "merge_attn_states_n", "sparse_mla_decode"] if build_gpu else [],
    }
    text = '"""Generated by setup.py: how this copy of mla_ext was built."""\n\nBUILD_INFO = ' + repr(info) + "\n"
    (ROOT / "mla_ext" / "_build_info.py").write_text(text)


if __name__ == "__main__":
    main()
