"""Stages of workflow/rules/data.smk: phantom, manifest, duplicates, split, task_split, cross_duplicates,
image_cache (retinabench.data does the work)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from retinabench.data.reports import exclusion_lines, exclusion_summary, manifest_report
from retinabench.pipeline.job import Job, announce, write_artifact, write_outputs
from retinabench.pipeline.stages import stage
from retinabench.schemas import read_table
from retinabench.settings.data import ImagesSettings, PhantomSettings, SplitSettings


@stage("phantom")
def stage_phantom(job: Job) -> None:
    from retinabench.data.phantom import generate_phantom
    p = PhantomSettings.of(job.params["phantom"])
    out = Path(job.output["metadata"])
    meta = generate_phantom(out.parent, n_patients=p.n_patients, seed=p.seed, image_size=p.image_size, sites=p.sites)
    write_outputs(job, written=[str(out)], config={"phantom": job.params["phantom"]}, seed=p.seed,
              extra={"n_images": int(len(meta)), "raw_files": [{"path": str(out.parent), "note": "generated"}]})


@stage("manifest")
def stage_manifest(job: Job) -> None:
    """Adapter -> subsample -> decode pass (corrupt check + perceptual hash, cached by sha256) -> minimum size ->
    outputs."""
    from retinabench.data.adapters import get_adapter
    from retinabench.data.image_checks import CACHE_NAME, apply_corrupt_policy, check_images, exclude_too_small
    from retinabench.data.raw_state import RawState
    from retinabench.data.subsample import apply_subsample
    from retinabench.hashing import sha256_file
    entry, root = job.params["dataset"], Path(job.params["root"])
    min_side = ImagesSettings.of(job.params["images"]).min_side
    dataset = entry.get("name", job.wildcards.get("dataset", "?"))
    data_dir = Path(job.output["manifest"]).parent
    raw_state = None if entry.get("generated") else RawState(root, data_dir)
    primed = raw_state.prime_hash_memo() if raw_state else 0  # unchanged files are not re-hashed
    manifest, exclusions = get_adapter(entry["adapter"])(root, entry)
    manifest, exclusions, sub = apply_subsample(manifest, exclusions, entry.get("subsample"), dataset=dataset)
    checks, decode = check_images(manifest, root, cache_path=data_dir / CACHE_NAME, threads=job.threads)
    manifest, exclusions = apply_corrupt_policy(manifest, exclusions, checks, dataset=dataset,
                                                policy=entry.get("on_corrupt", "error"))
    manifest, exclusions, n_small = exclude_too_small(manifest, exclusions, checks, dataset=dataset,
                                                      min_side=min_side)
    if manifest.empty:  # every task of the dataset would fail later, blaming its split instead
        raise ValueError(f"dataset {dataset!r}: no image reached the manifest ({entry.get('modalities')} declared); "
                         f"exclusions by scope and reason:\n" + "\n".join(exclusion_lines(exclusions, indent="  ")))
    hashes = checks[checks["image_id"].isin(manifest["image_id"])]
    hashes = hashes.astype({"width": "int64", "height": "int64"})[["image_id", "sha256", "width", "height", "mode",
                                                                   "phash"]]
    write_artifact(manifest, job.output["manifest"], "manifest")
    write_artifact(exclusions, job.output["exclusions"], "exclusions")
    write_artifact(hashes.sort_values("image_id").reset_index(drop=True), job.output["hashes"], "image_hashes")
    index_files = [root / f for f in entry.get("index_files", [])]  # inputs only when generated (a location)
    raw = [{"path": str(Path(f)), "sha256": sha256_file(f), "note": "index file"} for f in index_files]
    raw.append({"path": str(root), "note": f"{len(manifest)} images; per-file sha256 in the manifest's sha256 column"})
    if raw_state:
        raw_state.record(job.output["raw_files"])
    else:
        write_artifact(pd.DataFrame(columns=["path", "size", "mtime_ns", "sha256"]), job.output["raw_files"], "raw_files")
    by_reason = exclusion_summary(exclusions, limit=0)
    summary = {"n_images": int(len(manifest)), "n_patients": int(manifest["patient_id"].nunique()),
               "by_modality": manifest["modality"].value_counts().to_dict(),
               "exclusions": by_reason.to_dict("records"), "decode": decode, "sha256_reused": primed,
               "subsample": sub, "too_small": {"min_side": min_side, "excluded": n_small}}
    extra = {"decode pass": f"{decode['decoded']} decoded, {decode['cached']} from the sha256 cache, "
                            f"{decode['corrupt']} corrupt",
             "minimum size": f"{n_small} image(s) under {min_side} px on the short side excluded (images.min_side)"}
    if sub:
        extra["subsample"] = (f"{sub['patients_kept']} of {sub['patients_total']} patients, {sub['images_kept']} "
                              f"of {sub['images_total']} images ({sub['spec']})")
    announce(manifest_report(dataset, manifest, exclusions, extra))
    write_outputs(job, written=[job.output[k] for k in ("manifest", "exclusions", "hashes", "raw_files")],
              config={"dataset": entry, "root": str(root), "images": job.params["images"]},
              extra={"summary": summary, "raw_files": raw,
                     "raw_images": {"root": str(root), "snapshot": job.output["raw_files"],
                                    "manifest": job.output["manifest"]} if raw_state else None})


@stage("image_cache")
def stage_image_cache(job: Job) -> None:
    from retinabench.data.image_cache import build_image_cache
    manifest = read_table(job.input["manifest"], "manifest")
    p = job.params["image_cache"]
    n = build_image_cache(manifest, job.params["root"], job.output["array"], job.output["index"], size=p["size"],
                          resize=p["resize"], threads=job.threads)
    write_outputs(job, written=[job.output["array"], job.output["index"]], config={"image_cache": p},
              extra={"n_images": n})


@stage("duplicates")
def stage_duplicates(job: Job) -> None:
    from retinabench.data.duplicates import HASH_VERSION, duplicate_summary, find_duplicates
    manifest = read_table(job.input["manifest"], "manifest")
    hashes = read_table(job.input["hashes"], "image_hashes")
    p = job.params["duplicates"]
    images = manifest[["image_id", "patient_id", "sha256"]].merge(hashes[["image_id", "phash"]], on="image_id",
                                                                  how="left", validate="one_to_one")
    dups = find_duplicates(images, max_distance=p["max_distance"])
    write_artifact(dups, job.output["duplicates"], "duplicates")
    summary = duplicate_summary(dups)
    announce(f"retinabench duplicates {job.wildcards.get('dataset', '')}: {summary['clusters']} clusters "
              f"({summary['exact_clusters']} all byte-identical) holding {summary['images']} images "
              f"({summary['exact_images']} exact, {summary['near_images']} near within {p['max_distance']} bits); "
              f"{summary['clusters_spanning_patients']} span several patient ids")
    write_outputs(job, written=[job.output["duplicates"]], config={"duplicates": p},
              extra={"summary": summary, "perceptual_hash": HASH_VERSION})


@stage("split")
def stage_split(job: Job) -> None:
    """The dataset's one assignment, used by every task of it (retinabench.data.splits)."""
    from retinabench.data.splits import assign_splits
    manifest = read_table(job.input["manifest"], "manifest")
    dups = read_table(job.input["duplicates"], "duplicates")
    p = SplitSettings.of(job.params["split"])
    dataset = job.wildcards.get("dataset") or str(manifest["dataset"].iloc[0])
    assignment, report = assign_splits(manifest, job.params["tasks"], fractions=p.fractions.plain(), seed=p.seed,
                                       duplicates=dups, near=p.group_near_duplicates, method=p.method,
                                       dataset=dataset, file=p.file.model_dump())
    write_artifact(assignment, job.output["split"], "dataset_split")
    source = (f"; file {report['file']} ({report['format']}, matched on {report['match']}): "
              f"{report['unknown_rows_excluded']} rows naming no manifest image and {report['unlisted_images_excluded']}"
              f" unplaced manifest images excluded, {report['val_carved_from_train']} train images carved into val, "
              f"{report['allowed_leaks']} allowed leaks") if p.method == "file" else ""
    announce(f"retinabench split {dataset} ({report['method']}, seed {p.seed}): {report['n_groups']} groups of "
              f"{report['n_patients']} patients; {report['groups_merging_patients']} groups merge "
              f"{report['patients_in_merged_groups']} patients through duplicates; realised "
              f"{report['realised_fractions']} (tolerance ± {report['tolerance']}); "
              f"{len(report['class_presence_moves'])} groups moved for class presence; largest label deviation "
              f"per task {report['label_deviation']}" + source
              + (f"; {report['note']}" if report.get("note") else ""))
    write_outputs(job, written=[job.output["split"]], config={"split": job.params["split"],
                                                              "tasks": [t["name"] for t in job.params["tasks"]]},
                  seed=p.seed, extra={"summary": report})


@stage("task_split")
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
    split = task_split(manifest, assignment, task, seed=seed, exclusions=exclusions)
    write_artifact(split, job.output["split"], "split")
    summary = split_summary(split, task) | {"unlabelled_excluded": unlabelled}
    write_outputs(job, written=[job.output["split"]], config={"task": task, "seed": seed}, seed=seed,
              extra={"summary": summary})


@stage("cross_duplicates")
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
    write_artifact(pairs, job.output["pairs"], "cross_duplicates")
    leak = pairs[(pairs["split_a"] == "train") & (pairs["split_b"] == "test")]
    by = pairs.groupby(["dataset_a", "dataset_b", "kind"]).size().to_dict() if len(pairs) else {}
    announce(f"retinabench cross-dataset duplicates: {len(pairs)} pairs "
              f"{ {f'{a}~{b} {k}': int(n) for (a, b, k), n in by.items()} }; {len(leak)} test images of a later "
              f"dataset duplicate training images of an earlier one")
    write_outputs(job, written=[job.output["pairs"]], config={"duplicates": p, "datasets": job.params["datasets"]},
              extra={"n_pairs": int(len(pairs)), "train_test_pairs": int(len(leak))})
