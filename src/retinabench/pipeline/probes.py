"""Stage of workflow/rules/probes.smk: the frozen protocols of one (encoder, task) (retinabench.protocols)."""
from __future__ import annotations

import time
from typing import Any

from retinabench.pipeline.job import Job, write_artifact, write_outputs
from retinabench.pipeline.stages import stage
from retinabench.schemas import read_table


@stage("frozen")
def stage_frozen(job: Job) -> None:
    import torch
    from retinabench.features.extract import load_features
    from retinabench.metrics.classification import metrics_table
    from retinabench.protocols.frozen import run_frozen
    torch.set_num_threads(max(1, job.threads))
    p, task = job.params["protocols"], job.params["task"]
    ids, feats = load_features(job.input["features"])
    split = read_table(job.input["split"], "split")
    t0 = time.perf_counter()
    preds, log = run_frozen(ids, feats, split, task, job.wildcards["encoder"], protocols=p["names"],
                            seeds=p["seeds"], regimes=p["regimes"], cfg=p)
    write_artifact(preds, job.output["predictions"], "predictions")
    write_artifact(log, job.output["log"], "training_log")
    extra: dict[str, Any] = {"seconds": round(time.perf_counter() - t0, 2)}
    if "knn" in p["names"]:  # the neighbour count each training regime used (k: auto resolves per regime)
        from retinabench.data.splits import regime_rows
        from retinabench.protocols.knn import resolve_k
        from retinabench.regimes import is_balanced, train_sides
        from retinabench.settings.protocols import KnnSettings
        k = KnnSettings.from_config(p).k
        extra["knn_k"] = {r: resolve_k(k, len(regime_rows(split, "train", is_balanced(r))))
                          for r in train_sides(p["regimes"])}
    write_outputs(job, written=[job.output["predictions"], job.output["log"]], config={"task": task, "protocols": p},
              seed=p["seeds"], extra=extra)
    metrics = metrics_table(preds, {task["name"]: task})
    write_artifact(metrics, job.output["metrics"], "metrics")
    write_outputs(job, written=[job.output["metrics"]], config={"task": task}, inputs=[job.output["predictions"]])
