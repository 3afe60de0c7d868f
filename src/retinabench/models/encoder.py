"""Build an :class:`Encoder` from a registry entry: the architecture of its library, its pinned weights, one load
path.

Every pretrained load goes the same way, whatever the library or the file's origin:

1. the files, from the loader of the entry's weight origin (:data:`~retinabench.models.sources.ORIGINS`): the hub
   at the locked revision, a downloaded / hand-placed file, a package or a local path; each file's sha256 must
   equal its pin (the lock file, or the entry for packaged and local weights);
2. the model's own pipeline files (processor / pretrained config) checked against the entry's normalisation and
   input size;
3. the weights, by the loader of the entry's library (:data:`~retinabench.models.sources.SOURCES`): a strict load
   into the architecture (timm, open_clip: :mod:`retinabench.models._checkpoints`) or ``from_pretrained`` from
   exactly the verified files (transformers): any missing or unexpected key, or any shape mismatch, is a
   :class:`WeightsError` naming the keys.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from retinabench.models.preprocess import check_pipeline_files, resolve_normalization
from retinabench.models.sources import build_architecture, source_loader, weight_files
from retinabench.models.strict import WeightsError, probe_embed_dim
from retinabench.registry.lockfile import weights_origin

POOLINGS = ("cls", "patch_mean", "cls_patch_mean", "avg", "pooler", "projected")


@dataclass
class Encoder:
    """A frozen-feature encoder: ``module(x) -> [B, D]`` on normalised float input of ``input_size``²."""

    name: str
    module: nn.Module
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    input_size: int
    embed_dim: int
    weights: dict[str, Any] = field(default_factory=dict)
    pooling: str = "cls"


def entry_seed(entry: dict, seed: int | None = None) -> int:
    """Deterministic seed for random-init weights, stable across processes (unlike ``hash``): from the entry's
    name alone (``seed`` None: the one documented initialisation the frozen protocols' cached features use) or
    from the name and a run's ``seed`` (fine-tuning: each seed trains from its own initialisation)."""
    key = entry["name"] if seed is None else f"{entry['name']}/seed{int(seed)}"
    return zlib.crc32(key.encode()) & 0x7FFFFFFF


def is_random_init(entry: dict) -> bool:
    """Whether the entry is built with random weights (``init: random``), which then depend on the run's seed."""
    return entry.get("init") == "random"


def build_encoder(entry: dict, weights: str | Path | None = None, device: str = "cpu", *,
                  seed: int | None = None) -> Encoder:
    """The encoder of a registry entry with its pinned weights (or ``weights``, a local file in the published
    layout), loaded strictly; random init for ``init: random`` entries, seeded by :func:`entry_seed` (``seed``:
    the run's seed, so each fine-tuning seed starts from its own initialisation; None: the entry's one init).

    ``device="meta"`` (offline tests of large models): the architecture is built without memory, its embedding
    dimension probed on meta tensors, and the checkpoint's tensors are assigned rather than copied.
    """
    name = entry["name"]
    source = entry["source"]
    dev = torch.device(device)
    mean, std = resolve_normalization(entry)
    record: dict[str, Any] = {"source": source, "init": entry.get("init", "pretrained"),
                              "pooling": entry["pooling"]}
    dim = None
    if is_random_init(entry):
        if weights is not None:
            raise WeightsError(f"encoder {name!r} is random-init: it loads no weights")
        init_seed = entry_seed(entry, seed)
        torch.manual_seed(init_seed)
        module = build_architecture(entry, device)
        record |= {"origin": "none", "seed": init_seed, "run_seed": seed, "files": {}}
    else:
        loader = source_loader(entry)
        if dev.type == "meta" and not loader.on_meta:
            raise WeightsError(f"encoder {name!r}: {source} entries load with from_pretrained, not on meta")
        files, prov = weight_files(entry, weights)
        checked = check_pipeline_files(entry, files)
        module, report, dim = loader.pretrained(entry, files, dev)
        record |= prov | report.record() | {"pipeline_checked": checked}
    module.eval()
    if dim is None:
        dim = probe_embed_dim(module, entry, device)
    return Encoder(name, module, mean, std, entry["input_size"], dim, record, entry["pooling"])


def weights_record(entry: dict) -> dict:
    """What the provenance of features records about an encoder's weights, without loading it."""
    rec = entry.get("lock") or {}
    return {"source": entry["source"], "init": entry.get("init", "pretrained"), "origin": weights_origin(entry),
            "hub_id": entry.get("hub_id"), "revision": rec.get("revision"),
            "files": rec.get("files") or (dict(entry["sha256"]) if isinstance(entry.get("sha256"), dict) else
                                          {entry["weights_file"]: entry["sha256"]} if entry.get("sha256") else {})}
