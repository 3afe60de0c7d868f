# Saliency maps (OcularBench Figs. A.7-A.9): integrated gradients in NoiseTunnel of the fine-tuned and the
# linear-probe (linear_aug) models, one test image per class, grayscale -> CLAHE -> heatmap. Off unless
# `saliency: {enabled: true}` (needs fine-tuning). One GPU job per (encoder, task) and one figure per task.
# The models: the fine-tuning jobs of the saliency's (protocol, encoder, task, checkpoint seed) also write their
# best weights ({R}/models/..., verified by a sha256 sidecar) — rule finetune_keep_weights below is rule finetune
# with that extra output, preferred for exactly those jobs; enabling saliency later therefore reruns them once.
# Plan: P.saliency.
SAL = P.saliency

if SAL.on:

    use rule finetune as finetune_keep_weights with:
        output:
            **FT.outputs(),
            weights=SAL.weights("{protocol}", "{encoder}", "{task}", "{seed}"),
        wildcard_constraints:
            **SAL.constraints,

    ruleorder: finetune_keep_weights > finetune


rule saliency:
    input:
        unpack(SAL.inputs),
    output:
        table=P.path("saliency", ext="parquet"),
        maps=P.path("saliency", ext="npz"),
    log:
        P.log("saliency"),
    wildcard_constraints:
        encoder=SAL.constraints["encoder"],
        task=SAL.constraints["task"],
    conda:
        TORCH_ENV
    threads: SAL.threads
    resources:
        gpu=1,
        mem_mb=P.encoder_resource("mem_mb"),
        runtime=SAL.runtime,
    params:
        code=P.code("saliency"),
        task=lambda wc: REG.task(wc.task),
        encoder=lambda wc: REG.encoder(wc.encoder),
        saliency=SAL.job_settings,
        protocols=SAL.protocols,
    script:
        STAGE


rule figure_saliency:
    input:
        unpack(SAL.figure_inputs),
    output:
        png=report(
            P.path("saliency_figure", ext="png"),
            caption="../report/appendix/saliency.rst",
            category="8. Saliency and compute",
            subcategory="Saliency",
            labels={"figure": "saliency", "task": "{task}"},
        ),
        pdf=P.path("saliency_figure", ext="pdf"),
    log:
        P.log("figure_saliency"),
    wildcard_constraints:
        task=SAL.constraints["task"],
    conda:
        TORCH_ENV
    params:
        code=P.code("figure_saliency"),
        task=lambda wc: REG.task(wc.task),
        encoders={e: REG.encoder(e) for e in SAL.encoders},
        protocols=SAL.protocols,
        colormap=SAL.settings.colormap,
        settings=SAL.job_settings,
    script:
        STAGE
