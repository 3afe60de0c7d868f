"""Plan of workflow/rules/saliency.smk: saliency maps of the fine-tuned models (needs fine-tuning; off unless
enabled)."""
from __future__ import annotations

from retinabench.plan.core import CorePlan, alternatives
from retinabench.plan.finetune import FinetunePlan
from retinabench.regimes import trained_on
from retinabench.plan.selection import device_problems

# Minutes per attributed image on one GPU (nt_samples x n_steps = 2500 forward+backward passes) by size class.
SALIENCY_RUNTIME = {"tiny": 1, "small": 2, "base": 4, "large": 8, "huge": 16, "giant": 32}


class SaliencyPlan:
    def __init__(self, core: CorePlan, ft: FinetunePlan):
        self.core, self.ft = core, ft
        s = self.settings = core.settings.saliency
        self.on = s.enabled
        self.encoders = list(s.encoders or ft.encoders)
        self.tasks = list(s.tasks or ft.tasks)
        self.protocols = list(s.protocols or ft.protocols)
        self.seed = s.checkpoint_seed if s.checkpoint_seed is not None else ft.seeds[0]
        self.job_settings = s.job()
        self.threads = s.threads
        self.constraints = {"protocol": alternatives(self.protocols), "encoder": alternatives(self.encoders),
                            "task": alternatives(self.tasks), "seed": alternatives([self.seed])}

    def problems(self) -> tuple[list[str], dict]:
        """(device problems, settings that leave saliency without fine-tuned models) when saliency is on."""
        if not self.on:
            return [], {}
        ft, s = self.ft, self.settings
        bad = {"finetune.enabled": [] if ft.on else ["false"],
               "encoders": sorted(set(self.encoders) - set(ft.encoders)),
               "tasks": sorted(set(self.tasks) - set(ft.tasks)),
               "protocols": sorted(set(self.protocols) - set(ft.protocols)),
               "checkpoint_seed": [] if self.seed in ft.seeds else [self.seed],
               "train_regime": ([] if trained_on(ft.regimes, s.train_regime)
                                else [s.train_regime])}
        bad = {k: v for k, v in bad.items() if v}
        if bad:
            raise ValueError(f"saliency: needs fine-tuned models, but these settings have none: {bad} (fine-tuning "
                             f"runs encoders {ft.encoders}, tasks {ft.tasks}, protocols {ft.protocols}, seeds "
                             f"{ft.seeds}, regimes {ft.regimes})")
        return device_problems(s.device, "saliency.device", local=self.core.local), bad

    def weights(self, protocol, encoder, task, seed) -> str:
        return self.core.path("model_weights", protocol=protocol, encoder=encoder, task=task, seed=seed)

    def inputs(self, wc) -> dict[str, str]:
        inputs = {**self.core.images_of_task(wc.task), **self.core.local_weights(wc.encoder)}
        inputs.update({f"weights_{p}": self.weights(p, wc.encoder, wc.task, self.seed) for p in self.protocols})
        return inputs

    def runtime(self, wc) -> int:
        import math
        s = self.settings
        n = len(self.core.reg.task(wc.task)["classes"]) * s.images_per_class * len(self.protocols)
        per = SALIENCY_RUNTIME[self.core.reg.encoder(wc.encoder)["size_class"]] * s.nt_samples * s.n_steps / 2500
        return max(10, math.ceil(n * per))

    def targets(self) -> list[str]:
        if not self.on:
            return []
        core = self.core
        return ([core.path("saliency_figure", task=t, ext="png") for t in self.tasks]
                + [core.path("saliency", encoder=e, task=t, ext="parquet") for e in self.encoders for t in self.tasks])

    def figure_inputs(self, wc) -> dict[str, list[str]]:
        """A task's saliency figure: every saliency encoder's table and maps of the task."""
        return {"tables": [self.core.path("saliency", encoder=e, task=wc.task, ext="parquet") for e in self.encoders],
                "maps": [self.core.path("saliency", encoder=e, task=wc.task, ext="npz") for e in self.encoders]}
