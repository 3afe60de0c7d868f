"""Encoders: one architecture builder per source library (timm / open_clip / transformers), one strict load path,
weights pinned by the lock file. Imported lazily so that reading registries and locks does not import torch."""
from __future__ import annotations

_LAZY = {
    "Encoder": "retinabench.models.loaders",
    "KeyReport": "retinabench.models.loaders",
    "WeightsError": "retinabench.models.loaders",
    "build_architecture": "retinabench.models.loaders",
    "build_encoder": "retinabench.models.loaders",
    "load_open_clip_model": "retinabench.models.loaders",
    "load_transformers_model": "retinabench.models.loaders",
    "weights_record": "retinabench.models.loaders",
    "LockError": "retinabench.models.lock",
    "lock_entry": "retinabench.models.lock",
    "lock_path_for": "retinabench.models.lock",
    "read_lock": "retinabench.models.lock",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'retinabench.models' has no attribute {name!r}")
