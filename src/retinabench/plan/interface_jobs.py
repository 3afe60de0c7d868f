"""The jobs of the prompt-based interfaces (zeroshot, mllm): which registry entries run an interface, one job per
(entry, task set) with its GPU resources, and the tasks no prompt set covers (a skipped table). Torch-free; the
interfaces themselves (their specs, job functions, extra columns) are in retinabench.protocols.interfaces."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import pandas as pd

from retinabench.plan.paths import Paths
from retinabench.protocols.interfaces import INTERFACES

__all__ = ["InterfaceJob", "job_resources", "plan_jobs", "selected_entries"]


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
        return Paths(results).path("predictions", source=self.interface, encoder=self.encoder, name=self.task_set)

    def metrics_path(self, results: str) -> str:
        return Paths(results).path("job_metrics", source=self.interface, encoder=self.encoder, name=self.task_set)


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
