# Frozen protocols: one job per (encoder, task) runs kNN, linear and logistic probes for all seeds and regimes
# (keeps the full grid at encoders × tasks jobs) and writes predictions, the training log and metrics.


rule frozen:
    input:
        features=lambda wc: P.features(wc.encoder, P.task_dataset(wc.task)),
        split=lambda wc: P.task_split(wc.task),
    output:
        predictions=P.path("predictions", source="frozen", name="{task}"),
        log=P.path("training_log", source="frozen", name="{task}"),
        metrics=P.path("job_metrics", source="frozen", name="{task}"),
    log:
        P.log("frozen"),
    conda:
        TORCH_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        code=P.code("frozen"),
        task=lambda wc: REG.task(wc.task),
        protocols=P.frozen_settings(),
    script:
        STAGE
