# Reliability stage: calibration, thresholds, fairness and quality gaps, transfer, paired bootstrap.
# Jobs: transfer (encoder x harmonised group with >= 2 datasets), reliability (one per predictions table),
# reliability_collect, reliability_paired and four figure jobs. Formulas and outputs: docs/reliability.md.
from retinabench import skipped as SKIP
from retinabench.data.derived import transfer_groups
from retinabench.stages_reliability import KINDS as REL_KINDS
from retinabench.stages_reliability import reliability_settings

RELIABILITY = reliability_settings(config)
REL = f"{R}/reliability"
PLAN_TASKS = {t: REG.task(t) for t in PLAN.tasks}
TRANSFER_GROUPS = transfer_groups(PLAN_TASKS)
# Settings each per-job table depends on (figure, paired and transfer settings only rerun their own jobs).
REL_JOB_SETTINGS = {k: v for k, v in RELIABILITY.items() if k not in ("figures", "paired", "transfer", "harmonised")}
REL_CODE = code_hash("metrics", "stats/bootstrap.py", "data/derived.py", "stages_reliability.py")
# figure -> its input tables. Each figure is a folder of panel groups (one file per dataset / attribute /
# harmonised task, figures/reliability.py) plus skipped.csv (groups left out for lack of data, and why).
REL_FIGURES = {"reliability_diagrams": ["bins", "calibration"],
               "fairness_gaps": ["gaps"],
               "subgroup_scatter": ["subgroups"],
               "transfer": ["metrics"]}


def transfer_prediction_files():
    return {f"transfer/{e}/{g}": f"{R}/predictions/transfer/{e}/{g}.parquet"
            for e in PLAN.encoders for g in TRANSFER_GROUPS}


def reliability_prediction_files():
    """Predictions tables the reliability layer evaluates, {"<source>/<encoder>/<task or group>": path}, where
    the path is {R}/predictions/<source>/<encoder>/<task or group>.parquet. Another protocol's predictions (same
    schema) = one more line."""
    files = {f"frozen/{e}/{t}": f"{R}/predictions/frozen/{e}/{t}.parquet" for e in PLAN.encoders for t in PLAN.tasks}
    files.update(finetune_prediction_files())  # finetune.smk: fine-tuning / augmented linear probing, when enabled
    files.update(transfer_prediction_files())
    return files


def _rel_tasks(source, name):
    """Task names a predictions table covers: a transfer group's tasks, else the task itself."""
    return TRANSFER_GROUPS[name] if source == "transfer" else [name]


def _rel_datasets(source, name):
    return list(dict.fromkeys(REG.task(t)["dataset"] for t in _rel_tasks(source, name)))


def _rel_job(kind):
    return [f"{REL}/jobs/{key}/{kind}.parquet" for key in reliability_prediction_files()]


REL_FIGURE_NAMES = [f for f in REL_FIGURES if f != "transfer" or TRANSFER_GROUPS]
RELIABILITY_SKIPPED = [] if TRANSFER_GROUPS else [SKIP.record(
    "transfer", "no harmonised task is shared by two selected datasets (out-of-distribution transfer needs a "
                "second dataset with the task)")]


def reliability_figure_targets():
    return [f"{R}/figures/reliability/{f}" for f in REL_FIGURE_NAMES]


def reliability_targets():
    """Reliability outputs requested by `all`."""
    return ([f"{REL}/{k}.parquet" for k in REL_KINDS]
            + [f"{REL}/subgroup_metrics.parquet", f"{REL}/summary_scores.parquet",
               f"{REL}/paired_comparisons.parquet", f"{REL}/paired_domains.parquet"]
            + reliability_figure_targets())


rule transfer:
    input:
        features=lambda wc: [f"{R}/features/{wc.encoder}/{d}.parquet" for d in _rel_datasets("transfer", wc.group)],
        splits=lambda wc: [f"{R}/splits/{REG.task(t)['dataset']}/{t}.parquet" for t in TRANSFER_GROUPS[wc.group]],
    output:
        predictions=f"{R}/predictions/transfer/{{encoder}}/{{group}}.parquet",
    params:
        stage="transfer",
        code=code_hash("protocols"),
        tasks=lambda wc: [REG.task(t) for t in TRANSFER_GROUPS[wc.group]],
        transfer=RELIABILITY["transfer"],
        probes={"knn": config["knn"], "linear": config["linear"], "logreg": config["logreg"]},
    wildcard_constraints:
        group="|".join(map(re.escape, TRANSFER_GROUPS)) or "(?!)",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    log:
        f"{R}/logs/transfer/{{encoder}}/{{group}}.log",
    script:
        STAGE


