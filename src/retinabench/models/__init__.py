"""Everything that loads a model: image encoders, dual encoders, MLLMs and their LoRA adapters, each from the
files its registry entry pins (the lock file, or the entry's own sha256), each strictly.

The public names below load lazily (importing this package imports no torch). One loader module per source,
registered by name in :mod:`retinabench.models.sources`: the model libraries ``_timm``, ``_open_clip``,
``_transformers``; the weight origins ``_checkpoints`` (hub, URL, hand-downloaded files) and ``_packaged``
(package data, local paths). The model kinds: :mod:`~retinabench.models.encoder`,
:mod:`~retinabench.models.dual_encoder`, :mod:`~retinabench.models.mllm`, :mod:`~retinabench.models.adapters`;
``retinabench check-encoder`` is :mod:`~retinabench.models.check`, ``retinabench lock-encoders`` is
:mod:`~retinabench.models.lock` (the lock file's reader is :mod:`retinabench.registry.lockfile`).

Inside retinabench, import from the defining module (``retinabench.models.encoder``, ...): a rule's code hash
follows static imports, which this package's lazy table hides.
"""
from __future__ import annotations

_LAZY = {
    "Encoder": "retinabench.models.encoder",
    "build_encoder": "retinabench.models.encoder",
    "weights_record": "retinabench.models.encoder",
    "KeyReport": "retinabench.models.strict",
    "WeightsError": "retinabench.models.strict",
    "weights_target": "retinabench.models.strict",
    "NORMALIZATIONS": "retinabench.models.preprocess",
    "resolve_normalization": "retinabench.models.preprocess",
    "SourceLoader": "retinabench.models.sources",
    "build_architecture": "retinabench.models.sources",
    "register_origin": "retinabench.models.sources",
    "register_source": "retinabench.models.sources",
    "hf_config": "retinabench.models._transformers",
    "load_transformers_model": "retinabench.models._transformers",
    "load_open_clip_model": "retinabench.models._open_clip",
    "DualEncoder": "retinabench.models.dual_encoder",
    "load_dual_encoder": "retinabench.models.dual_encoder",
    "MLLM": "retinabench.models.mllm",
    "AnswerTokens": "retinabench.models.mllm",
    "answer_tokens": "retinabench.models.mllm",
    "load_mllm": "retinabench.models.mllm",
    "AdapterError": "retinabench.models.adapters",
    "AdapterInfo": "retinabench.models.adapters",
    "load_adapter": "retinabench.models.adapters",
    "verify_adapter_files": "retinabench.models.adapters",
    "write_adapter_sidecar": "retinabench.models.adapters",
    "check_encoder": "retinabench.models.check",
    "lock_entry": "retinabench.models.lock",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'retinabench.models' has no attribute {name!r}")
