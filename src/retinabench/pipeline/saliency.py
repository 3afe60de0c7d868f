"""Stages of workflow/rules/saliency.smk: saliency maps of the fine-tuned models and their figure."""
from __future__ import annotations

import time
from importlib import metadata

import pandas as pd

from retinabench.pipeline.finetune import _load_data, _log
from retinabench.pipeline.job import Job, write_artifact, write_outputs
from retinabench.pipeline.stages import stage


def _versions(*names: str) -> dict:
    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


@stage("saliency")
def stage_saliency(job: Job) -> None:
    import torch
    from retinabench.models.encoder import weights_record
    from retinabench.saliency import run_saliency, write_maps
    from retinabench.settings.layers import SaliencySettings
    torch.set_num_threads(max(1, job.threads))
    task, entry, s = job.params["task"], job.params["encoder"], job.params["saliency"]
    settings = SaliencySettings.of(s)
    weights = {p: job.input[f"weights_{p}"] for p in job.params["protocols"]}
    index, split = _load_data(job)
    t0 = time.perf_counter()
    table, maps, missing = run_saliency(job.input["array"], index, split, task, entry, weights, settings, log=_log)
    write_artifact(table, job.output["table"])
    write_maps(job.output["maps"], maps)
    checkpoints = {r["protocol"]: {"path": r["weights"], "sha256": r["weights_sha256"], "best_epoch": r["best_epoch"],
                                   "seed": r["checkpoint_seed"], "train_regime": r["train_regime"]}
                   for r in table.drop_duplicates("protocol").to_dict("records")}
    extra = {"seconds": round(time.perf_counter() - t0, 2), "checkpoints": checkpoints,
             "images": table.drop_duplicates("image_id")[["class", "image_id"]].to_dict("records"),
             "classes_without_test_image": missing, "weights": weights_record(entry) | {"encoder": entry["name"]},
             "libraries": _versions("captum", "scikit-image")}
    write_outputs(job, written=[job.output["table"], job.output["maps"]], config={"task": task, "saliency": s,
                                                                       "protocols": job.params["protocols"]},
              seed=settings.noise_seed, extra=extra)


@stage("figure_saliency")
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
    write_outputs(job, written=paths, config={"task": task["name"], "protocols": job.params["protocols"],
                                  "colormap": job.params["colormap"]},
              extra={"image_ids": images, "checkpoint_sha256": sha})
