"""mla_ext: the attention steps around DeepSeek-style MLA decode and chunked prefill.

Ops (registered under ``torch.ops.mla_ext`` for CPU and CUDA; every output and
scratch buffer is owned by the caller, nothing is allocated on the device):

- :func:`merge_attn_states` — merge two partial attention results (values + LSE)
  over disjoint key sets, in place, on strided views (optionally to FP8, and
  copying the suffix for tokens without a prefix).
- :func:`merge_attn_states_n` — merge S partial results at once, in one pass.
- :func:`sparse_mla_decode` — sparse MLA decode (DeepSeek V3.2 / V4 paged latent
  caches, FP8 or bf16) with split-K over a caller-owned workspace
  (:func:`sparse_mla_decode_workspace_size`, :class:`DecodeWorkspace`).

Helper modules, imported on first use: :mod:`mla_ext.formats` (cache byte layouts),
:mod:`mla_ext.reference` (float64 references), :mod:`mla_ext.builders` (realistic decode
inputs), :mod:`mla_ext.models` (DeepSeek presets), :mod:`mla_ext.bench`, :mod:`mla_ext.parallel`
(context-parallel decode over torch.distributed).

The contract (math, byte layouts, index rules) is restated in the docstrings of the ops and of
:mod:`mla_ext.formats`; the project's design document is docs/DESIGN.md in the source tree.
"""
from ._load import load_extension as _load_extension

_LIBRARY_PATH = _load_extension()

from ._ops import merge_attn_states, merge_attn_states_n  # noqa: E402
from ._decode import DecodeWorkspace, sparse_mla_decode, sparse_mla_decode_workspace_size  # noqa: E402
from . import compat  # noqa: E402

__version__ = "0.1.0"

_LAZY_SUBMODULES = ("formats", "reference", "builders", "models", "bench", "parallel", "cli")


def __getattr__(name):
    # `import mla_ext; mla_ext.formats.pack_fp8_ds_mla(...)` works without importing the helper
    # modules (and torch.distributed, matplotlib, ...) at `import mla_ext`.
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'mla_ext' has no attribute {name!r}")

__all__ = [
    "merge_attn_states",
    "merge_attn_states_n",
    "sparse_mla_decode",
    "sparse_mla_decode_workspace_size",
    "DecodeWorkspace",
    "compat",
    "__version__",
]