rule reliability:
    input:
        predictions=f"{R}/predictions/{{source}}/{{encoder}}/{{name}}.parquet",
        manifests=lambda wc: [f"{R}/data/{d}/manifest.parquet" for d in _rel_datasets(wc.source, wc.name)],
        exclusions=lambda wc: [f"{R}/data/{d}/exclusions.parquet" for d in _rel_datasets(wc.source, wc.name)],
        splits=lambda wc: [f"{R}/splits/{REG.task(t)['dataset']}/{t}.parquet" for t in _rel_tasks(wc.source, wc.name)],
    output:
        **{k: f"{REL}/jobs/{{source}}/{{encoder}}/{{name}}/{k}.parquet" for k in REL_KINDS},
    params:
        stage="reliability",
        code=REL_CODE,
        reliability=REL_JOB_SETTINGS,
        tasks=lambda wc: {t: REG.task(t) for t in _rel_tasks(wc.source, wc.name)},
    wildcard_constraints:
        source="[a-z][a-z0-9_]*",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    log:
        f"{R}/logs/reliability/{{source}}/{{encoder}}/{{name}}.log",
    script:
        STAGE


rule reliability_collect:
    input:
        **{k: _rel_job(k) for k in REL_KINDS},
    output:
        **{k: f"{REL}/{k}.parquet" for k in REL_KINDS},
        subgroup_metrics=f"{REL}/subgroup_metrics.parquet",
        scores=f"{REL}/summary_scores.parquet",
    params:
        stage="reliability_collect",
        code=REL_CODE,
        reliability={**REL_JOB_SETTINGS, "harmonised": RELIABILITY["harmonised"]},
        tasks=PLAN_TASKS,
        datasets=PLAN.datasets,
    log:
        f"{R}/logs/reliability/collect.log",
    script:
        STAGE


def _paired_sources():
    out = {}
    for key, path in reliability_prediction_files().items():
        source = key.split("/")[0]
        if source in RELIABILITY["paired"]["sources"]:
            out.setdefault(source, []).append(path)
    return out


rule reliability_paired:
    input:
        predictions=[p for paths in _paired_sources().values() for p in paths],
        manifests=[f"{R}/data/{d}/manifest.parquet" for d in PLAN.datasets],
    output:
        comparisons=f"{REL}/paired_comparisons.parquet",
        domains=f"{REL}/paired_domains.parquet",
    params:
        stage="reliability_paired",
        code=REL_CODE,
        reliability={k: RELIABILITY[k] for k in ("paired", "bootstrap", "n_bins")},
        tasks=PLAN_TASKS,
        sources=_paired_sources(),
        encoders=PLAN.encoders,
    log:
        f"{R}/logs/reliability/paired.log",
    script:
        STAGE


rule reliability_figure:
    input:
        unpack(lambda wc: {k: f"{REL}/{k}.parquet" for k in REL_FIGURES[wc.figure]}),
    output:
        dir=report(directory(f"{R}/figures/reliability/{{figure}}"), patterns=["{panel}.png"],
                   caption="../report/reliability_figure.rst", category=lambda wc: SKIP.SECTIONS[wc.figure],
                   subcategory="{figure}", labels={"figure": "{figure}", "panel": "{panel}"}),
    params:
        stage="reliability_figure",
        code=code_hash("figures/reliability.py", "figures/style.py", "skipped.py"),
        figure=lambda wc: wc.figure,
        reliability={"figures": RELIABILITY["figures"]},
        protocols=config["protocols"],
        encoders=lambda wc: {e: REG.encoder(e) for e in PLAN.encoders},
        groups=TRANSFER_GROUPS,
    wildcard_constraints:
        figure="|".join(REL_FIGURES),
    log:
        f"{R}/logs/figures/reliability/{{figure}}.log",
    script:
        STAGE
