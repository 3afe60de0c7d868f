# Saliency maps (OcularBench Figs. A.7-A.9): integrated gradients in NoiseTunnel of the fine-tuned and the
# linear-probe (linear_aug) models, one test image per class, grayscale -> CLAHE -> heatmap. Off unless
# `saliency: {enabled: true}` (needs fine-tuning). One GPU job per (encoder, task) and one figure per task.
# The models: the fine-tuning jobs of the saliency's (protocol, encoder, task, checkpoint seed) also write their
# best weights ({R}/models/..., verified by a sha256 sidecar) — rule finetune_keep_weights below is rule finetune
# with that extra output, preferred for exactly those jobs; enabling saliency later therefore reruns them once.
import re

from retinabench.saliency import saliency_settings
from retinabench.saliency.maps import NOT_RESULT as SAL_NOT_RESULT
from retinabench.workflow_plan import device_problems

SAL = saliency_settings(config)
SAL_ON = bool(SAL["enabled"])
SAL_ENCODERS = list(SAL["encoders"] or FT_ENCODERS)
SAL_TASKS = list(SAL["tasks"] or FT_TASKS)
SAL_PROTOCOLS = list(SAL["protocols"] or FT["protocols"])
SAL_SEED = SAL["checkpoint_seed"] if SAL["checkpoint_seed"] is not None else FT_SEEDS[0]
SAL_JOB = {k: v for k, v in SAL.items() if k not in SAL_NOT_RESULT}
# Minutes per attributed image on one GPU (nt_samples x n_steps = 2500 forward+backward passes) by size class.
SAL_RUNTIME = {"tiny": 1, "small": 2, "base": 4, "large": 8, "huge": 16, "giant": 32}

if SAL_ON:
    _bad = {"finetune.enabled": [] if FT_ON else ["false"],
            "encoders": sorted(set(SAL_ENCODERS) - set(FT_ENCODERS)),
            "tasks": sorted(set(SAL_TASKS) - set(FT_TASKS)),
            "protocols": sorted(set(SAL_PROTOCOLS) - set(FT["protocols"])),
            "checkpoint_seed": [] if SAL_SEED in FT_SEEDS else [SAL_SEED],
            "train_regime": [] if any(r.startswith(SAL["train_regime"] + "-") for r in FT_REGIMES)
                            else [SAL["train_regime"]]}
    _bad = {k: v for k, v in _bad.items() if v}
    _bad_device = device_problems(SAL["device"], "saliency.device",
                                  local=_intended_executor() in (None, "local", "dryrun"))
    if _bad_device and workflow.is_main_process:
        raise WorkflowError("; ".join(_bad_device))
    if _bad:
        raise ValueError(f"saliency: needs fine-tuned models, but these settings have none: {_bad} (fine-tuning "
                         f"runs encoders {FT_ENCODERS}, tasks {FT_TASKS}, protocols {FT['protocols']}, seeds "
                         f"{FT_SEEDS}, regimes {FT_REGIMES})")


def _alternatives(names):
    return "|".join(re.escape(str(n)) for n in names) or "(?!)"


def weights_path(protocol, encoder, task, seed):
    return f"{R}/models/{protocol}/{encoder}/{task}/seed{seed}.pt"


def saliency_inputs(wc):
    dataset = task_dataset(wc)
    inputs = {**cache_files(dataset), "split": f"{R}/splits/{dataset}/{wc.task}.parquet"}
    inputs.update({f"weights_{p}": weights_path(p, wc.encoder, wc.task, SAL_SEED) for p in SAL_PROTOCOLS})
    return inputs


def saliency_runtime(wc):
    n = len(REG.task(wc.task)["classes"]) * SAL["images_per_class"] * len(SAL_PROTOCOLS)
    per = SAL_RUNTIME[REG.encoder(wc.encoder)["size_class"]] * SAL["nt_samples"] * SAL["n_steps"] / 2500
    return max(10, math.ceil(n * per))


def saliency_targets():
    """What `all` requests when saliency is enabled: one figure per task (+ the per-job tables)."""
    if not SAL_ON:
        return []
    return ([f"{R}/figures/saliency/{t}.png" for t in SAL_TASKS]
            + [f"{R}/saliency/{e}/{t}.parquet" for e in SAL_ENCODERS for t in SAL_TASKS])


if SAL_ON:

    use rule finetune as finetune_keep_weights with:
        output:
            predictions=_ft_path("predictions", "{protocol}", "{encoder}", "{task}", "{seed}"),
            log=_ft_path("training_logs", "{protocol}", "{encoder}", "{task}", "{seed}"),
            metrics=_ft_path("metrics", "{protocol}", "{encoder}", "{task}", "{seed}"),
            compute=_ft_path("compute", "{protocol}", "{encoder}", "{task}", "{seed}"),
            weights=weights_path("{protocol}", "{encoder}", "{task}", "{seed}"),
        wildcard_constraints:
            protocol=_alternatives(SAL_PROTOCOLS),
            encoder=_alternatives(SAL_ENCODERS),
            task=_alternatives(SAL_TASKS),
            seed=_alternatives([SAL_SEED]),

    ruleorder: finetune_keep_weights > finetune


rule saliency:
    input:
        unpack(saliency_inputs),
    output:
        table=f"{R}/saliency/{{encoder}}/{{task}}.parquet",
        maps=f"{R}/saliency/{{encoder}}/{{task}}.npz",
    params:
        stage="saliency",
        code=code_hash("saliency", "protocols/finetune.py", "models", "stages_saliency_compute.py"),
        task=lambda wc: REG.task(wc.task),
        encoder=lambda wc: REG.encoder(wc.encoder),
        saliency=SAL_JOB,
        protocols=SAL_PROTOCOLS,
    wildcard_constraints:
        encoder=_alternatives(SAL_ENCODERS),
        task=_alternatives(SAL_TASKS),
    threads: SAL["threads"]
    resources:
        gpu=1,
        mem_mb=encoder_resource("mem_mb"),
        runtime=saliency_runtime,
    log:
        f"{R}/logs/saliency/{{encoder}}/{{task}}.log",
    script:
        STAGE


rule figure_saliency:
    input:
        tables=lambda wc: [f"{R}/saliency/{e}/{wc.task}.parquet" for e in SAL_ENCODERS],
        maps=lambda wc: [f"{R}/saliency/{e}/{wc.task}.npz" for e in SAL_ENCODERS],
    output:
        png=report(f"{R}/figures/saliency/{{task}}.png", caption="../report/appendix/saliency.rst",
                   category="8. Saliency and compute", subcategory="Saliency", labels={"figure": "saliency",
                                                                                       "task": "{task}"}),
        pdf=f"{R}/figures/saliency/{{task}}.pdf",
    params:
        stage="figure_saliency",
        code=code_hash("figures/saliency.py", "figures/style.py", "saliency/postprocess.py"),
        task=lambda wc: REG.task(wc.task),
        encoders={e: REG.encoder(e) for e in SAL_ENCODERS},
        protocols=SAL_PROTOCOLS,
        colormap=SAL["colormap"],
        settings=SAL_JOB,
    wildcard_constraints:
        task=_alternatives(SAL_TASKS),
    log:
        f"{R}/logs/figures/saliency/{{task}}.log",
    script:
        STAGE
