"""Stage entry points called by the Snakemake rules (through workflow/scripts/stage.py) and by tests.

Each stage takes a plain :class:`Job` (the rule's inputs, outputs, params, wildcards, threads), does its work
through the package, and writes a provenance sidecar for every output. Nothing here imports Snakemake.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from retinabench.provenance import sidecar_path, write_sidecar
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


def exclusion_summary(exclusions: pd.DataFrame, *, limit: int = 25) -> pd.DataFrame:
    """Counts of exclusion rows by scope and reason, with per-row details (file names, quoted values, numbers)
    folded so that one kind of decision is one line (the rows themselves are in exclusions.parquet)."""
    if exclusions.empty:
        return pd.DataFrame(columns=["scope", "reason", "n"])
    reason = exclusions["reason"].astype(str)
    folded = (reason.str.replace(r"'[^']*'|\"[^\"]*\"", "'…'", regex=True)
              .str.replace(r"(?<![\w])[\w.-]*[/\\.][\w./\\-]*[\w/]", "…", regex=True)
              .str.replace(r"\b\d+\b", "N", regex=True))
    # Verbatim where a scope has few distinct reasons; folded where they differ row by row (file names).
    many = reason.groupby(exclusions["scope"]).transform("nunique") > 12
    out = (exclusions.assign(reason=reason.where(~many, folded)).groupby(["scope", "reason"]).size()
           .reset_index(name="n")
           .sort_values(["scope", "n"], ascending=[True, False]).reset_index(drop=True))
    return out.head(limit) if limit else out


def _announce(text: str) -> None:
    """Print to the job's log (stdout is redirected there) and to the console Snakemake runs in."""
    print(text, flush=True)
    console = sys.__stderr__
    if console is not None and console is not sys.stdout:
        print(text, file=console, flush=True)


def _manifest_report(dataset: str, manifest: pd.DataFrame, exclusions: pd.DataFrame, extra: dict) -> str:
    by_mod = ", ".join(f"{k} {v}" for k, v in manifest["modality"].value_counts().sort_index().items())
    lines = [f"retinabench manifest {dataset}: {len(manifest)} images ({by_mod}), "
             f"{manifest['patient_id'].nunique()} patients; {len(exclusions)} exclusion rows"]
    for key, value in extra.items():
        lines.append(f"  {key}: {value}")
    summary = exclusion_summary(exclusions, limit=0)
    if len(summary):
        width = max(len(x) for x in summary["scope"])
        lines.append("  exclusions by scope and reason:")
        shown = summary.head(25)
        lines += [f"    {r.scope:<{width}}  {r.n:>7}  {r.reason}" for r in shown.itertuples()]
        if len(summary) > len(shown):
            lines.append(f"    ... {len(summary) - len(shown)} more kinds (exclusions.parquet has every row)")
    else:
        lines.append("  exclusions by scope and reason: none")
    return "\n".join(lines)


def stage_manifest(job: Job) -> None:
    """Adapter -> subsample -> decode pass (corrupt check + perceptual hash, cached by sha256) -> outputs."""
    from retinabench.data.adapters import get_adapter
    from retinabench.data.image_checks import CACHE_NAME, apply_corrupt_policy, check_images
    from retinabench.data.raw_state import RawState
    from retinabench.data.subsample import apply_subsample
    from retinabench.hashing import sha256_file
    entry, root = job.params["dataset"], Path(job.params["root"])
    dataset = entry.get("name", job.wildcards.get("dataset", "?"))
    data_dir = Path(job.output["manifest"]).parent
    raw_state = None if entry.get("generated") else RawState(root, data_dir)
    primed = raw_state.prime_hash_memo() if raw_state else 0  # unchanged files are not re-hashed
    manifest, exclusions = get_adapter(entry["adapter"])(root, entry)
    manifest, exclusions, sub = apply_subsample(manifest, exclusions, entry.get("subsample"), dataset=dataset)
    checks, decode = check_images(manifest, root, cache_path=data_dir / CACHE_NAME, threads=job.threads)
    manifest, exclusions = apply_corrupt_policy(manifest, exclusions, checks, dataset=dataset,
                                                policy=entry.get("on_corrupt", "error"))
    hashes = checks[checks["image_id"].isin(manifest["image_id"])]
    hashes = hashes.astype({"width": "int64", "height": "int64"})[["image_id", "sha256", "width", "height", "mode",
                                                                   "phash"]]
    write_table(manifest, job.output["manifest"], "manifest")
    write_table(exclusions, job.output["exclusions"], "exclusions")
    write_table(hashes.sort_values("image_id").reset_index(drop=True), job.output["hashes"], "image_hashes")
    index_files = [f for f in job.inputs_flat() if Path(f).name != "raw_fingerprint.json"]
    raw = [{"path": str(Path(f)), "sha256": sha256_file(f), "note": "index file"} for f in index_files]
    raw.append({"path": str(root), "note": f"{len(manifest)} images; per-file sha256 in the manifest's sha256 column"})
    if raw_state:
        raw_state.record(job.output["raw_files"])
    else:
        write_table(pd.DataFrame(columns=["path", "size", "mtime_ns", "sha256"]), job.output["raw_files"], "raw_files")
    by_reason = exclusion_summary(exclusions, limit=0)
    summary = {"n_images": int(len(manifest)), "n_patients": int(manifest["patient_id"].nunique()),
               "by_modality": manifest["modality"].value_counts().to_dict(),
               "exclusions": by_reason.to_dict("records"), "decode": decode, "sha256_reused": primed,
               "subsample": sub}
    extra = {"decode pass": f"{decode['decoded']} decoded, {decode['cached']} from the sha256 cache, "
                            f"{decode['corrupt']} corrupt"}
    if sub:
        extra["subsample"] = (f"{sub['patients_kept']} of {sub['patients_total']} patients, {sub['images_kept']} "
                              f"of {sub['images_total']} images ({sub['spec']})")
    _announce(_manifest_report(dataset, manifest, exclusions, extra))
    _sidecars(job, [job.output[k] for k in ("manifest", "exclusions", "hashes", "raw_files")],
              config={"dataset": entry, "root": str(root)},
              extra={"summary": summary, "raw_files": raw,
                     "raw_images": {"root": str(root), "snapshot": job.output["raw_files"],
                                    "manifest": job.output["manifest"]} if raw_state else None})


