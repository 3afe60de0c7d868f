"""The loader registries: every dispatch of the load path is a lookup by name, never an if/elif over libraries.

Two registries, each keyed by what a registry entry says and each refusing a second loader under one key (as
timm's ``register_model`` refuses a second factory of a name):

* :data:`SOURCES`, keyed by the entry's ``source`` (the model library): how that library builds the image
  encoder's architecture, loads its pretrained weights strictly and, where it has a text tower, the whole dual
  encoder (:class:`SourceLoader`). Registered by ``_timm``, ``_open_clip`` and ``_transformers``.
* :data:`TEXT_TOWERS`, keyed by an entry's ``text_tower.kind``: the whole dual encoder of a checkpoint whose text
  tower is its own model (RET-CLIP, FLAIR; BERT built by transformers). Registered by ``_ret_clip`` and ``_flair``.
* :data:`ORIGINS`, keyed by where an entry's weight files come from
  (:func:`retinabench.registry.lockfile.weights_origin`): the verified files and their provenance. Registered by
  ``_checkpoints`` (Hugging Face hub, direct URL and hand-downloaded files, pinned by the lock file) and
  ``_packaged`` (a package's data file or a local path, pinned by the entry itself; none for random init).

The built-in loader modules are imported, and register themselves, at the first lookup (importing this module
imports no model library, nor torch). A new library or origin is one module that calls :func:`register_source` /
:func:`register_origin`; a name taken by a built-in is refused when both are registered.
"""
from __future__ import annotations

from retinabench.models._registry import (ORIGINS, SOURCES, TEXT_TOWERS, LoaderRegistry, SourceLoader,
                                          WeightFiles, build_architecture, register_origin, register_source,
                                          register_text_tower, source_loader, weight_files)

__all__ = ["ORIGINS", "SOURCES", "TEXT_TOWERS", "LoaderRegistry", "SourceLoader", "WeightFiles",
           "build_architecture", "register_origin", "register_source", "register_text_tower", "source_loader",
           "weight_files"]

_builtin_registered = False


def _register_builtin() -> None:
    """Import the built-in loader modules once (each registers itself on import; their registrations pass through
    here again while the flag is set)."""
    global _builtin_registered
    if _builtin_registered:
        return
    _builtin_registered = True
    try:
        from retinabench.models import (_checkpoints, _flair, _open_clip, _packaged, _ret_clip,  # noqa: F401
                                        _timm, _transformers)
    except BaseException:
        _builtin_registered = False
        raise


SOURCES.before_lookup = ORIGINS.before_lookup = TEXT_TOWERS.before_lookup = _register_builtin
