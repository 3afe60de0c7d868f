"""Plan of workflow/rules/finetune.smk: full fine-tuning and augmented linear probing, one job per (protocol,
encoder, task, seed), and the two-stage learning-rate sweep. Off unless `finetune: {enabled: true}`."""
from __future__ import annotations

import math

from retinabench.plan.core import CorePlan, alternatives
from retinabench.regimes import train_sides
from retinabench.settings import FINETUNE_PROTOCOLS, SWEEP_STAGES, FinetuneSettings

# What a job's result depends on (its params: editing anything else, e.g. the task list, reruns nothing).
NOT_RESULT = FinetuneSettings.NOT_RESULT
LRS = ("lr_encoder", "lr_classifier")
# Minutes for one run of the paper's schedule (100 x 25 steps of 64 images + validation) by encoder size class,
# on one GPU; scaled by the number of runs and steps of a job.
RUNTIME = {"tiny": 30, "small": 45, "base": 90, "large": 180, "huge": 360, "giant": 720}


def train_regimes(regimes) -> int:
    """How many models one fine-tuning job trains: one per training side of its regimes."""
    return len(train_sides(regimes))


class FinetunePlan:
    protocol_constraint = alternatives(FINETUNE_PROTOCOLS)
    stages = SWEEP_STAGES

    def __init__(self, core: CorePlan):
        self.core, config = core, core.settings
        ft = self.settings = config.finetune
        sw = self.sweep = config.sweep
        self.on = ft.enabled
        self.protocols = list(ft.protocols)
        self.encoders = list(ft.encoders or core.encoders)
        self.tasks = list(ft.tasks or core.tasks)
        self.seeds = list(ft.seeds if ft.seeds is not None else config.seeds)
        self.regimes = list(ft.regimes or config.regimes)
        for e in self.encoders:
            core.reg.encoder(e)
        if set(self.tasks) - set(core.tasks):
            raise ValueError(f"finetune.tasks {sorted(set(self.tasks) - set(core.tasks))} are not tasks of this "
                             f"config (its datasets' tasks: {core.tasks})")
        self.sweep_on = self.on and sw.enabled
        self.sweep_task: str | None
        self.sensitivity_task: str | None
        self.sweep_task, self.sensitivity_task = sw.tasks(self.tasks) if self.sweep_on else (None, None)
        self.sweep_tasks = [t for t in (self.sweep_task, self.sensitivity_task) if t]
        # The encoders swept on the sensitivity task too (sweep.sensitivity_encoders; every one by default).
        self.sensitivity_encoders = sw.sensitivity_of(self.encoders) if self.sensitivity_task else []
        if set(self.sweep_tasks) - set(core.tasks):
            raise ValueError(f"sweep tasks {sorted(set(self.sweep_tasks) - set(core.tasks))} are not tasks of this "
                             f"config (its datasets' tasks: {core.tasks})")
        self.job_settings = ft.plain(exclude=set(NOT_RESULT + (LRS if self.sweep_on else ())))
        self.sweep_job_settings = ft.plain(exclude=set(NOT_RESULT + LRS))
        self.threads = ft.threads

    # -- paths ---------------------------------------------------------------------------------------------
    def path(self, kind, protocol, encoder, task, seed, ext="parquet") -> str:
        return self.core.path("finetune_run", kind=kind, protocol=protocol, encoder=encoder, task=task, seed=seed,
                              ext=ext)

    def outputs(self, protocol="{protocol}", encoder="{encoder}", task="{task}", seed="{seed}") -> dict[str, str]:
        return {k: self.path(k if k != "log" else "training_logs", protocol, encoder, task, seed)
                for k in ("predictions", "log", "metrics", "compute")}

    def sweep_path(self, encoder, task, stage, kind) -> str:
        return self.core.path("sweep_stage", encoder=encoder, task=task, stage=stage, kind=kind)

    def inputs(self, wc) -> dict[str, str]:
        inputs = {**self.core.images_of_task(wc.task), **self.core.local_weights(wc.encoder)}
        if self.sweep_on:
            inputs["lr"] = self.core.path("sweep_chosen", encoder=wc.encoder)
        return inputs

    def sweep_inputs(self, stage: int):
        """A sweep job of ``stage``: the task's images, the encoder's local weights, stage 2 also stage 1's runs."""
        def inputs(wc) -> dict[str, str]:
            out = {**self.core.images_of_task(wc.task), **self.core.local_weights(wc.encoder)}
            if stage == 2:
                out["stage1"] = self.sweep_path(wc.encoder, wc.task, 1, "runs")
            return out
        return inputs

    def grid(self):
        return [(p, e, t, s) for p in self.protocols for e in self.encoders for t in self.tasks for s in self.seeds]

    def metrics_files(self) -> list[str]:
        return [self.path("metrics", *key) for key in self.grid()] if self.on else []

    def compute_files(self) -> list[str]:
        return [self.path("compute", *key) for key in self.grid()] if self.on else []

    def prediction_files(self) -> dict[str, str]:
        """{"<protocol>/<encoder>/<task>": path} of the per-(encoder, task) predictions (all seeds), the layout of
        the frozen protocols' tables (for the reliability layer)."""
        if not self.on:
            return {}
        return {f"{p}/{e}/{t}": self.core.path("predictions", source=p, encoder=e, name=t) for p in self.protocols
                for e in self.encoders for t in self.tasks}

    def encoder_sweep_tasks(self, encoder) -> list[str]:
        """The tasks ``encoder`` is swept on: the sweep task, and the sensitivity task when it is one of
        sweep.sensitivity_encoders."""
        return [t for t in self.sweep_tasks if t != self.sensitivity_task or encoder in self.sensitivity_encoders]

    def sweep_stage_files(self, encoder, kind) -> list[str]:
        return [self.sweep_path(encoder, t, s, kind) for t in self.encoder_sweep_tasks(encoder) for s in self.stages]

    def sweep_regimes(self, task) -> list[str]:
        """The regimes of a sweep job's runs: sweep.sensitivity_regimes on the sensitivity task (when set), else
        sweep.regimes."""
        return self.sweep.run_regimes(task == self.sensitivity_task)

    def targets(self) -> list[str]:
        if not self.on:
            return []
        targets = list(self.prediction_files().values()) + [self.core.path("finetune_compute")]
        if self.sweep_on:
            targets += [self.core.path("lr_sweep_metrics"), self.core.path("lr_sensitivity")]
        return targets

    # -- settings and resources ----------------------------------------------------------------------------
    def checkpoints(self, wc) -> str:
        return self.core.path("finetune_checkpoints", protocol=wc.protocol, encoder=wc.encoder, task=wc.task,
                              seed=wc.seed)

    def sweep_checkpoints(self, stage):
        return lambda wc: self.core.path("sweep_checkpoints", encoder=wc.encoder, task=wc.task, stage=stage)

    def runtime_minutes(self, encoder, runs, epochs, steps_per_epoch) -> int:
        minutes = RUNTIME[self.core.reg.encoder(encoder)["size_class"]] * runs * epochs * steps_per_epoch / 2500
        return max(10, math.ceil(minutes))

    def runtime(self, wc) -> int:
        ft = self.settings
        return self.runtime_minutes(wc.encoder, train_regimes(self.regimes), ft.epochs, ft.steps_per_epoch)

    def sweep_params(self, stage):
        """A sweep stage's params: the encoder's grid and the sweep settings its runs read (plain data)."""
        lr_name, sw = self.stages[stage][1], self.sweep
        run = sw.plain(include={"seeds", "epochs", "steps_per_epoch"})
        return lambda wc: {"grid": sw.grid(wc.encoder)[lr_name], **run, "regimes": self.sweep_regimes(wc.task)}

    def sweep_runtime(self, stage):
        sw, ft = self.sweep, self.settings

        def runtime(wc):
            g = sw.grid(wc.encoder)[self.stages[stage][1]]
            runs = len(g) * len(sw.seeds) * train_regimes(self.sweep_regimes(wc.task))
            return self.runtime_minutes(wc.encoder, runs,
                                        sw.epochs or ft.epochs, sw.steps_per_epoch or ft.steps_per_epoch)
        return runtime
