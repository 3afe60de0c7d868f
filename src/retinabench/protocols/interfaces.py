"""The prompt-based interfaces as pipeline jobs: the per-task inputs a job receives and one spec per interface
(its settings: retinabench.settings.ZeroShotSettings / MLLMSettings) for the pipeline's protocol registry.
Torch-free at import (the job functions import torch when they run). Which jobs run is the plan's decision
(retinabench.plan.interface_jobs).

A job is one (model, task set) of one interface: :func:`retinabench.protocols.zeroshot.run` or
:func:`retinabench.protocols.mllm.run` loads the registry entry once (strictly, from its locked files or a local
folder), runs every task of the set and returns one predictions table in the shared schema
(:data:`retinabench.schemas.PREDICTIONS`) plus the interface's extra columns (:data:`INTERFACES` lists them).

Zero-shot trains nothing: a regime ``a-b`` only chooses the rows (validation rows balanced when ``a`` is ``b``,
test rows when ``b`` is), seed 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from retinabench.protocols.native_inputs import OriginalImages
from retinabench.settings.base import Section
from retinabench.settings.protocols import MLLMSection, MLLMSettings, ZeroShotSection, ZeroShotSettings

__all__ = ["INTERFACES", "InterfaceSpec", "MLLMSettings", "TaskInput", "ZeroShotSettings", "finish_predictions",
           "interface_of"]


@dataclass(frozen=True)
class TaskInput:
    """What a job needs of one task: the task entry, its split table (image_id, y, split, balanced), the images
    aligned with ``image_ids`` — uint8 NHWC (the memory-mapped image cache; ``inputs: cache``) or the original
    files, decoded on access (:class:`~retinabench.protocols.native_inputs.OriginalImages`; ``inputs: native``) —
    and the dataset's manifest rows (the metadata an MLLM question may use and the label fields its leakage guard
    checks)."""

    task: dict
    split: pd.DataFrame
    image_ids: Sequence[str]
    images: np.ndarray | OriginalImages
    manifest: pd.DataFrame | None = None

    def __post_init__(self):
        if len(self.image_ids) != len(self.images):
            raise ValueError(f"task {self.task['name']!r}: {len(self.image_ids)} image ids for {len(self.images)} "
                             "images")


@dataclass(frozen=True)
class InterfaceSpec:
    """One interface for the protocol registry: the registry entries it selects (``entry_interface`` in their
    ``interfaces``), the protocol names its predictions carry (``<protocol>@<set>`` for a non-default prompt
    set), its job's settings and its config section's model, its job function (``module:function``, imported
    when the job runs) and the extra prediction columns beyond the shared schema."""

    name: str
    entry_interface: str
    protocols: tuple[str, ...]
    settings: type
    section: type[Section]
    job: str
    kind: str = "images+prompts"
    gpu: int = 1
    extras: tuple[str, ...] = field(default_factory=tuple)

    def run(self, *args, **kwargs):
        import importlib
        module, _, fn = self.job.partition(":")
        return getattr(importlib.import_module(module), fn)(*args, **kwargs)


INTERFACES: dict[str, InterfaceSpec] = {
    "zeroshot": InterfaceSpec("zeroshot", "zeroshot", ("zeroshot", "zeroshot_focus"), ZeroShotSettings,
                              ZeroShotSection, "retinabench.protocols.zeroshot:run", extras=("prompt_set",)),
    "mllm": InterfaceSpec("mllm", "mllm", ("mllm", "mllm_renorm"), MLLMSettings, MLLMSection,
                          "retinabench.protocols.mllm:run",
                          extras=("answer", "answer_valid", "prob_yes", "prob_no", "mass", "prompt_set", "prompt")),
}


def interface_of(protocol: str) -> InterfaceSpec:
    """The interface that writes ``protocol`` (``zeroshot_focus@plain`` -> zeroshot)."""
    from retinabench.prompts import split_protocol
    base, _ = split_protocol(protocol)
    for spec in INTERFACES.values():
        if base in spec.protocols:
            return spec
    raise KeyError(f"protocol {protocol!r} is not written by an interface {sorted(INTERFACES)}")


def finish_predictions(frames: list[pd.DataFrame], where: str) -> pd.DataFrame:
    """One predictions table from a job's frames, checked against the shared schema (extras allowed)."""
    from retinabench.schemas import conform
    if not frames:
        raise ValueError(f"{where}: no predictions")
    out = pd.concat(frames, ignore_index=True)
    conform(out, "predictions", where=where)
    return out
