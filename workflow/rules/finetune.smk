# Fine-tuning stage: full fine-tuning (`finetune`) and augmented linear probing (`linear_aug`), one job per
# (encoder, task, protocol, seed) covering the training regimes; the paper's two-stage learning-rate sweep per
# encoder (one job per encoder, task and stage, looping over the grid). Off unless `finetune: {enabled: true}`
# (config/finetune_demo.yaml is a small opt-in example). Jobs resume from {R}/checkpoints/... after a kill; that
# folder is deliberately not an output, so Snakemake never deletes it before the rerun.
import math

from retinabench.settings import (
    FINETUNE_PROTOCOLS,
    SWEEP_STAGES,
    encoder_grid,
    finetune_settings,
    sweep_settings,
    sweep_tasks,
)

FT = finetune_settings(config)
SW = sweep_settings(config)
FT_ON = bool(FT["enabled"])
FT_ENCODERS = list(FT["encoders"] or PLAN.encoders)
FT_TASKS = list(FT["tasks"] or PLAN.tasks)
FT_SEEDS = list(FT["seeds"] if FT["seeds"] is not None else config["seeds"])
FT_REGIMES = list(FT["regimes"] or config["regimes"])
for _e in FT_ENCODERS:
    REG.encoder(_e)
if set(FT_TASKS) - set(PLAN.tasks):
    raise ValueError(
        f"finetune.tasks {sorted(set(FT_TASKS) - set(PLAN.tasks))} are not tasks of this config "
        f"(its datasets' tasks: {PLAN.tasks})"
    )
SWEEP_ON = FT_ON and bool(SW["enabled"])
SWEEP_TASK, SENS_TASK = sweep_tasks(SW, FT_TASKS) if SWEEP_ON else (None, None)
SWEEP_TASKS = [t for t in (SWEEP_TASK, SENS_TASK) if t]
if set(SWEEP_TASKS) - set(PLAN.tasks):
    raise ValueError(
        f"sweep tasks {sorted(set(SWEEP_TASKS) - set(PLAN.tasks))} are not tasks of this config "
        f"(its datasets' tasks: {PLAN.tasks})"
    )
# What a job's result depends on (its params: editing anything else, e.g. the task list, reruns nothing).
_NOT_RESULT = ("enabled", "protocols", "encoders", "tasks", "seeds", "regimes", "threads")
_LRS = ("lr_encoder", "lr_classifier")
FT_JOB = {k: v for k, v in FT.items() if k not in _NOT_RESULT + (_LRS if SWEEP_ON else ())}
FT_SWEEP = {k: v for k, v in FT.items() if k not in _NOT_RESULT + _LRS}
FT_CODE = ("protocols", "data/image_dataset.py", "models", "metrics")

# Minutes for one run of the paper's schedule (100 x 25 steps of 64 images + validation) by encoder size class,
# on one GPU; scaled by the number of runs and steps of a job.
FT_RUNTIME = {"tiny": 30, "small": 45, "base": 90, "large": 180, "huge": 360, "giant": 720}


def ft_runtime(encoder, runs, epochs, steps_per_epoch):
    minutes = FT_RUNTIME[REG.encoder(encoder)["size_class"]] * runs * epochs * steps_per_epoch / 2500
    return max(10, math.ceil(minutes))


def _train_regimes(regimes):
    return len({r.split("-")[0] for r in regimes})


def _ft_path(kind, protocol, encoder, task, seed, ext="parquet"):
    return f"{R}/{kind}/{protocol}/{encoder}/{task}/seed{seed}.{ext}"


def finetune_inputs(wc):
    dataset = task_dataset(wc)
    inputs = {**cache_files(dataset), "split": f"{R}/splits/{dataset}/{wc.task}.parquet"}
    if SWEEP_ON:
        inputs["lr"] = f"{R}/sweep/{wc.encoder}/chosen.json"
    return inputs


def sweep_path(encoder, task, stage, kind):
    return f"{R}/sweep/{encoder}/{task}/stage{stage}_{kind}.parquet"


def sweep_params(stage):
    lr_name = SWEEP_STAGES[stage][1]
    return lambda wc: {
        "grid": encoder_grid(SW, wc.encoder)[lr_name],
        "seeds": SW["seeds"],
        "regimes": SW["regimes"],
        "epochs": SW["epochs"],
        "steps_per_epoch": SW["steps_per_epoch"],
    }


