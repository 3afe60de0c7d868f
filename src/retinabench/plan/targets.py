"""Which outputs of a plan depend on given encoders and / or tasks (``retinabench targets``): every job output of
the plan with the encoders and tasks it is built from — per-job files (features, probe predictions and metrics,
fine-tuning runs and sweeps, transfer, interface and LoRA jobs, reliability tables, saliency, compute) from the
job grids, aggregates (the metrics table, analysis tables and figures, reliability summaries and figures, sweep,
compute and LoRA collections) from the jobs they gather. Paths come from the plan's path table
(retinabench.plan.paths), never from string matching.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

__all__ = ["Output", "dependent_outputs", "plan_outputs"]


@dataclass(frozen=True)
class Output:
    """One output file (or folder) and the encoders and tasks it is built from (empty: depends on none of them,
    e.g. features do not depend on a task, the baselines on no encoder)."""

    path: str
    encoders: frozenset[str]
    tasks: frozenset[str]


def _out(path: str, encoders: Iterable[str] = (), tasks: Iterable[str] = ()) -> Output:
    return Output(path, frozenset(encoders), frozenset(tasks))


def _per_job(p) -> list[Output]:
    """Files of one job each, with the encoder and tasks of that job."""
    out: list[Output] = []
    for e in p.encoders:
        out += [_out(p.features(e, d), [e]) for d in p.datasets]
    out += [_out(p.task_split(t), (), [t]) for t in p.tasks]
    for e in p.encoders:
        for t in p.tasks:
            out += [_out(p.path(kind, source="frozen", encoder=e, name=t), [e], [t])
                    for kind in ("predictions", "training_log", "job_metrics")]
    ft = p.finetune
    if ft.on:
        for key in ft.grid():
            _, e, t, _ = key
            out += [_out(path, [e], [t]) for path in ft.outputs(*key).values()]
        for key, path in ft.prediction_files().items():
            _, e, t = key.split("/")
            out.append(_out(path, [e], [t]))
        if ft.sweep_on:
            for e in ft.encoders:
                out += [_out(f, [e], ft.encoder_sweep_tasks(e)) for kind in ("metrics", "runs")
                        for f in ft.sweep_stage_files(e, kind)]
                out += [_out(p.path("sweep_chosen", encoder=e), [e], [ft.sweep_task]),
                        _out(p.path("sweep_sensitivity", encoder=e), [e], ft.encoder_sweep_tasks(e))]
    sal = p.saliency
    if sal.on:
        for e in sal.encoders:
            for t in sal.tasks:
                out += [_out(sal.weights(prot, e, t, sal.seed), [e], [t]) for prot in sal.protocols]
                out += [_out(p.path("saliency", encoder=e, task=t, ext=x), [e], [t]) for x in ("parquet", "npz")]
    rel = p.reliability
    for key, path in rel.transfer_prediction_files().items():
        _, e, g = key.split("/")
        out.append(_out(path, [e], rel.transfer_groups[g]))
    for _, job in sorted(p.interfaces.jobs.items()):
        out += [_out(path, [job.encoder], job.tasks) for path in (job.predictions_path(p.R), job.metrics_path(p.R))]
    lora = p.lora
    for (e, source), job in sorted(lora.jobs.items()):
        out += [_out(path.format(encoder=e, task=source), [e], [source]) for path in lora.train_outputs().values()]
        out += [_out(path.format(encoder=e, task=source), [e], (source, *job.test_tasks))
                for path in lora.infer_outputs().values()]
    for key in rel.prediction_files():
        source, e, name = key.split("/", 2)
        out += [_out(rel.job_table(key, kind), [e], rel.tasks_of(source, name)) for kind in rel.kinds]
    cmp = p.compute
    if cmp.on:
        out += [_out(path, [e], [cmp.task]) for e, path in zip(cmp.encoders, cmp.benchmark_tables())]
    out += [_out(p.path("tiny_model", name=e), [e]) for e in p.tiny_models()]
    return out


def _gathered(outputs: list[Output]) -> tuple[set[str], set[str]]:
    return ({e for o in outputs for e in o.encoders}, {t for o in outputs for t in o.tasks})


def plan_outputs(p) -> list[Output]:
    """Every output of the plan ``p`` (a retinabench.plan.WorkflowPlan) with the encoders and tasks it depends on."""
    jobs = _per_job(p)
    out = list(jobs)
    # every metrics file (frozen, fine-tuning, interfaces) feeds the metrics table, the analysis and the report
    metrics = set(p.metrics_files())
    encs, tasks = _gathered([o for o in jobs if o.path in metrics])
    analysis = [path for family in p.analysis.outputs.values() for path in family.values()]
    out += [_out(path, encs, tasks) for path in
            [p.path("metrics"), p.path("metrics_csv"), p.analysis.skipped_table, *analysis]]
    out.append(_out(p.analysis.baselines_file, (), p.tasks))
    # the reliability layer gathers every predictions table
    predictions = set(p.reliability.prediction_files().values())
    encs, tasks = _gathered([o for o in jobs if o.path in predictions])
    out += [_out(path, encs, tasks) for path in p.reliability.targets()]
    ft = p.finetune
    if ft.on:
        out.append(_out(p.path("finetune_compute"), ft.encoders, ft.tasks))
        if ft.sweep_on:
            out += [_out(p.path(n), ft.encoders, ft.sweep_tasks) for n in ("lr_sweep_metrics", "lr_sensitivity")]
    if p.saliency.on:
        sal = p.saliency
        out += [_out(p.path("saliency_figure", task=t, ext=x), sal.encoders, [t]) for t in sal.tasks
                for x in ("png", "pdf")]
    if p.compute.on:
        cmp = p.compute
        out += [_out(path, cmp.encoders, [cmp.task]) for path in
                [p.path("compute_table")] + [p.path("compute_figure", figure=f, ext=x) for f in cmp.figures
                                             for x in ("png", "pdf")]]
    encs, tasks = _gathered([o for o in jobs if o.path in {j.metrics_path(p.R) for j in p.interfaces.jobs.values()}])
    out += [_out(path, encs, tasks) for path in p.interfaces.tables().values()]
    if p.lora.jobs:
        encs = {e for e, _ in p.lora.jobs}
        tasks = {t for j in p.lora.jobs.values() for t in (j.source, *j.test_tasks)}
        out += [_out(path, encs, tasks) for path in p.lora.delta_outputs().values()]
    return out


def dependent_outputs(p, encoders: Iterable[str] = (), tasks: Iterable[str] = ()) -> list[str]:
    """Paths of the plan's outputs that depend on any of ``encoders`` (if given) and on any of ``tasks`` (if
    given), in plan order, each once."""
    encoders, tasks = set(encoders), set(tasks)
    keep = [o.path for o in plan_outputs(p)
            if (not encoders or o.encoders & encoders) and (not tasks or o.tasks & tasks)]
    return list(dict.fromkeys(keep))