def stage_image_cache(job: Job) -> None:
    from retinabench.data.image_cache import build_image_cache
    manifest = read_table(job.input["manifest"], "manifest")
    p = job.params["image_cache"]
    n = build_image_cache(manifest, job.params["root"], job.output["array"], job.output["index"], size=p["size"],
                          resize=p["resize"], threads=job.threads)
    _sidecars(job, [job.output["array"], job.output["index"]], config={"image_cache": p},
              extra={"n_images": n})


def stage_duplicates(job: Job) -> None:
    from retinabench.data.duplicates import HASH_VERSION, duplicate_summary, find_duplicates
    manifest = read_table(job.input["manifest"], "manifest")
    hashes = read_table(job.input["hashes"], "image_hashes")
    p = job.params["duplicates"]
    images = manifest[["image_id", "patient_id", "sha256"]].merge(hashes[["image_id", "phash"]], on="image_id",
                                                                  how="left", validate="one_to_one")
    dups = find_duplicates(images, max_distance=p["max_distance"])
    write_table(dups, job.output["duplicates"], "duplicates")
    summary = duplicate_summary(dups)
    _announce(f"retinabench duplicates {job.wildcards.get('dataset', '')}: {summary['clusters']} clusters "
              f"({summary['exact_clusters']} all byte-identical) holding {summary['images']} images "
              f"({summary['exact_images']} exact, {summary['near_images']} near within {p['max_distance']} bits); "
              f"{summary['clusters_spanning_patients']} span several patient ids")
    _sidecars(job, [job.output["duplicates"]], config={"duplicates": p},
              extra={"summary": summary, "perceptual_hash": HASH_VERSION})


def stage_split(job: Job) -> None:
    """The dataset's one assignment, used by every task of it (retinabench.data.splits)."""
    from retinabench.data.splits import assign_splits
    manifest = read_table(job.input["manifest"], "manifest")
    dups = read_table(job.input["duplicates"], "duplicates")
    p = job.params["split"]
    dataset = job.wildcards.get("dataset") or str(manifest["dataset"].iloc[0])
    assignment, report = assign_splits(manifest, job.params["tasks"], fractions=p["fractions"], seed=p["seed"],
                                       duplicates=dups, near=p.get("group_near_duplicates", True),
                                       method=p.get("method", "hash"), dataset=dataset)
    write_table(assignment, job.output["split"], "dataset_split")
    _announce(f"retinabench split {dataset} ({report['method']}, seed {p['seed']}): {report['n_groups']} groups of "
              f"{report['n_patients']} patients; {report['groups_merging_patients']} groups merge "
              f"{report['patients_in_merged_groups']} patients through duplicates; realised "
              f"{report['realised_fractions']} (tolerance ± {report['tolerance']}); "
              f"{len(report['class_presence_moves'])} groups moved for class presence"
              + (f"; {report['note']}" if report.get("note") else ""))
    _sidecars(job, [job.output["split"]], config={"split": p, "tasks": [t["name"] for t in job.params["tasks"]]},
              seed=p["seed"], extra={"summary": report})