def sweep_runtime(stage):
    def runtime(wc):
        g = encoder_grid(SW, wc.encoder)[SWEEP_STAGES[stage][1]]
        return ft_runtime(
            wc.encoder,
            len(g) * len(SW["seeds"]) * _train_regimes(SW["regimes"]),
            SW["epochs"] or FT["epochs"],
            SW["steps_per_epoch"] or FT["steps_per_epoch"],
        )

    return runtime


def finetune_metrics_files():
    """Per-job metrics tables of the fine-tuning protocols this config runs."""
    if not FT_ON:
        return []
    return [
        _ft_path("metrics", p, e, t, s)
        for p in FT["protocols"]
        for e in FT_ENCODERS
        for t in FT_TASKS
        for s in FT_SEEDS
    ]


def finetune_prediction_files():
    """{"<protocol>/<encoder>/<task>": path} of the per-(encoder, task) predictions tables (all seeds), the
    layout of the frozen protocols' tables (for the reliability layer)."""
    if not FT_ON:
        return {}
    return {
        f"{p}/{e}/{t}": f"{R}/predictions/{p}/{e}/{t}.parquet"
        for p in FT["protocols"]
        for e in FT_ENCODERS
        for t in FT_TASKS
    }


def finetune_targets():
    """What `all` should request besides the metrics: predictions per (encoder, task), the compute records and the
    sweep's tables."""
    if not FT_ON:
        return []
    targets = list(finetune_prediction_files().values()) + [f"{R}/compute/finetune.parquet"]
    if SWEEP_ON:
        targets += [f"{R}/sweep/lr_sweep_metrics.parquet", f"{R}/sweep/lr_sensitivity.parquet"]
    return targets


rule finetune:
    input:
        unpack(finetune_inputs),
    output:
        predictions=_ft_path("predictions", "{protocol}", "{encoder}", "{task}", "{seed}"),
        log=_ft_path("training_logs", "{protocol}", "{encoder}", "{task}", "{seed}"),
        metrics=_ft_path("metrics", "{protocol}", "{encoder}", "{task}", "{seed}"),
        compute=_ft_path("compute", "{protocol}", "{encoder}", "{task}", "{seed}"),
    log:
        f"{R}/logs/finetune/{{protocol}}/{{encoder}}/{{task}}/seed{{seed}}.log",
    wildcard_constraints:
        protocol="|".join(FINETUNE_PROTOCOLS),
        seed=r"\d+",
    conda:
        TORCH_ENV
    threads: FT["threads"]
    resources:
        gpu=1,
        mem_mb=encoder_resource("mem_mb"),
        runtime=lambda wc: ft_runtime(wc.encoder, _train_regimes(FT_REGIMES), FT["epochs"], FT["steps_per_epoch"]),
    params:
        code=code_hash(*FT_CODE),
        task=lambda wc: REG.task(wc.task),
        encoder=lambda wc: REG.encoder(wc.encoder),
        finetune=FT_JOB,
        regimes=FT_REGIMES,
        checkpoints=lambda wc: f"{R}/checkpoints/{wc.protocol}/{wc.encoder}/{wc.task}/seed{wc.seed}",
    script:
        STAGE


rule finetune_predictions:
    input:
        predictions=lambda wc: [_ft_path("predictions", wc.protocol, wc.encoder, wc.task, s) for s in FT_SEEDS],
    output:
        predictions=f"{R}/predictions/{{protocol}}/{{encoder}}/{{task}}.parquet",
    log:
        f"{R}/logs/finetune_predictions/{{protocol}}/{{encoder}}/{{task}}.log",
    wildcard_constraints:
        protocol="|".join(FINETUNE_PROTOCOLS),
    conda:
        CORE_ENV
    script:
        STAGE


rule finetune_compute:
    input:
        compute=(
            [
                _ft_path("compute", p, e, t, s)
                for p in FT["protocols"]
                for e in FT_ENCODERS
                for t in FT_TASKS
                for s in FT_SEEDS
            ]
            if FT_ON
            else []
        ),
    output:
        compute=f"{R}/compute/finetune.parquet",
    log:
        f"{R}/logs/finetune_compute.log",
    conda:
        CORE_ENV
    script:
        STAGE


