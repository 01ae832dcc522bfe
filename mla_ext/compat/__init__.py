"""Drop-in call shapes of other engines' ops (e.g. :mod:`mla_ext.compat.vllm`)."""
from . import vllm

__all__ = ["vllm"]
