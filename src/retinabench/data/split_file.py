"""``split.method: file``: a study's published train/val/test assignment, read from its files and checked for
leakage like the splits retinabench computes.

**Formats** (``split.file.format``), one file or folder per dataset (``split.file.files: {dataset: path}``):

- ``csv``: one row per image, an image column (``image_column``, default ``image_id``) and a split column
  (``split_column``, default ``split``).
- ``focus_split_data``: FOCUS's ``Split_Data/labels_splits_<dataset>.csv`` (dsrestrepo/FOCUS-Retinal-Benchmark):
  the image is in ``image_id`` (``dataset,image_id,split,image_path,Task_*`` for most datasets, ``patient_id,
  image_id,split`` for BRSET) or ``file`` (mBRSET: ``patient,file,split``), matched by default on the name
  without its image extension (``IDRiD_001``, ``img00001``, ``1.1.jpg`` -> ``1.1``). Split values are normalised as
  FOCUS's loader does (``training`` -> train, ``validation`` / ``valid`` -> val); ``all`` or an empty value places
  no image (FOCUS: the dataset unsplit, evaluation only).
- ``imagefolder``: ``<folder>/<train|val|test>/<class>/<image>`` (RETFound's benchmark splits, its BENCHMARK.md;
  torchvision ImageFolder layout), matched on the file name.

**Checks.** A split value other than train / val / test (or the synonyms above) is an error naming the rows; an
image listed twice with different splits is an error naming both rows. File rows that name no manifest image
(``unknown``) and manifest images the file does not place (``unlisted``) are each an error naming the first few,
or, set to ``exclude``, counted in the report and printed by the split job (an excluded manifest image gets split
``none`` and is left out of every task). A patient group (patient ∪ duplicate cluster, as our splits group) in
two splits is an error naming the patient, its images and their rows, unless ``allowed_leaks`` equals the number
of such groups found (so a changed file is noticed); the rows of an allowed leak get ``placed_by = "file: allowed
leak"`` and the per-task checks skip them. A file without val rows (FOCUS's are train / test) needs
``val_from_train``: that fraction of the train images' groups becomes val, placed as ``stratified_grouped``
places them.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pandas as pd

from retinabench.data.split_groups import SplitError
from retinabench.data.split_stratified import label_profiles, strata, stratified_positions
from retinabench.hashing import unit_hash
from retinabench.schemas import SPLITS

SYNONYMS = {"training": "train", "validation": "val", "valid": "val", "testing": "test"}
NO_SPLIT = {"", "all", "nan", "none"}
IMAGE_EXT = re.compile(r"\.(jpe?g|png|tiff?|bmp|gif|dcm|npz)$", re.IGNORECASE)
EXCLUDED = "none"  # split of a manifest image a file does not place (unlisted: exclude)
LEAK_ALLOWED = "file: allowed leak"
AUTO_MATCH = {"csv": "image_id", "focus_split_data": "stem", "imagefolder": "name"}
SHOWN = 5


def stem(name: str) -> str:
    """A file name without its image extension (only known image extensions: ``1.1`` stays ``1.1``)."""
    return IMAGE_EXT.sub("", str(name).replace("\\", "/").rsplit("/", 1)[-1])


def dataset_file(settings: dict, dataset: str) -> Path:
    files = settings.get("files") or {}
    if dataset not in files:
        raise SplitError(f"split.method is file but split.file.files has no entry for dataset {dataset!r} (it "
                         f"names {sorted(files) or 'none'}); add `{dataset}: <path>` or choose another method")
    return Path(files[dataset])


def read_split_file(path: Path, fmt: str, *, image_column: str | None = None, split_column: str = "split"
                    ) -> pd.DataFrame:
    """``value`` (the image as the file names it), ``split`` (normalised; None: no split) and ``row`` (where)."""
    if not path.exists():
        raise SplitError(f"split file {path} not found (split.file.files)")
    if fmt == "imagefolder":
        if not path.is_dir():
            raise SplitError(f"split folder {path} is not a folder (format imagefolder: <folder>/<split>/<class>/"
                             f"<image>)")
        files = sorted(p for p in path.glob("*/*/*") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise SplitError(f"split folder {path} holds no <split>/<class>/<image> files")
        rel = [p.relative_to(path).as_posix() for p in files]
        raw = pd.DataFrame({"value": [p.name for p in files], "split": [r.split("/")[0] for r in rel], "row": rel})
    else:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
        if image_column is None:
            image_column = "file" if fmt == "focus_split_data" and "image_id" not in table else "image_id"
        missing = [c for c in (image_column, split_column) if c not in table.columns]
        if missing:
            raise SplitError(f"split file {path}: no column {missing} (columns: {list(table.columns)}); set "
                             f"split.file.image_column / split_column")
        raw = pd.DataFrame({"value": table[image_column].str.strip(), "split": table[split_column],
                            "row": [f"{path.name} line {i + 2}" for i in range(len(table))]})
    s = raw["split"].astype(str).str.strip().str.lower().replace(SYNONYMS)
    bad = raw[~s.isin(SPLITS) & ~s.isin(NO_SPLIT)]
    if len(bad):
        raise SplitError(f"split file {path}: split values {sorted(set(bad['split']))} are not train / val / test "
                         f"({len(bad)} rows, e.g. {', '.join(bad['row'].head(SHOWN))})")
    return raw.assign(split=s.where(s.isin(SPLITS), None))


def manifest_keys(manifest: pd.DataFrame, match: str) -> pd.Series:
    """The manifest's matching key per image (index: image id); two images with one key are an error."""
    if match == "image_id":
        keys = manifest["image_id"].astype(str)
    else:
        path = manifest["path"].astype(str).str.replace("\\", "/", regex=False)
        keys = path if match == "path" else path.str.rsplit("/", n=1).str[-1]
        keys = keys.map(stem) if match == "stem" else keys
    keys = pd.Series(keys.to_numpy(), index=manifest["image_id"].to_numpy())
    dup = keys[keys.duplicated(keep=False)]
    if len(dup):
        k = dup.iloc[0]
        raise SplitError(f"split.file.match {match!r}: images {sorted(dup[dup == k].index)[:SHOWN]} share the key "
                         f"{k!r} ({dup.nunique()} such keys); match on another key (image_id, path, name, stem)")
    return keys


