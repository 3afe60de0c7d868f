"""Stage entry points called by the Snakemake rules (through workflow/scripts/stage.py) and by tests.

Each stage takes a plain :class:`Job` (the rule's inputs, outputs, params, wildcards, threads), does its work
through the package, and writes a provenance sidecar for every output. Nothing here imports Snakemake.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from retinabench.provenance import write_sidecar
from retinabench.schemas import read_table, write_table


@dataclass
class Job:
    rule: str
    input: dict[str, Any]
    output: dict[str, str]
    params: dict[str, Any] = field(default_factory=dict)
    wildcards: dict[str, str] = field(default_factory=dict)
    threads: int = 1

    def inputs_flat(self) -> list[str]:
        out: list[str] = []
        for v in self.input.values():
            out.extend([v] if isinstance(v, str) else list(v))
        return out


def _sidecars(job: Job, outputs: list[str], *, config: dict, seed=None, extra: dict | None = None,
              inputs: list[str] | None = None) -> None:
    for out in outputs:
        write_sidecar(out, rule=job.rule, inputs=job.inputs_flat() if inputs is None else inputs,
                      wildcards=job.wildcards, config=config, seed=seed, extra=extra)


def stage_phantom(job: Job) -> None:
    from retinabench.data.phantom import generate_phantom
    p = job.params["phantom"]
    out = Path(job.output["metadata"])
    meta = generate_phantom(out.parent, n_patients=p["n_patients"], seed=p["seed"], image_size=p["image_size"],
                            sites=p.get("sites"))
    _sidecars(job, [str(out)], config={"phantom": p}, seed=p["seed"],
              extra={"n_images": int(len(meta)), "raw_files": [{"path": str(out.parent), "note": "generated"}]})


def stage_manifest(job: Job) -> None:
    from retinabench.data.adapters import get_adapter
    entry, root = job.params["dataset"], Path(job.params["root"])
    manifest, exclusions = get_adapter(entry["adapter"])(root, entry)
    write_table(manifest, job.output["manifest"], "manifest")
    write_table(exclusions, job.output["exclusions"], "exclusions")
    by_reason = exclusions.groupby(["scope", "reason"]).size().reset_index(name="n") if len(exclusions) else []
    summary = {"n_images": int(len(manifest)), "n_patients": int(manifest["patient_id"].nunique()),
               "by_modality": manifest["modality"].value_counts().to_dict(),
               "exclusions": by_reason.to_dict("records") if len(exclusions) else []}
    from retinabench.hashing import sha256_file
    raw = [{"path": str(Path(f)), "sha256": sha256_file(f), "note": "index file"} for f in job.inputs_flat()]
    raw.append({"path": str(root), "note": f"{len(manifest)} images; per-file sha256 in the manifest's sha256 column"})
    _sidecars(job, [job.output["manifest"], job.output["exclusions"]], config={"dataset": entry, "root": str(root)},
              extra={"summary": summary, "raw_files": raw})


def stage_image_cache(job: Job) -> None:
    from retinabench.data.image_cache import build_image_cache
    manifest = read_table(job.input["manifest"], "manifest")
    p = job.params["image_cache"]
    n = build_image_cache(manifest, job.params["root"], job.output["array"], job.output["index"], size=p["size"],
                          resize=p["resize"], threads=job.threads)
    _sidecars(job, [job.output["array"], job.output["index"]], config={"image_cache": p},
              extra={"n_images": n})


def stage_split(job: Job) -> None:
    from retinabench.data.splits import make_split, split_summary, task_rows
    manifest = read_table(job.input["manifest"], "manifest")
    exclusions = read_table(job.input["exclusions"], "exclusions")
    task, p = job.params["task"], job.params["split"]
    _, unlabelled = task_rows(manifest, task)
    recorded = exclusions[(exclusions["scope"] == f"label:{task['label']}")
                          & exclusions["image_id"].isin(manifest.loc[manifest["modality"] == task["modality"],
                                                                     "image_id"])]
    if unlabelled != len(recorded):
        raise ValueError(f"task {task['name']}: {unlabelled} {task['modality']} images lack a {task['label']!r} label "
                         f"but the exclusions table records {len(recorded)}: the adapter dropped labels silently")
    split = make_split(manifest, task, fractions=p["fractions"], seed=p["seed"])
    write_table(split, job.output["split"], "split")
    summary = split_summary(split, task) | {"unlabelled_excluded": unlabelled}
    _sidecars(job, [job.output["split"]], config={"task": task, "split": p}, seed=p["seed"],
              extra={"summary": summary})


def stage_features(job: Job) -> None:
    import torch
    from retinabench.features.extract import extract_features
    from retinabench.models import build_encoder
    torch.set_num_threads(max(1, job.threads))
    entry, p = job.params["encoder"], job.params["features"]
    t0 = time.perf_counter()
    encoder = build_encoder(entry)
    info = extract_features(encoder, job.input["array"], job.input["index"], job.output["features"],
                            batch_size=p["batch_size"], device=p.get("device", "auto"), progress=True)
    info["seconds"] = round(time.perf_counter() - t0, 2)
    _sidecars(job, [job.output["features"]], config={"encoder": entry, "features": p},
              extra={"weights": encoder.weights | {"encoder": entry["name"]}, "extraction": info})


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
    write_table(preds, job.output["predictions"], "predictions")
    write_table(log, job.output["log"], "training_log")
    _sidecars(job, [job.output["predictions"], job.output["log"]], config={"task": task, "protocols": p},
              seed=p["seeds"], extra={"seconds": round(time.perf_counter() - t0, 2)})
    metrics = metrics_table(preds, {task["name"]: task})
    write_table(metrics, job.output["metrics"], "metrics")
    _sidecars(job, [job.output["metrics"]], config={"task": task}, inputs=[job.output["predictions"]])


def stage_collect_metrics(job: Job) -> None:
    frames = [read_table(f, "metrics") for f in job.input["metrics"]]
    metrics = pd.concat(frames, ignore_index=True)
    write_table(metrics, job.output["metrics"], "metrics")
    metrics.to_csv(job.output["csv"], index=False)
    _sidecars(job, [job.output["metrics"], job.output["csv"]], config={})


def stage_ranks(job: Job) -> None:
    from retinabench.stats.ranks import rank_summary, rank_table
    metrics = read_table(job.input["metrics"], "metrics")
    p = job.params["ranking"]
    ranks = rank_table(metrics, metric=p["metric"])
    summary = rank_summary(ranks)
    Path(job.output["ranks"]).parent.mkdir(parents=True, exist_ok=True)
    ranks.to_parquet(job.output["ranks"], index=False)
    summary.to_csv(job.output["summary"], index=False)
    _sidecars(job, [job.output["ranks"], job.output["summary"]], config={"ranking": p})


def stage_figure_rank_distribution(job: Job) -> None:
    from retinabench.figures.ranks import rank_distribution_figure
    ranks = pd.read_parquet(job.input["ranks"])
    p = job.params["ranking"]
    paths = rank_distribution_figure(ranks, job.params["encoders"], job.output["png"], regime=p["regime"],
                                     title=f"Encoder ranks on test {p['metric']}")
    _sidecars(job, paths, config={"ranking": p})


STAGES: dict[str, Callable[[Job], None]] = {
    "phantom": stage_phantom, "manifest": stage_manifest, "image_cache": stage_image_cache, "split": stage_split,
    "features": stage_features, "frozen": stage_frozen, "collect_metrics": stage_collect_metrics,
    "ranks": stage_ranks, "figure_rank_distribution": stage_figure_rank_distribution,
}


def _register_layer_stages() -> None:
    """Stages of the analysis, fine-tuning, reliability and saliency/compute layers live in their own modules."""
    from retinabench.stages_analysis import ANALYSIS_STAGES
    from retinabench.stages_finetune import FINETUNE_STAGES
    from retinabench.stages_reliability import RELIABILITY_STAGES
    from retinabench.stages_saliency_compute import SALIENCY_COMPUTE_STAGES
    for layer in (ANALYSIS_STAGES, FINETUNE_STAGES, RELIABILITY_STAGES, SALIENCY_COMPUTE_STAGES):
        clash = sorted(set(layer) & set(STAGES))
        if clash:
            raise RuntimeError(f"stages {clash} are defined twice")
        STAGES.update(layer)


_register_layer_stages()


def run_stage(name: str, job: Job) -> None:
    try:
        fn = STAGES[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}; known: {sorted(STAGES)}") from None
    fn(job)

