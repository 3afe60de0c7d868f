"""Stages of workflow/rules/compute.smk: the per-encoder compute benchmark, its table and figures."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from retinabench.pipeline.finetune import _load_data
from retinabench.pipeline.job import Job, write_artifact, write_outputs
from retinabench.pipeline.stages import stage


def compute_rows(split: pd.DataFrame, index: pd.DataFrame, n_images: int | None):
    """Cache rows of the test images (split order, at most ``n_images``) and of the training images + labels."""
    id_to_row = dict(zip(index["image_id"].astype(str), index["row"].astype(np.int64)))

    def rows(part):
        r = split[split["split"] == part]
        missing = [i for i in r["image_id"] if str(i) not in id_to_row]
        if missing:
            raise KeyError(f"{len(missing)} {part} images are not in the image cache, e.g. {missing[:3]}")
        if r.empty:
            raise ValueError(f"the {part} split of task {split['task'].iloc[0]} is empty")
        return np.array([id_to_row[str(i)] for i in r["image_id"]]), r["y"].to_numpy()

    test, _ = rows("test")
    train, labels = rows("train")
    return (test if n_images is None else test[:int(n_images)]), train, labels


@stage("compute_benchmark")
def stage_compute_benchmark(job: Job) -> None:
    from retinabench.compute import benchmark_encoder
    from retinabench.models.encoder import weights_record
    from retinabench.settings.layers import ComputeSettings
    entry, task = job.params["encoder"], job.params["task"]
    settings = ComputeSettings.of(job.params["compute"])
    index, split = _load_data(job)
    test, train, labels = compute_rows(split, index, settings.inference.images)
    s = settings.model_copy(update={"threads": max(1, job.threads)}).plain()  # the threads the job was granted
    t0 = time.perf_counter()
    table = benchmark_encoder(entry, job.input["array"], test_rows=test, train_rows=train, train_labels=labels,
                              n_classes=len(task["classes"]), settings=s, train_settings=job.params["train"],
                              task=task["name"])
    write_artifact(table, job.output["table"])
    write_outputs(job, written=[job.output["table"]], config={"compute": s, "train": job.params["train"], "task": task["name"]},
              extra={"seconds": round(time.perf_counter() - t0, 2), "n_test_images": int(len(test)),
                     "weights": weights_record(entry) | {"encoder": entry["name"]},
                     "device": table[["device", "device_name", "dtype"]].drop_duplicates().to_dict("records"),
                     "versions": table[["torch", "timm", "cuda", "cudnn", "python"]].iloc[0].to_dict()})


@stage("compute_collect")
def stage_compute_collect(job: Job) -> None:
    from retinabench.compute import COMPUTE_COLUMNS
    frames = [pd.read_parquet(f) for f in job.input["tables"]]
    for f, t in zip(job.input["tables"], frames):
        if list(t.columns) != COMPUTE_COLUMNS:
            raise ValueError(f"{f}: columns {list(t.columns)} are not the compute table's {COMPUTE_COLUMNS}")
    table = pd.concat(frames, ignore_index=True)
    write_artifact(table, job.output["table"])
    write_outputs(job, written=[job.output["table"]], config={})


@stage("figure_compute")
def stage_figure_compute(job: Job) -> None:
    from retinabench.figures.compute import FIGURES, compute_figures
    table = pd.read_parquet(job.input["table"])
    paths = compute_figures(table, job.params["encoders"], {f: job.output[f] for f in FIGURES})
    write_outputs(job, written=paths, config={})
