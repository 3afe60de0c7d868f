"""Stages of workflow/rules/analysis.smk: the tidy metrics table, then one stage per analysis family, registered
under the family's rule name (retinabench.analysis.plan.FAMILY_RULES; retinabench.analysis does the work)."""
from __future__ import annotations

from typing import Callable

import pandas as pd

from retinabench.analysis.context import FAMILIES, AnalysisContext
from retinabench.analysis.families import FAMILY_FUNCTIONS, read_input, run_family
from retinabench.analysis.plan import FAMILY_RULES
from retinabench.pipeline.job import Job, write_outputs
from retinabench.pipeline.registry import stage
from retinabench.schemas import read_table


@stage("collect_metrics")
def stage_collect_metrics(job: Job) -> None:
    frames = [read_table(f, "metrics") for f in job.input["metrics"]]
    metrics = pd.concat(frames, ignore_index=True)
    write_outputs(job, {"metrics": metrics, "csv": metrics}, kinds={"metrics": "metrics"}, config={})


def family_stage(family: str) -> Callable[[Job], None]:
    def run(job: Job) -> None:
        ctx = AnalysisContext.from_params(job.params)
        inputs = {k: read_input(k, job.input[k]) for k in FAMILIES[family].inputs}
        written = run_family(family, inputs, ctx, dict(job.output))
        config = {k: job.params[k] for k in job.params if k not in ("encoders", "tasks", "datasets")}
        registry = {k: job.params[k] for k in ("encoders", "tasks", "datasets") if k in job.params}
        write_outputs(job, written=written, config=config, extra={"family": family, "registry_fields": registry})
    run.__name__ = run.__qualname__ = f"stage_{family}"
    run.__doc__ = f"The {family!r} analysis family (retinabench.analysis.families.FAMILY_FUNCTIONS)."
    return run


for _family in FAMILY_FUNCTIONS:
    stage(FAMILY_RULES[_family][0])(family_stage(_family))
