"""Packaging metadata: pyproject.toml + setup.py give the license without setuptools warnings."""
import importlib.util
import pathlib
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _setup_module(path: pathlib.Path = ROOT / "setup.py"):
    """setup.py (this checkout's, or a copy at ``path``) as a module; main() only runs under __main__."""
    spec = importlib.util.spec_from_file_location("mla_ext_setup_py", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_license_metadata_without_deprecation_warnings():
    setuptools = pytest.importorskip("setuptools")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    meta = _setup_module().license_metadata()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(meta), ROOT / "pyproject.toml")
    messages = [str(w.message) for w in caught]
    assert [m for m in messages if "license" in m.lower()] == [], messages
    assert dist.metadata.name == "mla_ext"
    if int(setuptools.__version__.split(".")[0]) >= 77:
        assert meta == {"license_expression": "Apache-2.0"}
        assert dist.metadata.license_expression == "Apache-2.0"
    else:
        assert meta == {"license": "Apache-2.0"}
        assert dist.metadata.license == "Apache-2.0"


def test_helper_modules_reachable_as_attributes():
    # `import mla_ext` then `mla_ext.formats...` as the README writes it (imported on first use)
    import mla_ext

    assert "fp8_ds_mla_v4" in mla_ext.formats.KV_FORMATS
    assert callable(mla_ext.reference.sparse_mla_decode) and callable(mla_ext.builders.build_decode_inputs)
    assert callable(mla_ext.parallel.compact_indices)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mla_ext.nope


def test_sdist_carries_every_source(tmp_path):
    # `python -m build` builds the wheel from the sdist: every file csrc/sources.txt names (and the
    # headers they include) must be in it, or the build fails with a missing csrc/sources.txt.
    import shutil
    import subprocess
    import sys
    import tarfile

    # From a copy of the checkout: setup.py rewrites mla_ext/_build_info.py where it runs, which
    # in the checkout itself raced test_require_gpu_refuses_a_cpu_only_build under pytest-xdist
    # (and left the developer's build info naming another commit).
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".dev", "build", "dist", "*.egg-info", "*.so",
                                                             "__pycache__", ".pytest_cache", ".benchmarks"))
    r = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)], cwd=src,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    [sdist] = list(tmp_path.glob("*.tar.gz"))
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    listed = [line.split()[1] for line in (ROOT / "csrc" / "sources.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#") and len(line.split()) >= 2]
    headers = [str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.h")]
    missing = [f for f in ["csrc/sources.txt", "LICENSE", "CMakeLists.txt", *listed, *headers] if f not in names]
    assert not missing, f"sdist lacks {missing}"
    assert "mla_ext/_build_info.py" not in names and not any(n.endswith(".so") for n in names)


def test_isolated_build_env_is_recognised():
    """setup.py warns when it builds against a build front end's temporary torch (pip's build
    isolation, `python -m build`), which need not match the torch that will import the extension."""
    import types

    mod = _setup_module()
    fake = lambda path: types.SimpleNamespace(__file__=path)
    assert mod.isolated_build_env(fake("/tmp/pip-build-env-abc123/overlay/lib/python3.11/site-packages/torch/__init__.py"))
    assert mod.isolated_build_env(fake("/tmp/build-env-x1y2/lib/python3.11/site-packages/torch/__init__.py"))
    assert not mod.isolated_build_env(fake("/opt/venv/lib/python3.11/site-packages/torch/__init__.py"))
    import torch

    assert not mod.isolated_build_env(torch)


def test_require_gpu_refuses_a_cpu_only_build():
    """MLA_EXT_REQUIRE_GPU=1 fails the build (naming the reason) where it would have fallen back to
    the CPU-only extension, before writing anything."""
    import os
    import subprocess
    import sys

    info = ROOT / "mla_ext" / "_build_info.py"
    before = info.read_bytes() if info.exists() else None
    env = dict(os.environ, MLA_EXT_REQUIRE_GPU="1", MLA_EXT_FORCE_CPU="1")
    r = subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0
    assert "MLA_EXT_REQUIRE_GPU=1 but the GPU extension cannot be built: MLA_EXT_FORCE_CPU=1" in r.stderr
    assert (info.read_bytes() if info.exists() else None) == before


def _fake_toolkit(tmp_path, release):
    """A folder with a bin/nvcc that prints `nvcc --version` of the given release."""
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                    f"echo 'Cuda compilation tools, release {release}, V{release}.85'\n")
    nvcc.chmod(0o755)
    return nvcc.parent.parent


