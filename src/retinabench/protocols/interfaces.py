"""The prompt-based interfaces as pipeline jobs: the per-task inputs a job receives and one spec per interface
(its settings: retinabench.settings.ZeroShotSettings / MLLMSettings) for the pipeline's protocol registry. Torch-free at import (the job functions import torch
when they run).

A job is one (model, task set) of one interface: :func:`retinabench.protocols.zeroshot.run` or
:func:`retinabench.protocols.mllm.run` loads the registry entry once (strictly, from its locked files or a local
folder), runs every task of the set and returns one predictions table in the shared schema
(:data:`retinabench.schemas.PREDICTIONS`) plus the interface's extra columns (:data:`INTERFACES` lists them).

Zero-shot trains nothing: a regime ``a-b`` only chooses the rows (validation rows balanced when ``a`` is ``b``,
test rows when ``b`` is), seed 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from retinabench.settings.base import Section
from retinabench.settings.protocols import MLLMSection, MLLMSettings, ZeroShotSection, ZeroShotSettings

__all__ = ["INTERFACES", "InterfaceJob", "InterfaceSpec", "MLLMSettings", "TaskInput", "ZeroShotSettings",
           "finish_predictions", "interface_of", "job_resources", "plan_jobs", "selected_entries"]


@dataclass(frozen=True)
class TaskInput:
    """What a job needs of one task: the task entry, its split table (image_id, y, split, balanced), the images
    (uint8 NHWC, e.g. the memory-mapped image cache) aligned with ``image_ids``, and the dataset's manifest rows
    (the metadata an MLLM question may use and the label fields its leakage guard checks)."""

    task: dict
    split: pd.DataFrame
    image_ids: Sequence[str]
    images: np.ndarray
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


def selected_entries(encoders: Mapping[str, dict], interface: str, names: Sequence[str] | None = None) -> list[str]:
    """Registry entries a job grid runs for ``interface``: ``names`` (each must declare it) or all that do."""
    spec = INTERFACES[interface]
    serve = {n for n, e in encoders.items() if spec.entry_interface in (e.get("interfaces") or ["features"])}
    if names is None:
        return sorted(serve)
    bad = {n: (encoders[n].get("zeroshot_note") or f"interfaces {encoders[n].get('interfaces') or ['features']}")
           if n in encoders else "not in the encoder registry" for n in names if n not in serve}
    if bad:
        raise KeyError(f"{interface}: encoder(s) {sorted(bad)} cannot run it: {bad}")
    return list(names)


def finish_predictions(frames: list[pd.DataFrame], where: str) -> pd.DataFrame:
    """One predictions table from a job's frames, checked against the shared schema (extras allowed)."""
    from retinabench.schemas import conform
    if not frames:
        raise ValueError(f"{where}: no predictions")
    out = pd.concat(frames, ignore_index=True)
    conform(out, "predictions", where=where)
    return out


# --- job planning (what the rules of the protocol registry expand; torch-free) ----------------------------------
@dataclass(frozen=True)
class InterfaceJob:
    """One job: one registry entry × one task set of one interface, on one GPU."""

    interface: str
    encoder: str
    task_set: str
    tasks: tuple[str, ...]
    datasets: tuple[str, ...]
    resources: dict

    def predictions_path(self, results: str) -> str:
        """Where the job's predictions go, in the layout every protocol's predictions share
        (``predictions/<source>/<encoder>/<name>``: the reliability layer's source is the interface, its name the
        task set)."""
        return f"{results}/predictions/{self.interface}/{self.encoder}/{self.task_set}.parquet"

    def metrics_path(self, results: str) -> str:
        return f"{results}/metrics/{self.interface}/{self.encoder}/{self.task_set}.parquet"


def job_resources(entry: dict, n_datasets: int, n_prompt_sets: int) -> dict:
    """GPU job resources from the entry's size class: one GPU (the Slurm profile routes a ``gpu`` resource to the
    GPU partition), the class's host memory, and its per-dataset runtime × datasets × prompt sets (an MLLM
    generates once per prompt set; a dual encoder embeds the images once, so its prompt sets are free)."""
    from retinabench.registry.sizes import SIZE_CLASSES
    c = SIZE_CLASSES[entry["size_class"]]
    passes = n_prompt_sets if "mllm" in (entry.get("interfaces") or []) else 1
    return {"gpu": 1, "mem_mb": c["mem_mb"], "runtime": int(c["runtime"] * max(1, n_datasets) * max(1, passes))}


def plan_jobs(interface: str, encoders: Mapping[str, dict], tasks: Mapping[str, dict], prompts,
              *, names: Sequence[str] | None = None, task_sets: Mapping[str, Sequence[str]] | None = None,
              prompt_sets: Sequence[str] | None = None) -> tuple[list[InterfaceJob], pd.DataFrame]:
    """The jobs of one interface: every selected entry (``names``, or all that declare it) × every task set
    (``task_sets``: name -> task names; default one set ``all`` of the given ``tasks``). A task no prompt set of
    the interface covers is not silently dropped: it is a row of the returned skipped table (interface, task_set,
    task, reason), which the caller prints; a task set left empty gets no job."""
    spec = INTERFACES[interface]
    chosen = selected_entries(encoders, interface, names)
    sets = {"all": list(tasks)} if task_sets is None else {k: list(v) for k, v in task_sets.items()}
    jobs, skipped = [], []
    for set_name, members in sets.items():
        unknown = [t for t in members if t not in tasks]
        if unknown:
            raise KeyError(f"{interface} task set {set_name!r}: tasks {unknown} are not in the task registry / grid")
        kept, n_sets = [], 0
        for t in members:
            covering = prompts.sets_for(spec.entry_interface, tasks[t])
            if prompt_sets is not None:
                covering = [s for s in covering if s in prompt_sets]
            if not covering:
                why = "; ".join(f"{s}: {r}" for s, r in prompts.skipped_sets(spec.entry_interface, tasks[t]).items())
                skipped.append({"interface": interface, "task_set": set_name, "task": t,
                                "reason": f"no {spec.entry_interface} prompt set covers it (harmonised "
                                          f"{tasks[t].get('harmonised')!r})" + (f"; {why}" if why else "")})
                continue
            kept.append(t)
            n_sets = max(n_sets, len(covering))
        if not kept:
            continue
        datasets = tuple(sorted({tasks[t]["dataset"] for t in kept}))
        for name in chosen:
            jobs.append(InterfaceJob(interface, name, set_name, tuple(kept), datasets,
                                     job_resources(encoders[name], len(datasets), n_sets)))
    return jobs, pd.DataFrame(skipped, columns=["interface", "task_set", "task", "reason"])
