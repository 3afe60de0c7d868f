# Frozen protocols: one job per (encoder, task) runs kNN, linear and logistic probes for all seeds and regimes
# (keeps the full grid at encoders × tasks jobs) and writes predictions, the training log and metrics.


rule frozen:
    input:
        features=lambda wc: f"{R}/features/{wc.encoder}/{task_dataset(wc)}.parquet",
        split=lambda wc: f"{R}/splits/{task_dataset(wc)}/{wc.task}.parquet",
    output:
        predictions=f"{R}/predictions/frozen/{{encoder}}/{{task}}.parquet",
        log=f"{R}/training_logs/frozen/{{encoder}}/{{task}}.parquet",
        metrics=f"{R}/metrics/frozen/{{encoder}}/{{task}}.parquet",
    log:
        f"{R}/logs/frozen/{{encoder}}/{{task}}.log",
    conda:
        TORCH_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        code=code_hash(
            "protocols/frozen.py",
            "protocols/knn.py",
            "protocols/linear.py",
            "protocols/logreg.py",
            "protocols/common.py",
            "metrics/classification.py",
            "data/splits.py",
        ),
        task=lambda wc: REG.task(wc.task),
        protocols={
            "names": config["protocols"],
            "seeds": config["seeds"],
            "regimes": config["regimes"],
            "knn": config["knn"],
            "linear": config["linear"],
            "logreg": config["logreg"],
        },
    script:
        STAGE
