"""Stages of workflow/rules/analysis.smk: the tidy metrics table, then one stage per analysis family, registered
under the family's rule name (its record in retinabench.analysis.context.FAMILIES; retinabench.analysis does the
work)."""
from __future__ import annotations

from typing import Callable

import pandas as pd

from retinabench.analysis.context import FAMILIES, AnalysisContext
from retinabench.analysis.families import read_input, run_family
from retinabench.pipeline.job import Job, write_outputs
from retinabench.pipeline.stages import stage
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
    run.__doc__ = f"The {family!r} analysis family (retinabench.analysis.context.FAMILIES)."
    return run


for _family in FAMILIES.values():
    stage(_family.rule)(family_stage(_family.name))


@stage("baselines")
def stage_baselines(job: Job) -> None:
    """Majority-class and chance levels of every task, regime and split (stats.baselines), from the splits."""
    from retinabench.stats.baselines import baselines_table
    tasks = job.params["tasks"]
    splits = {}
    for path in job.input["splits"]:
        split = read_table(path, "split")
        for name in split["task"].unique():
            splits[str(name)] = split
    table = baselines_table(splits, tasks, list(job.params["regimes"]))
    write_outputs(job, {"baselines": table}, config={"regimes": job.params["regimes"]},
                  extra={"registry_fields": {"tasks": tasks}, "doc": "retinabench.stats.baselines"})


@stage("skipped_analyses")
def stage_skipped_analyses(job: Job) -> None:
    """The skipped-analyses table (retinabench.skipped): planned skips, figure jobs' records, reliability."""
    from retinabench import skipped
    figure_tables = dict(job.params["figure_tables"])
    table = skipped.collect(job.params["planned"], figure_tables, coverage=job.input.get("coverage"),
                            subgroup_table=job.input.get("subgroup_table"), produced=job.params["produced"])
    inputs = [*figure_tables.values(), *(job.input[k] for k in ("coverage", "subgroup_table") if k in job.input)]
    write_outputs(job, {"table": table}, inputs=inputs,  # files (the figure inputs are folders)
                  config={"planned": job.params["planned"]}, extra={"n_skipped": int(len(table))})
