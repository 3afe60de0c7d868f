# Fine-tuning stage: full fine-tuning (`finetune`) and augmented linear probing (`linear_aug`), one job per
# (encoder, task, protocol, seed) covering the training regimes; the paper's two-stage learning-rate sweep per
# encoder (one job per encoder, task and stage, looping over the grid). Off unless `finetune: {enabled: true}`
# (config/finetune_demo.yaml is a small opt-in example). Jobs resume from {R}/checkpoints/... after a kill; that
# folder is deliberately not an output, so Snakemake never deletes it before the rerun. Plan: P.finetune.
FT = P.finetune


rule finetune:
    input:
        unpack(FT.inputs),
    output:
        **FT.outputs(),
    log:
        P.log("finetune"),
    wildcard_constraints:
        protocol=FT.protocol_constraint,
        seed=r"\d+",
    conda:
        TORCH_ENV
    threads: FT.threads
    resources:
        gpu=1,
        mem_mb=P.encoder_resource("mem_mb"),
        runtime=FT.runtime,
    params:
        code=P.code("finetune"),
        task=lambda wc: REG.task(wc.task),
        encoder=lambda wc: REG.encoder(wc.encoder),
        finetune=FT.job_settings,
        regimes=FT.regimes,
        # resume folders under results: a location (P.located), never a rerun trigger
        locations=P.located(checkpoints=FT.checkpoints),
    script:
        STAGE


rule finetune_predictions:
    input:
        predictions=lambda wc: [FT.path("predictions", wc.protocol, wc.encoder, wc.task, s) for s in FT.seeds],
    output:
        predictions=P.path("predictions", source="{protocol}", name="{task}"),
    log:
        P.log("finetune_predictions"),
    wildcard_constraints:
        protocol=FT.protocol_constraint,
    conda:
        CORE_ENV
    script:
        STAGE


rule finetune_compute:
    input:
        compute=FT.compute_files(),
    output:
        compute=P.path("finetune_compute"),
    log:
        P.log("finetune_compute"),
    conda:
        CORE_ENV
    script:
        STAGE


rule sweep_linear:
    input:
        unpack(FT.sweep_inputs(1)),
    output:
        metrics=FT.sweep_path("{encoder}", "{task}", 1, "metrics"),
        runs=FT.sweep_path("{encoder}", "{task}", 1, "runs"),
    log:
        P.log("sweep_linear"),
    conda:
        TORCH_ENV
    threads: FT.threads
    resources:
        gpu=1,
        mem_mb=P.encoder_resource("mem_mb"),
        runtime=FT.sweep_runtime(1),
    params:
        sweep_stage=1,
        code=P.code("sweep_linear"),
        task=lambda wc: REG.task(wc.task),
        encoder=lambda wc: REG.encoder(wc.encoder),
        finetune=FT.sweep_job_settings,
        sweep=FT.sweep_params(1),
        locations=P.located(checkpoints=FT.sweep_checkpoints(1)),
    script:
        STAGE


rule sweep_finetune:
    input:
        unpack(FT.sweep_inputs(2)),
    output:
        metrics=FT.sweep_path("{encoder}", "{task}", 2, "metrics"),
        runs=FT.sweep_path("{encoder}", "{task}", 2, "runs"),
    log:
        P.log("sweep_finetune"),
    conda:
        TORCH_ENV
    threads: FT.threads
    resources:
        gpu=1,
        mem_mb=P.encoder_resource("mem_mb"),
        runtime=FT.sweep_runtime(2),
    params:
        sweep_stage=2,
        code=P.code("sweep_finetune"),
        task=lambda wc: REG.task(wc.task),
        encoder=lambda wc: REG.encoder(wc.encoder),
        finetune=FT.sweep_job_settings,
        sweep=FT.sweep_params(2),
        locations=P.located(checkpoints=FT.sweep_checkpoints(2)),
    script:
        STAGE


rule sweep_choose:
    input:
        stage1=lambda wc: FT.sweep_path(wc.encoder, FT.sweep_task, 1, "runs"),
        stage2=lambda wc: FT.sweep_path(wc.encoder, FT.sweep_task, 2, "runs"),
    output:
        chosen=P.path("sweep_chosen"),
    log:
        P.log("sweep_choose"),
    conda:
        TORCH_ENV
    params:
        code=P.code("sweep_choose"),
        task=FT.sweep_task,
    script:
        STAGE


rule sweep_sensitivity:
    input:
        metrics=lambda wc: FT.sweep_stage_files(wc.encoder, "metrics"),
        runs=lambda wc: FT.sweep_stage_files(wc.encoder, "runs"),
    output:
        sensitivity=P.path("sweep_sensitivity"),
    log:
        P.log("sweep_sensitivity"),
    conda:
        TORCH_ENV
    params:
        code=P.code("sweep_sensitivity"),
    script:
        STAGE


rule sweep_collect:
    input:
        metrics=[f for e in FT.encoders for f in FT.sweep_stage_files(e, "metrics")],
        sensitivity=[P.path("sweep_sensitivity", encoder=e) for e in FT.encoders] if FT.sweep_on else [],
    output:
        metrics=P.path("lr_sweep_metrics"),
        sensitivity=P.path("lr_sensitivity"),
    log:
        P.log("sweep_collect"),
    conda:
        CORE_ENV
    script:
        STAGE
