"""Plan of workflow/rules/compute.smk: the per-encoder compute benchmark (off unless enabled)."""
from __future__ import annotations

from retinabench.plan.core import CorePlan, alternatives
from retinabench.plan.finetune import FinetunePlan
from retinabench.plan.selection import device_problems, unpinned_encoders

COMPUTE_RUNTIME = {"tiny": 15, "small": 20, "base": 30, "large": 45, "huge": 90, "giant": 120}  # min, one GPU


class ComputePlan:
    def __init__(self, core: CorePlan, ft: FinetunePlan):
        from retinabench.figures.compute import FIGURES
        self.core, self.figures = core, FIGURES
        c = self.settings = core.settings.compute
        self.on = c.enabled
        self.encoders = list(c.encoders or core.encoders)
        self.task = c.task or core.tasks[0]
        self.job_settings = c.job()
        self.train = ft.settings.plain(include={"channels_last", "compile", "weight_decay"})  # FT's step settings
        self.threads = c.threads
        self.encoder_constraint = alternatives(self.encoders)
        for e in self.encoders:
            core.reg.encoder(e)
        if self.on and self.task not in core.tasks:
            raise ValueError(f"compute.task {self.task!r} is not a task of this config (its tasks: {core.tasks})")

    def problems(self) -> list[str]:
        """Unpinned encoders beyond the config's own, and device problems (the config's are checked elsewhere)."""
        if not self.on:
            return []
        return (unpinned_encoders(self.core.reg, sorted(set(self.encoders) - set(self.core.encoders)))
                + device_problems(self.settings.device, "compute.device", local=self.core.local))

    def inputs(self, wc) -> dict[str, str]:
        """A benchmark job: the task's image cache and split, the encoder's local weights."""
        return {**self.core.images_of_task(self.task), **self.core.local_weights(wc.encoder)}

    def runtime(self, wc) -> int:
        return COMPUTE_RUNTIME[self.core.reg.encoder(wc.encoder)["size_class"]]

    def targets(self) -> list[str]:
        if not self.on:
            return []
        core = self.core
        return [core.path("compute_table")] + [core.path("compute_figure", figure=f, ext="png") for f in self.figures]

    def benchmark_tables(self) -> list[str]:
        return [self.core.path("compute_benchmark", encoder=e) for e in self.encoders]

    def figure_outputs(self, report) -> dict:
        """The figures (``report()`` wrapped, caption appendix/compute.rst) and their PDF twins."""
        core, out = self.core, {}
        for f in self.figures:
            out[f] = report(core.path("compute_figure", figure=f, ext="png"), caption="../report/appendix/compute.rst",
                            category="8. Saliency and compute", subcategory="Compute",
                            labels={"figure": f.replace("_", " ")})
        out.update({f"{f}_pdf": core.path("compute_figure", figure=f, ext="pdf") for f in self.figures})
        return out
