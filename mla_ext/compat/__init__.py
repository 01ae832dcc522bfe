"""Drop-in call shapes of other libraries' ops: :mod:`mla_ext.compat.vllm` (vLLM's
``merge_attn_states``), :mod:`mla_ext.compat.sglang` (SGLang's ``merge_state`` and
``sgl_kernel.merge_state_v2``) and :mod:`mla_ext.compat.flashmla` (FlashMLA's sparse
``flash_mla_with_kvcache``)."""
from . import flashmla, sglang, vllm

__all__ = ["flashmla", "sglang", "vllm"]
