"""Dual encoders (CLIP-like: an image tower and a text tower in one embedding space) for the zero-shot protocols,
loaded strictly by the loader of the entry's library: open_clip, or transformers CLIP / SigLIP with both towers
(:data:`~retinabench.models.sources.SOURCES`, ``dual_encoder``), or, for an entry with its own ``text_tower``
(RET-CLIP, FLAIR), by that text tower's loader (:data:`~retinabench.models.sources.TEXT_TOWERS`). Importing this module imports no torch."""
from __future__ import annotations

from pathlib import Path

from retinabench.models._dual import DualEncoder, module_device
from retinabench.models.sources import SOURCES, TEXT_TOWERS, source_loader
from retinabench.models.strict import WeightsError

__all__ = ["DualEncoder", "load_dual_encoder", "module_device"]


def load_dual_encoder(entry: dict, weights: str | Path | None = None) -> DualEncoder:
    """The entry's whole dual encoder (both towers and the tokenizer), loaded strictly from its pinned files or
    ``weights`` (a local file / folder in the published layout) by its library's loader."""
    what = f"encoder {entry['name']!r}"
    if "zeroshot" not in (entry.get("interfaces") or []):
        raise WeightsError(f"{what} does not declare the zeroshot interface (interfaces: "
                           f"{entry.get('interfaces') or ['features']}); {entry.get('zeroshot_note', '')}".rstrip())
    if entry.get("text_tower"):
        return TEXT_TOWERS.get(entry["text_tower"].get("kind", ""), what)(entry, weights)
    loader = source_loader(entry)
    if loader.dual_encoder is None:
        dual = [n for n in SOURCES.names() if SOURCES.get(n, what).dual_encoder is not None]
        raise WeightsError(f"{what}: zero-shot needs an {' or '.join(dual)} dual encoder")
    return loader.dual_encoder(entry, weights)