def file_key(values: pd.Series, match: str) -> pd.Series:
    v = values.astype(str).str.replace("\\", "/", regex=False)
    if match == "name":
        return v.str.rsplit("/", n=1).str[-1]
    return v.map(stem) if match == "stem" else v


def _listed(what: str, rows: pd.DataFrame, col: str, path: Path) -> str:
    return f"{len(rows)} {what} in {path}, e.g. " + ", ".join(f"{v} ({r})" for v, r in
                                                             zip(rows[col].head(SHOWN), rows["row"].head(SHOWN)))


def assign_from_file(manifest: pd.DataFrame, groups: pd.DataFrame, report: dict, settings: dict, *, dataset: str,
                     tasks: list[dict], fractions: dict[str, float], seed: int) -> tuple[pd.DataFrame, dict]:
    """The assignment the dataset's split file gives (schema ``dataset_split`` columns) and its report."""
    fmt = settings.get("format", "csv")
    path = dataset_file(settings, dataset)
    match = settings.get("match", "auto")
    match = AUTO_MATCH[fmt] if match == "auto" else match
    f = read_split_file(path, fmt, image_column=settings.get("image_column"),
                        split_column=settings.get("split_column", "split"))
    keys = manifest_keys(manifest, match)
    image_of = pd.Series(keys.index, index=keys.to_numpy())
    f["key"] = file_key(f["value"], match)
    f["image_id"] = f["key"].map(image_of)
    unknown = f[f["image_id"].isna()]
    if len(unknown) and settings.get("unknown", "error") == "error":
        raise SplitError(f"dataset {dataset!r}: {_listed('rows name no manifest image', unknown, 'value', path)} "
                         f"(matched on {match}); fix the file or set split.file.unknown: exclude")
    f = f[f["image_id"].notna() & f["split"].notna()]
    twice = f[f.duplicated("image_id", keep=False)].drop_duplicates(["image_id", "split"])
    twice = twice[twice.duplicated("image_id", keep=False)]
    if len(twice):
        i = twice["image_id"].iloc[0]
        rows = twice[twice["image_id"] == i]
        raise SplitError(f"dataset {dataset!r}: image {i} is listed in splits {list(rows['split'])} (rows "
                         f"{', '.join(rows['row'])} of {path}; {twice['image_id'].nunique()} such images)")
    f = f.drop_duplicates("image_id")
    out = groups.copy()
    out["split"] = out["image_id"].map(dict(zip(f["image_id"], f["split"])))
    out["placed_by"] = "file"
    unlisted = out[out["split"].isna()]
    if len(unlisted) and settings.get("unlisted", "error") == "error":
        raise SplitError(f"dataset {dataset!r}: {len(unlisted)} manifest images are not placed by {path} (not "
                         f"listed, or with split 'all' / empty), e.g. {list(unlisted['image_id'].head(SHOWN))} "
                         f"(matched on {match}); set split.file.unlisted: exclude to leave them out of every task")
    out["split"] = out["split"].fillna(EXCLUDED)
    n_val_carved = 0
    if not (out["split"] == "val").any():
        if settings.get("val_from_train") is None:
            raise SplitError(f"dataset {dataset!r}: {path} has no val rows (splits {sorted(set(f['split']))}); set "
                             f"split.file.val_from_train (e.g. 0.15) to carve val from its train groups")
        n_val_carved = _carve_val(out, manifest, tasks, float(settings["val_from_train"]), seed)
    placed = out[out["split"].isin(SPLITS)]
    per = placed.groupby("group_id")["split"].nunique()
    leaks = sorted(per[per > 1].index)
    allowed = int(settings.get("allowed_leaks", 0))
    if len(leaks) != allowed:
        if not leaks:
            raise SplitError(f"dataset {dataset!r}: split.file.allowed_leaks is {allowed} but {path} puts no patient "
                             f"group in two splits; set it to 0")
        g = leaks[0]
        rows = placed[placed["group_id"] == g].merge(f[["image_id", "row"]], on="image_id", how="left")
        who = ", ".join(sorted(set(rows["patient_id"].dropna().astype(str)))) or "(no patient id: duplicates)"
        raise SplitError(f"dataset {dataset!r}: {path} puts {len(leaks)} patient groups (patient ∪ duplicate "
                         f"cluster) in two splits, split.file.allowed_leaks is {allowed}; e.g. patient {who}: "
                         + "; ".join(f"{i} {s} ({r})" for i, s, r in
                                     zip(rows["image_id"].head(SHOWN), rows["split"], rows["row"].fillna("?")))
                         + ". Fix the file or set allowed_leaks to the count to accept them (recorded)")
    out.loc[out["group_id"].isin(leaks) & out["split"].isin(SPLITS), "placed_by"] = LEAK_ALLOWED
    realised = placed["split"].value_counts(normalize=True).reindex(list(SPLITS), fill_value=0.0)
    report |= {"method": "file", "format": fmt, "file": str(path), "match": match, "seed": seed,
               "fractions": fractions, "realised_fractions": {s: round(float(realised[s]), 4) for s in SPLITS},
               "tolerance": {s: None for s in SPLITS}, "class_presence_moves": [], "classes_too_rare": [],
               "file_rows": int(len(f)), "unknown_rows_excluded": int(len(unknown)),
               "unlisted_images_excluded": int(len(unlisted)), "val_carved_from_train": n_val_carved,
               "allowed_leaks": len(leaks)}
    out = out.assign(dataset=dataset)
    out["patient_id"] = out["patient_id"].astype(object).where(out["patient_id"].notna(), None)
    return out, report


