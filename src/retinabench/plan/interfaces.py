"""Plan of workflow/rules/interfaces.smk: the `prompts` protocols of the registry (zero-shot, MLLM yes/no), one GPU
job per (registry entry, task set) per enabled interface (retinabench.plan.interface_jobs.plan_jobs), and the
two interface tables (prompt-variant spread, zero-shot ECE difference)."""
from __future__ import annotations

import sys

from retinabench.plan.core import CorePlan


class InterfacesPlan:
    def __init__(self, core: CorePlan):
        from retinabench.plan.interface_jobs import plan_jobs
        from retinabench.protocols.interfaces import INTERFACES
        from retinabench.protocols.registry import PROTOCOLS
        self.core = core
        self.prompts_path = core.settings.registries.prompts
        self.settings = {i: PROTOCOLS.get(i).settings(core.settings) for i in INTERFACES}
        self.enabled = [i for i in INTERFACES if self.settings[i].enabled]
        self.jobs, self.skipped = {}, []
        if not self.enabled:
            return
        from retinabench.prompts import load_prompts
        prompts = load_prompts(self.prompts_path)
        tasks = {t: core.reg.task(t) for t in core.tasks}
        encoders = {n: core.reg.encoder(n) for n in core.reg.encoders}
        for i in self.enabled:
            s = self.settings[i]
            jobs, skipped = plan_jobs(i, encoders, tasks, prompts, names=s.encoders, task_sets=s.task_sets,
                                      prompt_sets=s.prompt_sets)
            self.jobs.update({(j.interface, j.encoder, j.task_set): j for j in jobs})
            self.skipped += skipped.to_dict("records")

    def notes(self) -> list[str]:
        """What the start-up prints: tasks no prompt set covers (not run, with the reason)."""
        return [f"{r['interface']}: task {r['task']} of task set {r['task_set']} is not run: {r['reason']}"
                for r in self.skipped]

    def job(self, interface: str, wc):
        return self.jobs[(interface, wc.encoder, wc.task_set)]

    def encoders(self) -> list[str]:
        return sorted({j.encoder for j in self.jobs.values()})

    # -- paths -----------------------------------------------------------------------------------------------
    def prediction_files(self) -> dict[str, str]:
        """{"<interface>/<encoder>/<task set>": path}: the reliability layer's source is the interface."""
        return {f"{i}/{e}/{t}": j.predictions_path(self.core.R) for (i, e, t), j in sorted(self.jobs.items())}

    def metrics_files(self) -> list[str]:
        return [j.metrics_path(self.core.R) for _, j in sorted(self.jobs.items())]

    def tasks_of(self, source: str, name: str) -> list[str] | None:
        """Tasks of an interface job's predictions table (None: not an interface source)."""
        hits = [j for (i, _, t), j in self.jobs.items() if i == source and t == name]
        return list(hits[0].tasks) if hits else None

    def tables(self) -> dict[str, str]:
        out = {}
        if self.jobs:
            out["prompt_sensitivity"] = self.core.path("interface_table", table="prompt_sensitivity")
        if any(i == "zeroshot" for i, _, _ in self.jobs):
            out["zeroshot_ece_difference"] = self.core.path("interface_table", table="zeroshot_ece_difference")
        return out

    def targets(self) -> list[str]:
        return self.metrics_files() + list(self.tables().values())

    # -- one job ---------------------------------------------------------------------------------------------
    def inputs(self, interface: str):
        return lambda wc: self.job_inputs(interface, wc)

    def params(self, interface: str):
        return lambda wc: self.job_params(interface, wc)

    def locations(self, interface: str):
        """The job's ``locations`` param (CorePlan.located): the raw folders of ``native`` inputs, merged into its
        ``job`` param as ``roots``; the raw files' snapshots (inputs) decide a rerun, not where the folders are."""
        return self.core.located(job=lambda wc: self.image_params(interface, self.job(interface, wc).datasets))

    def job_inputs(self, interface: str, wc) -> dict:
        j, core = self.job(interface, wc), self.core
        out = {"prompts": self.prompts_path,
               "splits": [core.task_split(t) for t in j.tasks],
               "manifests": [core.path("manifest", dataset=d) for d in j.datasets]}
        out.update(self.image_inputs(interface, j.datasets))
        out.update(core.local_weights(wc.encoder))
        return out

    def image_inputs(self, interface: str, datasets) -> dict:
        """The images' files by the interface's ``inputs``: the image cache of each dataset (``cache``), or its raw
        files' snapshot (``native``: the job decodes the originals, and reruns when they change)."""
        core = self.core
        if self.settings[interface].inputs == "native":
            return {f"raw_files_{d}": core.path("raw_files", dataset=d) for d in datasets}
        return {f"{k}_{d}": v for d in datasets for k, v in core.cache_files(d).items()}

    def image_params(self, interface: str, datasets) -> dict:
        """``native`` inputs: the raw folder of each dataset (``roots``, a location: :meth:`locations`); nothing
        for ``cache``."""
        if self.settings[interface].inputs != "native":
            return {}
        return {"roots": {d: self.core.selection.dataset_root(d) for d in datasets}}

    def job_params(self, interface: str, wc) -> dict:
        j = self.job(interface, wc)
        return {"entry": self.core.reg.encoder(wc.encoder), "tasks": [self.core.reg.task(t) for t in j.tasks],
                "datasets": list(j.datasets), "settings": self.settings[interface].plain()}

    def resource(self, interface: str, key: str):
        return lambda wc: self.job(interface, wc).resources[key]

    def outputs(self, interface: str) -> dict[str, str]:
        core = self.core
        return {"predictions": core.path("predictions", source=interface, name="{task_set}"),
                "metrics": core.path("job_metrics", source=interface, name="{task_set}")}

    def table_params(self) -> dict:
        return {"tasks": {t: self.core.reg.task(t) for t in self.core.tasks}}

    def table_inputs(self) -> dict:
        return {"metrics": self.metrics_files(),
                "zeroshot": [p for k, p in self.prediction_files().items() if k.startswith("zeroshot/")]}

    def problems(self) -> list[str]:
        """The interfaces' entries that need a lock record and have none or a stale one (the encoders' rule)."""
        from retinabench.plan.selection import unpinned_encoders
        return unpinned_encoders(self.core.reg, self.encoders())

    def print_notes(self) -> None:
        for note in self.notes():
            print(f"retinabench: {note}", file=sys.stderr)
