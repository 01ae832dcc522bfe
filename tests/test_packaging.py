"""Packaging metadata: pyproject.toml + setup.py give the license without setuptools warnings."""
import importlib.util
import pathlib
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _setup_module():
    spec = importlib.util.spec_from_file_location("mla_ext_setup_py", ROOT / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # main() only runs under __main__
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
    import subprocess
    import sys
    import tarfile

    r = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)], cwd=ROOT,
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


def test_public_ops_carry_the_autograd_paragraph():
    """The shared autograd paragraph (mla_ext._ops.with_autograd_note) is filled into each public
    op's docstring, with no marker left behind."""
    import mla_ext
    for fn in (mla_ext.merge_attn_states, mla_ext.merge_attn_states_n, mla_ext.sparse_mla_decode):
        assert fn.__doc__.count("Not differentiable. With grad mode on") == 1, fn.__name__
        assert "AUTOGRAD_NOTE" not in fn.__doc__, fn.__name__