def test_nvcc_version_and_default_archs(tmp_path):
    """setup.py reads nvcc's release, and its default arch list leaves out sm_100 for an nvcc
    older than 12.8 (which cannot compile it)."""
    mod = _setup_module()
    assert mod.nvcc_version(str(_fake_toolkit(tmp_path, "12.6"))) == (12, 6)
    assert mod.nvcc_version(str(tmp_path / "nowhere")) is None
    assert mod.default_cuda_arch_list((12, 6)) == "8.0+PTX;9.0a"  # not 9.0a+PTX: runs on 9.0 only
    assert mod.default_cuda_arch_list((12, 8)) == mod.DEFAULT_CUDA_ARCH_LIST == "8.0;9.0a;10.0+PTX"
    assert mod.default_cuda_arch_list((13, 0)) == mod.DEFAULT_CUDA_ARCH_LIST
    assert mod.default_cuda_arch_list(None) == mod.DEFAULT_CUDA_ARCH_LIST


def test_cuda_major_mismatch_stops_with_one_line(tmp_path):
    """A toolkit of another CUDA major version than torch's stops the build with both versions
    named and the ways out (torch's own check raised deep in a traceback that ended with an
    unrelated setuptools hint), before writing anything. torch is made to look like a CUDA 12.8
    build through a sitecustomize (its version and cpp_extension's toolkit folder, which a CPU
    torch leaves unset), the toolkit is a fake nvcc of release 13.0."""
    import os
    import subprocess
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, torch, torch.utils.cpp_extension as ce\n"
        "torch.version.cuda = '12.8'\nce.CUDA_HOME = os.environ['CUDA_HOME']\n")
    info = ROOT / "mla_ext" / "_build_info.py"
    before = info.read_bytes() if info.exists() else None
    env = dict(os.environ, CUDA_HOME=str(_fake_toolkit(tmp_path, "13.0")),
               PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    env.pop("MLA_EXT_FORCE_CPU", None)
    r = subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0, r.stderr
    assert "is CUDA 13.0, but torch" in r.stderr and "built with CUDA 12.8" in r.stderr, r.stderr
    assert "MLA_EXT_FORCE_CPU=1" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (info.read_bytes() if info.exists() else None) == before


def test_build_info_commit_only_from_this_checkout(tmp_path):
    """An sdist unpacked inside another project's git repository records commit "unknown", not
    that repository's commit."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("needs git")
    outer = tmp_path / "engine"
    (outer / "third_party" / "mla_ext").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    subprocess.run(["git", "-C", str(outer), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    copy = outer / "third_party" / "mla_ext" / "setup.py"
    shutil.copy(ROOT / "setup.py", copy)
    assert _setup_module(copy).git_commit() == "unknown"
    here = _setup_module().git_commit()
    assert here == "unknown" or len(here) == 12  # this checkout's own commit (or no git metadata)


def test_public_ops_carry_the_autograd_paragraph():
    """The shared autograd paragraph (mla_ext._ops.with_autograd_note) is filled into each public
    op's docstring, with no marker left behind."""
    import mla_ext
    for fn in (mla_ext.merge_attn_states, mla_ext.merge_attn_states_n, mla_ext.sparse_mla_decode):
        assert fn.__doc__.count("Not differentiable: inputs that require grad are read as constants") == 1, fn.__name__
        assert "AUTOGRAD_NOTE" not in fn.__doc__, fn.__name__


def test_load_failure_message_names_the_build_and_the_fix(monkeypatch):
    """A library that does not load (e.g. a CUDA wheel under a CPU torch) gives an ImportError
    naming the installed torch, the build's torch, CUDA version and GPU archs, and fixes that fit
    a wheel user (a matching torch) as well as a checkout or a source archive."""
    import torch

    from mla_ext import _load

    monkeypatch.setattr(_load, "_build_info", lambda: {"torch_full_version": "2.14.1+cu130", "cuda_version": "13.0",
                                                       "hip_version": None, "gpu_arch_list": "9.0a"})

    def refuse(path):
        raise OSError("libtorch_cuda.so: cannot open shared object file")

    monkeypatch.setattr(torch.ops, "load_library", refuse)
    with pytest.raises(ImportError) as e:
        _load.load_extension()
    msg = str(e.value)
    for words in (f"installed torch is {torch.__version__}", "built against torch 2.14.1+cu130", "CUDA 13.0",
                  "GPU archs 9.0a", "libtorch_cuda.so: cannot open shared object file", "install such a torch",
                  "--no-build-isolation <the source archive>"):
        assert words in msg, (words, msg)