def _carve_val(out: pd.DataFrame, manifest: pd.DataFrame, tasks: list[dict], fraction: float, seed: int) -> int:
    """Move ``fraction`` of the train images' groups (wholly in train) to val, stratified as stratified_grouped."""
    in_train = out.groupby("group_id")["split"].agg(lambda s: set(s) == {"train"})
    train = out[out["group_id"].isin(in_train[in_train].index)]
    if train["group_id"].nunique() < 2:
        raise SplitError("split.file.val_from_train: fewer than 2 patient groups in the file's train split")
    u = {g: unit_hash("retinabench-split-file-val", seed, g) for g in train["group_id"].unique()}
    stratum_of = strata(label_profiles(manifest[manifest["image_id"].isin(train["image_id"])], train, tasks))
    pos = stratified_positions(train["group_id"].value_counts(), stratum_of, u, seed, "retinabench-split-file-val")
    val = [g for g, p in pos.items() if p >= 1.0 - fraction]
    mask = out["group_id"].isin(val).to_numpy()
    out.loc[mask, "split"] = "val"
    return int(np.sum(mask))


def split_source(split: dict, dataset: str) -> dict:
    """What decides a rerun of the dataset's split job under ``method: file``: the file's sha256 (csv formats) or
    that of the folder's sorted ``<split>/<class>/<image>`` listing (imagefolder); {} for the other methods."""
    if split.get("method") != "file":
        return {}
    file = split.get("file") or {}
    path = dataset_file(file, dataset)
    if not path.exists():
        return {"path": str(path), "sha256": None}
    h = hashlib.sha256()
    if path.is_dir():
        for p in sorted(q.relative_to(path).as_posix() for q in path.glob("*/*/*") if q.is_file()):
            h.update(p.encode() + b"\n")
    else:
        h.update(path.read_bytes())
    return {"path": str(path), "sha256": h.hexdigest()}


def split_inputs(split: dict, dataset: str) -> list[str]:
    """The split job's extra input: the dataset's split file (or folder) under ``method: file``."""
    return [str(dataset_file(split.get("file") or {}, dataset))] if split.get("method") == "file" else []
