"""Attention geometry of the DeepSeek models ``mla-ext decode`` runs (published configurations).

Each :class:`ModelPreset` lists, in model order, which layer kind of :mod:`mla_ext.builders`
every attention layer is (``v4_swa``, ``v4_c4``, ``v4_c128``, ``v32``), the query heads, the
indexer top-k and the default cache format. Page sizes, d_qk, the sliding window (128) and the
softmax scale come from :data:`mla_ext.builders.LAYER_KINDS` (DESIGN.md section 4).

Sources (the models' Hugging Face ``config.json`` and checkpoint weight names):

- deepseek-ai/DeepSeek-V4-Flash: ``num_hidden_layers`` 43, ``num_attention_heads`` 64,
  ``index_topk`` 512, ``sliding_window`` 128, ``compress_ratios`` = [0, 0] + [4, 128] x 20 + [4]
  for the 43 layers (0 = sliding window only), then one entry (0) for the MTP draft layer. The
  checkpoint agrees: compressor weights in layers 2-42, an indexer in layers 2, 4, ..., 42 and a
  128-row positional table in layers 3, 5, ..., 41.
- deepseek-ai/DeepSeek-V4-Pro: ``num_hidden_layers`` 61, ``num_attention_heads`` 128,
  ``index_topk`` 1024, ``sliding_window`` 128, ``compress_ratios`` = [128, 128] + [4, 128] x 29
  + [4] for the 61 layers, then 0 for the MTP layer (so no sliding-window-only layer; indexer in
  layers 2, 4, ..., 60).
- deepseek-ai/DeepSeek-V3.2: ``num_hidden_layers`` 61, ``num_attention_heads`` 128,
  ``index_topk`` 2048; every layer is DSA (indexer top-k over all visible tokens).

Not modelled: the MTP draft layer's own attention (``--mtp K`` adds K query tokens per request
to every layer listed here instead); the indexer and the compressor themselves (only the
attention they feed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .builders import LAYER_KINDS

__all__ = ["ModelPreset", "MODELS", "KIND_LABELS", "LAYER_SELECTIONS", "get_model"]

#: Short labels of the builder layer kinds (tables, plots, ``--layers``).
KIND_LABELS = {"v4_swa": "SWA", "v4_c4": "C4", "v4_c128": "C128", "v32": "DSA"}

#: ``--layers`` choices: which layer kinds of the model run.
LAYER_SELECTIONS = {
    "all": ("v4_swa", "v4_c4", "v4_c128", "v32"),
    "swa": ("v4_swa",),
    "c4": ("v4_c4",),
    "c128": ("v4_c128",),
    "dsa": ("v32",),
}

_RATIO_KIND = {0: "v4_swa", 4: "v4_c4", 128: "v4_c128"}


@dataclass(frozen=True)
class ModelPreset:
    """One model's attention layers.

    Attributes:
        name: ``mla-ext decode --model`` name.
        hf_name: Hugging Face repository the numbers come from.
        num_heads: query heads of the whole model (heads per GPU = num_heads / tp).
        layer_kinds: builder layer kind of every attention layer, in model order.
        topk: indexer top-k per layer kind that has one (C4 extra set, V3.2 main set).
        compress_ratios: the config's per-layer ratios (V4; 0 = sliding window only), or None.
    """

    name: str
    hf_name: str
    num_heads: int
    layer_kinds: Tuple[str, ...]
    topk: Dict[str, int]
    compress_ratios: Optional[Tuple[int, ...]] = None

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    @property
    def kinds(self) -> List[str]:
        """Layer kinds present, in order of first appearance."""
        seen: List[str] = []
        for k in self.layer_kinds:
            if k not in seen:
                seen.append(k)
        return seen

    def layers_of(self, kind: str) -> List[int]:
        """0-based indices of the layers of ``kind``."""
        return [i for i, k in enumerate(self.layer_kinds) if k == kind]

    def kind_counts(self) -> Dict[str, int]:
        return {k: len(self.layers_of(k)) for k in self.kinds}

    def default_kv_format(self) -> str:
        return LAYER_KINDS[self.layer_kinds[0]].default_format

    def kv_formats(self) -> Tuple[str, ...]:
        return LAYER_KINDS[self.layer_kinds[0]].formats

    def heads_per_gpu(self, tp: int) -> int:
        """num_heads / tp; raises ValueError unless tp >= 1 divides num_heads."""
        if tp < 1:
            raise ValueError(f"--tp must be >= 1 (GPUs the heads are split over), got {tp}")
        if self.num_heads % tp:
            raise ValueError(f"--tp {tp}: must divide the {self.num_heads} heads of {self.name}")
        return self.num_heads // tp

    def select(self, layers: str) -> List[str]:
        """Layer kinds that ``--layers layers`` runs; ValueError when the model has none."""
        if layers not in LAYER_SELECTIONS:
            raise ValueError(f"--layers must be one of {tuple(LAYER_SELECTIONS)}, got {layers!r}")
        chosen = [k for k in self.kinds if k in LAYER_SELECTIONS[layers]]
        if not chosen:
            have = ", ".join(KIND_LABELS[k].lower() for k in self.kinds)
            raise ValueError(f"--layers {layers}: {self.name} has no such layers (it has: {have})")
        return chosen

    def describe(self) -> str:
        counts = ", ".join(f"{n} {KIND_LABELS[k]}" for k, n in self.kind_counts().items())
        return f"{self.hf_name}: {self.num_layers} layers ({counts}), {self.num_heads} heads"


def _v4(ratios) -> Tuple[str, ...]:
    return tuple(_RATIO_KIND[r] for r in ratios)


# compress_ratios of the 43 / 61 attention layers (the configs' trailing MTP entry dropped).
_FLASH_RATIOS = (0, 0) + (4, 128) * 20 + (4,)
_PRO_RATIOS = (128, 128) + (4, 128) * 29 + (4,)

MODELS: Dict[str, ModelPreset] = {
    "deepseek-v4-flash": ModelPreset(
        "deepseek-v4-flash", "deepseek-ai/DeepSeek-V4-Flash", 64, _v4(_FLASH_RATIOS),
        {"v4_c4": 512}, _FLASH_RATIOS),
    "deepseek-v4-pro": ModelPreset(
        "deepseek-v4-pro", "deepseek-ai/DeepSeek-V4-Pro", 128, _v4(_PRO_RATIOS),
        {"v4_c4": 1024}, _PRO_RATIOS),
    "deepseek-v3.2": ModelPreset(
        "deepseek-v3.2", "deepseek-ai/DeepSeek-V3.2", 128, ("v32",) * 61, {"v32": 2048}),
}


def get_model(name: str) -> ModelPreset:
    if name not in MODELS:
        raise ValueError(f"--model must be one of {tuple(MODELS)}, got {name!r}")
    return MODELS[name]