def stage_task_split(job: Job) -> None:
    """One task's view of its dataset's assignment: rows with a valid label, y, balanced variant, checks."""
    from retinabench.data.splits import split_summary, task_rows, task_split
    manifest = read_table(job.input["manifest"], "manifest")
    exclusions = read_table(job.input["exclusions"], "exclusions")
    assignment = read_table(job.input["assignment"], "dataset_split")
    task, seed = job.params["task"], job.params["seed"]
    _, unlabelled = task_rows(manifest, task)
    recorded = exclusions[(exclusions["scope"] == f"label:{task['label']}")
                          & exclusions["image_id"].isin(manifest.loc[manifest["modality"] == task["modality"],
                                                                     "image_id"])]
    if unlabelled != len(recorded):
        raise ValueError(f"task {task['name']}: {unlabelled} {task['modality']} images lack a {task['label']!r} label "
                         f"but the exclusions table records {len(recorded)}: the adapter dropped labels silently")
    split = task_split(manifest, assignment, task, seed=seed)
    write_table(split, job.output["split"], "split")
    summary = split_summary(split, task) | {"unlabelled_excluded": unlabelled}
    _sidecars(job, [job.output["split"]], config={"task": task, "seed": seed}, seed=seed,
              extra={"summary": summary})


def stage_cross_duplicates(job: Job) -> None:
    """Exact / near duplicates between the selected datasets, with each image's split (transfer leakage)."""
    from retinabench.data.duplicates import cross_dataset_duplicates
    p = job.params["duplicates"]
    tables = {}
    for dataset, hashes, split in zip(job.params["datasets"], job.input["hashes"], job.input["splits"]):
        h = read_table(hashes, "image_hashes")
        a = read_table(split, "dataset_split")
        tables[dataset] = h[["image_id", "sha256", "phash"]].merge(a[["image_id", "split"]], on="image_id", how="left")
    pairs = cross_dataset_duplicates(tables, max_distance=p["max_distance"])
    write_table(pairs, job.output["pairs"], "cross_duplicates")
    leak = pairs[(pairs["split_a"] == "train") & (pairs["split_b"] == "test")]
    by = pairs.groupby(["dataset_a", "dataset_b", "kind"]).size().to_dict() if len(pairs) else {}
    _announce(f"retinabench cross-dataset duplicates: {len(pairs)} pairs "
              f"{ {f'{a}~{b} {k}': int(n) for (a, b, k), n in by.items()} }; {len(leak)} test images of a later "
              f"dataset duplicate training images of an earlier one")
    _sidecars(job, [job.output["pairs"]], config={"duplicates": p, "datasets": job.params["datasets"]},
              extra={"n_pairs": int(len(pairs)), "train_test_pairs": int(len(leak))})


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
    extra = {"seconds": round(time.perf_counter() - t0, 2)}
    if "knn" in p["names"]:  # the neighbour count each training regime used (k: auto resolves per regime)
        from retinabench.data.splits import regime_rows
        from retinabench.protocols.knn import resolve_k
        k = (p.get("knn") or {}).get("k", 20)
        extra["knn_k"] = {r: resolve_k(k, len(regime_rows(split, "train", r == "b")))
                          for r in sorted({x.split("-")[0] for x in p["regimes"]})}
    _sidecars(job, [job.output["predictions"], job.output["log"]], config={"task": task, "protocols": p},
              seed=p["seeds"], extra=extra)
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
    "duplicates": stage_duplicates, "task_split": stage_task_split, "cross_duplicates": stage_cross_duplicates,
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


def _remove_job_leftovers(job: Job) -> None:
    """Sidecars and temporary files of the job's outputs. Snakemake deletes the outputs themselves before a job
    runs and after it fails, but not these: a sidecar left beside a deleted output would describe a file that
    no longer exists (or a later, different one)."""
    for out in job.output.values():
        for path in (sidecar_path(out), Path(str(sidecar_path(out)) + ".tmp"), Path(str(out) + ".tmp")):
            if path.is_file():
                path.unlink()


def run_stage(name: str, job: Job) -> None:
    try:
        fn = STAGES[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}; known: {sorted(STAGES)}") from None
    from retinabench.progress import job_summary
    _remove_job_leftovers(job)
    start = time.perf_counter()
    try:
        fn(job)
    except BaseException:
        _remove_job_leftovers(job)
        raise
    outputs = []
    for value in job.output.values():
        outputs.extend([value] if isinstance(value, (str, Path)) else list(value))
    # The log's last line (stdout is the job's log inside Snakemake): what was written, how much, how long.
    print(job_summary(job.rule, job.wildcards, outputs, time.perf_counter() - start), flush=True)

