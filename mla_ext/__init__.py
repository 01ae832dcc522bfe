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

See ``../shared/DESIGN.md`` in the source tree (the contract) and README.md.
"""
from ._load import load_extension as _load_extension

_LIBRARY_PATH = _load_extension()

from ._ops import merge_attn_states, merge_attn_states_n  # noqa: E402
from ._decode import DecodeWorkspace, sparse_mla_decode, sparse_mla_decode_workspace_size  # noqa: E402
from . import compat  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "merge_attn_states",
    "merge_attn_states_n",
    "sparse_mla_decode",
    "sparse_mla_decode_workspace_size",
    "DecodeWorkspace",
    "compat",
    "__version__",
]
