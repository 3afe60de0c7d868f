# Compute benchmark (OcularBench Figs. A.16-A.19): per encoder, inference latency and peak memory at batch 1 on
# the test split, training time per step and peak memory at batch 64 over 25 steps for full fine-tuning and linear
# probing, parameters and GFLOPs. One GPU job per encoder (the numbers belong to the device it ran on: the table
# records device, dtype, batch and library versions); off unless `compute: {enabled: true}`. Plan: P.compute.
CMP = P.compute


rule compute_benchmark:
    input:
        unpack(CMP.inputs),
    output:
        table=P.path("compute_benchmark"),
    log:
        P.log("compute_benchmark"),
    wildcard_constraints:
        encoder=CMP.encoder_constraint,
    conda:
        TORCH_ENV
    threads: CMP.threads
    resources:
        gpu=1,
        mem_mb=P.encoder_resource("mem_mb"),
        runtime=CMP.runtime,
    params:
        code=P.code("compute_benchmark"),
        encoder=lambda wc: REG.encoder(wc.encoder),
        task=REG.task(CMP.task),
        compute=CMP.job_settings,
        train=CMP.train,
    script:
        STAGE


rule compute_collect:
    input:
        tables=CMP.benchmark_tables(),
    output:
        table=P.path("compute_table"),
    log:
        P.log("compute_collect"),
    conda:
        CORE_ENV
    script:
        STAGE


rule figure_compute:
    input:
        table=P.path("compute_table"),
    output:
        **CMP.figure_outputs(report),
    log:
        P.log("figure_compute"),
    conda:
        CORE_ENV
    params:
        code=P.code("figure_compute"),
        encoders={e: REG.encoder(e) for e in CMP.encoders},
        settings=CMP.job_settings,
    script:
        STAGE
