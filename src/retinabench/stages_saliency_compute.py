"""Stage entry points of the saliency maps and the compute benchmark; merged into retinabench.stages.STAGES.

* ``saliency`` — one (encoder, task): IG x NoiseTunnel maps of every configured protocol's trained model on one
  test image per class (table + ``.npz``).
* ``figure_saliency`` — one task: rows = encoders, columns = classes, fine-tuned vs linear probe side by side.
* ``compute_benchmark`` — one encoder: inference and training cost (``retinabench.compute``).
* ``compute_collect`` / ``figure_compute`` — the table over encoders and its four figures.
"""
from __future__ import annotations

import time
from importlib import metadata
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from retinabench.stages import Job, _sidecars
from retinabench.stages_finetune import _load_data, _log, _write_parquet


def _versions(*names: str) -> dict:
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def stage_saliency(job: Job) -> None:
    import torch
    from retinabench.models import weights_record
    from retinabench.saliency import run_saliency, write_maps
    torch.set_num_threads(max(1, job.threads))
    task, entry, s = job.params["task"], job.params["encoder"], job.params["saliency"]
    weights = {p: job.input[f"weights_{p}"] for p in job.params["protocols"]}
    index, split = _load_data(job)
    t0 = time.perf_counter()
    table, maps, missing = run_saliency(job.input["array"], index, split, task, entry, weights, s, log=_log)
    _write_parquet(table, job.output["table"])
    write_maps(job.output["maps"], maps)
    checkpoints = {r["protocol"]: {"path": r["weights"], "sha256": r["weights_sha256"], "best_epoch": r["best_epoch"],
                                   "seed": r["checkpoint_seed"], "train_regime": r["train_regime"]}
                   for r in table.drop_duplicates("protocol").to_dict("records")}
    extra = {"seconds": round(time.perf_counter() - t0, 2), "checkpoints": checkpoints,
             "images": table.drop_duplicates("image_id")[["class", "image_id"]].to_dict("records"),
             "classes_without_test_image": missing, "weights": weights_record(entry) | {"encoder": entry["name"]},
             "libraries": _versions("captum", "scikit-image")}
    _sidecars(job, [job.output["table"], job.output["maps"]], config={"task": task, "saliency": s,
                                                                       "protocols": job.params["protocols"]},
              seed=s["noise_seed"], extra=extra)


def stage_figure_saliency(job: Job) -> None:
    from retinabench.figures.saliency import saliency_figure
    from retinabench.saliency import read_maps
    task, encoders = job.params["task"], job.params["encoders"]
    tables, maps = job.input["tables"], job.input["maps"]
    if len(tables) != len(encoders) or len(maps) != len(encoders):
        raise ValueError(f"figure_saliency: {len(encoders)} encoders but {len(tables)} tables / {len(maps)} maps")
    results = {}
    for name, t, m in zip(encoders, tables, maps):
        table = pd.read_parquet(t)
        if set(table["encoder"]) != {name} or set(table["task"]) != {task["name"]}:
            raise ValueError(f"{t}: holds {sorted(set(table['encoder']))} / {sorted(set(table['task']))}, expected "
                             f"{name} / {task['name']}")
        results[name] = (table, read_maps(m))
    paths = saliency_figure(task, results, encoders, job.output["png"], protocols=job.params["protocols"],
                            colormap=job.params["colormap"])
    images = sorted({i for table, _ in results.values() for i in table["image_id"]})
    sha = {f"{r['encoder']}/{r['protocol']}": r["weights_sha256"]
           for table, _ in results.values() for r in table.drop_duplicates("protocol").to_dict("records")}
    _sidecars(job, paths, config={"task": task["name"], "protocols": job.params["protocols"],
                                  "colormap": job.params["colormap"]},
              extra={"image_ids": images, "checkpoint_sha256": sha})


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


def stage_compute_benchmark(job: Job) -> None:
    from retinabench.compute import benchmark_encoder
    from retinabench.models import weights_record
    entry, task, s = job.params["encoder"], job.params["task"], job.params["compute"]
    index, split = _load_data(job)
    test, train, labels = compute_rows(split, index, s["inference"]["images"])
    s = {**s, "threads": max(1, job.threads)}  # what the scheduler granted this job
    t0 = time.perf_counter()
    table = benchmark_encoder(entry, job.input["array"], test_rows=test, train_rows=train, train_labels=labels,
                              n_classes=len(task["classes"]), settings=s, train_settings=job.params["train"],
                              task=task["name"])
    _write_parquet(table, job.output["table"])
    _sidecars(job, [job.output["table"]], config={"compute": s, "train": job.params["train"], "task": task["name"]},
              extra={"seconds": round(time.perf_counter() - t0, 2), "n_test_images": int(len(test)),
                     "weights": weights_record(entry) | {"encoder": entry["name"]},
                     "device": table[["device", "device_name", "dtype"]].drop_duplicates().to_dict("records"),
                     "versions": table[["torch", "timm", "cuda", "cudnn", "python"]].iloc[0].to_dict()})


def stage_compute_collect(job: Job) -> None:
    from retinabench.compute import COMPUTE_COLUMNS
    frames = [pd.read_parquet(f) for f in job.input["tables"]]
    for f, t in zip(job.input["tables"], frames):
        if list(t.columns) != COMPUTE_COLUMNS:
            raise ValueError(f"{f}: columns {list(t.columns)} are not the compute table's {COMPUTE_COLUMNS}")
    table = pd.concat(frames, ignore_index=True)
    _write_parquet(table, job.output["table"])
    _sidecars(job, [job.output["table"]], config={})


def stage_figure_compute(job: Job) -> None:
    from retinabench.figures.compute import FIGURES, compute_figures
    table = pd.read_parquet(job.input["table"])
    paths = compute_figures(table, job.params["encoders"], {f: job.output[f] for f in FIGURES})
    _sidecars(job, paths, config={})


SALIENCY_COMPUTE_STAGES: dict[str, Callable] = {
    "saliency": stage_saliency, "figure_saliency": stage_figure_saliency,
    "compute_benchmark": stage_compute_benchmark, "compute_collect": stage_compute_collect,
    "figure_compute": stage_figure_compute,
}