rule sweep_linear:
    input:
        unpack(
            lambda wc: {**cache_files(task_dataset(wc)), "split": f"{R}/splits/{task_dataset(wc)}/{wc.task}.parquet"}
        ),
    output:
        metrics=sweep_path("{encoder}", "{task}", 1, "metrics"),
        runs=sweep_path("{encoder}", "{task}", 1, "runs"),
    log:
        f"{R}/logs/sweep/{{encoder}}/{{task}}/stage1.log",
    conda:
        TORCH_ENV
    threads: FT["threads"]
    resources:
        gpu=1,
        mem_mb=encoder_resource("mem_mb"),
        runtime=sweep_runtime(1),
    params:
        sweep_stage=1,
        code=code_hash(*FT_CODE),
        task=lambda wc: REG.task(wc.task),
        encoder=lambda wc: REG.encoder(wc.encoder),
        finetune=FT_SWEEP,
        sweep=sweep_params(1),
        checkpoints=lambda wc: f"{R}/checkpoints/sweep/{wc.encoder}/{wc.task}/stage1",
    script:
        STAGE


rule sweep_finetune:
    input:
        unpack(
            lambda wc: {
                **cache_files(task_dataset(wc)),
                "split": f"{R}/splits/{task_dataset(wc)}/{wc.task}.parquet",
                "stage1": sweep_path(wc.encoder, wc.task, 1, "runs"),
            }
        ),
    output:
        metrics=sweep_path("{encoder}", "{task}", 2, "metrics"),
        runs=sweep_path("{encoder}", "{task}", 2, "runs"),
    log:
        f"{R}/logs/sweep/{{encoder}}/{{task}}/stage2.log",
    conda:
        TORCH_ENV
    threads: FT["threads"]
    resources:
        gpu=1,
        mem_mb=encoder_resource("mem_mb"),
        runtime=sweep_runtime(2),
    params:
        sweep_stage=2,
        code=code_hash(*FT_CODE),
        task=lambda wc: REG.task(wc.task),
        encoder=lambda wc: REG.encoder(wc.encoder),
        finetune=FT_SWEEP,
        sweep=sweep_params(2),
        checkpoints=lambda wc: f"{R}/checkpoints/sweep/{wc.encoder}/{wc.task}/stage2",
    script:
        STAGE


rule sweep_choose:
    input:
        stage1=lambda wc: sweep_path(wc.encoder, SWEEP_TASK, 1, "runs"),
        stage2=lambda wc: sweep_path(wc.encoder, SWEEP_TASK, 2, "runs"),
    output:
        chosen=f"{R}/sweep/{{encoder}}/chosen.json",
    log:
        f"{R}/logs/sweep/{{encoder}}/choose.log",
    conda:
        TORCH_ENV
    params:
        code=code_hash("protocols/sweep.py"),
        task=SWEEP_TASK,
    script:
        STAGE


rule sweep_sensitivity:
    input:
        metrics=lambda wc: [sweep_path(wc.encoder, t, s, "metrics") for t in SWEEP_TASKS for s in SWEEP_STAGES],
        runs=lambda wc: [sweep_path(wc.encoder, t, s, "runs") for t in SWEEP_TASKS for s in SWEEP_STAGES],
    output:
        sensitivity=f"{R}/sweep/{{encoder}}/sensitivity.parquet",
    log:
        f"{R}/logs/sweep/{{encoder}}/sensitivity.log",
    conda:
        TORCH_ENV
    params:
        code=code_hash("protocols/sweep.py"),
    script:
        STAGE


rule sweep_collect:
    input:
        metrics=[sweep_path(e, t, s, "metrics") for e in FT_ENCODERS for t in SWEEP_TASKS for s in SWEEP_STAGES],
        sensitivity=[f"{R}/sweep/{e}/sensitivity.parquet" for e in FT_ENCODERS] if SWEEP_ON else [],
    output:
        metrics=f"{R}/sweep/lr_sweep_metrics.parquet",
        sensitivity=f"{R}/sweep/lr_sensitivity.parquet",
    log:
        f"{R}/logs/sweep/collect.log",
    conda:
        CORE_ENV
    script:
        STAGE
