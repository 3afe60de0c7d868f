# Compute benchmark (OcularBench Figs. A.16-A.19): per encoder, inference latency and peak memory at batch 1 on
# the test split, training time per step and peak memory at batch 64 over 25 steps for full fine-tuning and linear
# probing, parameters and GFLOPs. One GPU job per encoder (the numbers belong to the device it ran on: the table
# records device, dtype, batch and library versions); off unless `compute: {enabled: true}`.
from retinabench.compute import compute_settings
from retinabench.compute.benchmark import NOT_RESULT as CMP_NOT_RESULT
from retinabench.figures.compute import FIGURES as CMP_FIGURES
from retinabench.workflow_plan import device_problems, unpinned_encoders

CMP = compute_settings(config)
CMP_ON = bool(CMP["enabled"])
CMP_ENCODERS = list(CMP["encoders"] or PLAN.encoders)
CMP_TASK = CMP["task"] or PLAN.tasks[0]
CMP_JOB = {k: v for k, v in CMP.items() if k not in CMP_NOT_RESULT}
CMP_TRAIN = {k: FT[k] for k in ("channels_last", "compile", "weight_decay")}  # fine-tuning's step settings
for _e in CMP_ENCODERS:
    REG.encoder(_e)
if CMP_ON and workflow.is_main_process:  # the config's own encoders and devices are checked in common.smk
    _problems = (unpinned_encoders(REG, sorted(set(CMP_ENCODERS) - set(PLAN.encoders)))
                 + device_problems(CMP["device"], "compute.device", local=_intended_executor() in (None, "local",
                                                                                                  "dryrun")))
    if _problems:
        raise WorkflowError("compute: " + "; ".join(_problems))
if CMP_ON and CMP_TASK not in PLAN.tasks:
    raise ValueError(f"compute.task {CMP_TASK!r} is not a task of this config (its tasks: {PLAN.tasks})")
CMP_RUNTIME = {"tiny": 15, "small": 20, "base": 30, "large": 45, "huge": 90, "giant": 120}  # min, one GPU


def compute_targets():
    """What `all` requests when the compute benchmark is enabled."""
    if not CMP_ON:
        return []
    return [f"{R}/compute/benchmark.parquet"] + [f"{R}/figures/compute/{f}.png" for f in CMP_FIGURES]


rule compute_benchmark:
    input:
        **cache_files(REG.task(CMP_TASK)["dataset"]),
        split=f"{R}/splits/{REG.task(CMP_TASK)['dataset']}/{CMP_TASK}.parquet",
    output:
        table=f"{R}/compute/benchmark/{{encoder}}.parquet",
    params:
        stage="compute_benchmark",
        code=code_hash("compute", "protocols/finetune.py", "models", "features/extract.py"),
        encoder=lambda wc: REG.encoder(wc.encoder),
        task=REG.task(CMP_TASK),
        compute=CMP_JOB,
        train=CMP_TRAIN,
    wildcard_constraints:
        encoder="|".join(map(re.escape, CMP_ENCODERS)) or "(?!)",
    threads: CMP["threads"]
    resources:
        gpu=1,
        mem_mb=encoder_resource("mem_mb"),
        runtime=lambda wc: CMP_RUNTIME[REG.encoder(wc.encoder)["size_class"]],
    log:
        f"{R}/logs/compute/{{encoder}}.log",
    script:
        STAGE


rule compute_collect:
    input:
        tables=[f"{R}/compute/benchmark/{e}.parquet" for e in CMP_ENCODERS],
    output:
        table=f"{R}/compute/benchmark.parquet",
    params:
        stage="compute_collect",
    log:
        f"{R}/logs/compute/collect.log",
    script:
        STAGE


rule figure_compute:
    input:
        table=f"{R}/compute/benchmark.parquet",
    output:
        **{f: report(f"{R}/figures/compute/{f}.png", caption="../report/appendix/compute.rst",
                     category="8. Saliency and compute", subcategory="Compute", labels={"figure": f.replace("_", " ")})
           for f in CMP_FIGURES},
        **{f"{f}_pdf": f"{R}/figures/compute/{f}.pdf" for f in CMP_FIGURES},
    params:
        stage="figure_compute",
        code=code_hash("figures/compute.py", "figures/style.py"),
        encoders={e: REG.encoder(e) for e in CMP_ENCODERS},
        settings=CMP_JOB,
    log:
        f"{R}/logs/figures/compute.log",
    script:
        STAGE
