"""Drop-in call shapes of other libraries' ops: :mod:`mla_ext.compat.vllm` (vLLM's
``merge_attn_states``) and :mod:`mla_ext.compat.flashmla` (FlashMLA's sparse
``flash_mla_with_kvcache``)."""
from . import flashmla, vllm

__all__ = ["flashmla", "vllm"]
