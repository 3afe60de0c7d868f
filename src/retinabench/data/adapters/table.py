"""The generic TABLE adapter: a dataset that is "a folder of images and one or more tables", configured entirely
in its registry entry (``adapter: table`` + a ``table:`` section). docs/datasets.md ("The table adapter")
documents every option with a worked example; most reference datasets in ``config/datasets.yaml`` use it.

Steps, in order: **sources** (index files or a listing; ``table_read``) -> source ``fields`` and ``unpivot`` ->
**join** -> top-level **fields** -> **filter** (``table_steps``) -> **image** path (through the dataset's root
wall, ``root_wall``) and **image_id** (unique, or ``duplicates: keep_first``; ``image_ids``) -> **metadata**
(``table_meta``) -> **labels** (``labels``). Every row that does not reach the manifest, every unknown label and
every normalised quirk is an exclusion row; nothing is dropped silently.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from retinabench.data.adapters.common import Exclusions, finish_manifest, index_files
from retinabench.data.adapters.image_ids import TABLE_FIX, settle_duplicate_ids
from retinabench.data.adapters.labels import LabelCoding, LabelReader
from retinabench.data.adapters.root_wall import RootWall
from retinabench.data.adapters.table_meta import Coded, read_age
from retinabench.data.adapters.table_read import TableConfigError, cell_text
from retinabench.data.adapters.table_steps import (Row, apply_fields, apply_filter, apply_joins, need_column,
                                                   read_sources)

__all__ = ["OFFICIAL_SPLIT", "Plan", "TableConfigError", "adapt_table", "cell_text", "label_classes", "plan"]

MANIFEST_META = ("patient_id", "eye", "age", "sex", "quality", "site")
OFFICIAL_SPLIT = "official_split"
EYES = ("OD", "OS")
SEXES = ("female", "male")
PARTITIONS = ("train", "val", "test")


@dataclass
class Plan:
    """What the adapter would put in the manifest before hashing: the rows, exclusions, label columns."""
    rows: pd.DataFrame
    exclusions: Exclusions
    label_columns: list[str]


def _config(entry: dict) -> dict:
    cfg = entry.get("table")
    if not isinstance(cfg, dict):
        raise TableConfigError(f"dataset {entry.get('name', '?')!r}: adapter `table` needs a `table:` section")
    return cfg


def label_classes(entry: dict) -> dict[str, list[str]]:
    """``manifest label column -> the classes its codes can produce`` (for registry checks)."""
    out = {}
    for name, spec in (_config(entry).get("labels") or {}).items():
        classes: list[str] = []
        for v in (spec.get("codes") or {}).values():
            if str(v) not in classes:
                classes.append(str(v))
        out[name] = classes
    return out


def plan(root: Path, entry: dict) -> Plan:
    """Read the raw layout into manifest rows (image files checked, not hashed) and exclusions."""
    root = Path(root)
    dataset = entry.get("name", "table")
    cfg = _config(entry)
    excl = Exclusions(dataset)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset {dataset!r}: raw folder {root} not found (is data_root right?)")
    frame = read_sources(root, cfg, excl, dataset)
    frame, join_missing = apply_joins(root, frame, cfg, excl, dataset)
    frame = apply_fields(frame, cfg.get("fields"), where=f"dataset {dataset!r}")
    frame, filtered = apply_filter(frame, cfg.get("filter"), excl, dataset)
    readers = _Readers(cfg, frame, dataset, join_missing, LabelReader.for_entry(excl, entry))
    wall = RootWall(root, dataset)
    resolve = _image_resolver(root, wall, cfg.get("image") or {}, frame, dataset)
    id_template = cfg.get("image_id")

    found: list[tuple[dict, str, str, str]] = []  # (record, source, path, image id) of every row whose image exists
    seen: dict[str, str] = {}  # path -> the source row naming it
    for rec in frame.to_dict("records"):
        src = f"{rec['_file']}:row {rec['_row']}"
        rel, why = resolve(rec)
        if rel is None:
            excl.add(src, id_template.format_map(Row(rec)) if id_template else None, "image", why)
            continue
        image_id = id_template.format_map(Row(rec)) if id_template else Path(rel).with_suffix("").as_posix()
        if rel in seen:
            raise ValueError(f"dataset {dataset!r}: image {rel} is named by two rows ({seen[rel]} and {src}); "
                             f"which labels apply is ambiguous")
        seen[rel] = src
        found.append((rec, src, rel, image_id))
    named = set(seen)  # images of filtered-out rows are named by the index, just not selected
    named.update(rel for rel, _ in map(resolve, filtered.to_dict("records")) if rel is not None)
    unlisted = _unlisted(root, wall, cfg.get("unlisted") or [], named)
    wall.raise_if_breached()

    ids = pd.DataFrame({"image_id": [f[3] for f in found], "path": [f[2] for f in found]})
    kept = settle_duplicate_ids(ids, [f[1] for f in found], dataset=dataset, excl=excl, fix=TABLE_FIX,
                                policy=cfg.get("duplicates", "error"))
    if readers.patient.get("per_image"):
        excl.add("(dataset)", None, "normalised",
                 "the dataset publishes no patient ids: each image is its own patient (eyes or repeat images of "
                 "one person cannot be kept together by the splits)")
    rows = [row for k in kept.index if (row := readers.row(*found[int(k)], excl)) is not None]
    readers.labels.finish()
    for rel in unlisted:
        excl.add(rel, None, "image", "image not named by any index row: no labels or metadata")
    has_partition = bool(readers.meta[OFFICIAL_SPLIT])
    df = pd.DataFrame(rows, columns=["image_id", "path", "dataset", "modality", *MANIFEST_META, OFFICIAL_SPLIT,
                                     *readers.codings])
    if not has_partition:
        df = df.drop(columns=OFFICIAL_SPLIT)
    return Plan(rows=df, exclusions=excl,
                label_columns=list(readers.codings) + ([OFFICIAL_SPLIT] if has_partition else []))


class _Readers:
    """The metadata, patient and label readers of one entry, checked against the frame's columns up front."""

    def __init__(self, cfg: dict, frame: pd.DataFrame, dataset: str, join_missing: dict, labels: LabelReader):
        where = f"dataset {dataset!r}"
        self.dataset, self.join_missing, self.labels = dataset, join_missing, labels
        self.meta = {
            "modality": Coded("modality", cfg.get("modality"), frame, dataset,
                              allowed=("cfp", "oct", "slo", "uwf"), string_is_value=True),
            "eye": Coded("eye", cfg.get("eye"), frame, dataset, allowed=EYES),
            "sex": Coded("sex", cfg.get("sex"), frame, dataset, allowed=SEXES),
            "quality": Coded("quality", cfg.get("quality"), frame, dataset),
            "site": Coded("site", cfg.get("site"), frame, dataset),
            OFFICIAL_SPLIT: Coded("partition", cfg.get("partition"), frame, dataset, allowed=PARTITIONS),
        }
        if not self.meta["modality"]:
            raise TableConfigError(f"{where}: `table.modality` is required (a value or a column)")
        age = cfg.get("age")
        self.age = {"column": age} if isinstance(age, str) else age
        if self.age:
            need_column(frame, self.age.get("column"), where, "`age`")
        self.patient = cfg.get("patient") or {}
        if not self.patient:
            raise TableConfigError(f"{where}: `table.patient` is required (column, template, or per_image: true "
                                   f"when the dataset publishes no patient ids)")
        if self.patient.get("column"):
            need_column(frame, self.patient["column"], where, "`patient`")
        self.codings = {}
        for name, spec in (cfg.get("labels") or {}).items():
            col = spec.get("column")
            if not col:
                raise TableConfigError(f"{where}: label {name!r} needs `column`")
            lower = spec.get("case") == "lower"
            key = (lambda v: v.lower()) if lower else (lambda v: v)
            codes = {key(cell_text(k)): str(v) for k, v in (spec.get("codes") or {}).items()}
            missing = {key(cell_text(k)): str(v) for k, v in (spec.get("missing") or {}).items()}
            self.codings[name] = (LabelCoding(name, col, codes, missing), lower, spec)
            if not (spec.get("optional") and col not in frame.columns):  # optional: absent from some releases
                need_column(frame, col, where, f"label {name!r}")

    def row(self, rec: dict, src: str, rel: str, image_id: str, excl: Exclusions) -> dict | None:
        """The manifest row of one record, or None (recorded) when it has no modality or patient."""
        row: dict[str, Any] = {"image_id": image_id, "path": rel, "dataset": self.dataset}
        for field, coded in self.meta.items():
            row[field] = coded.read(rec, excl, src, image_id)
        if row["modality"] is None:
            excl.add(src, image_id, "image", "no modality for this row")
            return None
        patient = self.patient
        if patient.get("per_image"):
            row["patient_id"] = image_id
        elif patient.get("template"):
            row["patient_id"] = patient["template"].format_map(Row(rec))
        else:
            row["patient_id"] = rec[patient["column"]]
        if not row["patient_id"]:
            if patient.get("fallback") != "per_image":
                excl.add(src, image_id, "image", "patient id empty")
                return None
            row["patient_id"] = image_id
            excl.add(src, image_id, "normalised", "no patient id for this image: it is its own patient")
        row["age"] = read_age(rec, self.age, excl, src, image_id) if self.age else None
        for name, (coding, lower, spec) in self.codings.items():
            sources = spec.get("sources")
            col = coding.raw_column
            if col not in rec:  # an optional label column this table lacks
                excl.add(src, image_id, f"label:{name}", f"no {col!r} column in this label table (optional label)")
                row[name] = None
            elif sources is not None and rec["_source"] not in sources:
                excl.add(src, image_id, f"label:{name}",
                         spec.get("unlabelled_reason", f"not graded in source {rec['_source']!r}"))
                row[name] = None
            elif col in self.join_missing and rec[self.join_missing[col][1]]:
                excl.add(src, image_id, f"label:{name}", f"no row in {self.join_missing[col][0]} for this image")
                row[name] = None
            else:
                raw = rec[col].lower() if lower else rec[col]
                row[name] = self.labels.read(coding, raw, source=src, image_id=image_id)
        return row


def _unlisted(root: Path, wall: RootWall, patterns: list[str], named: set[str]) -> list[str]:
    """Image files under the ``unlisted`` globs that no row names (each is recorded by the caller)."""
    out = []
    for pattern in patterns:
        for p in sorted(root.glob(pattern)):
            rel = wall.relative(p.relative_to(root).as_posix(), file=f"unlisted glob {pattern!r}")
            if rel is not None and rel not in named and p.is_file():
                out.append(rel)
    return out


def _image_resolver(root: Path, wall: RootWall, spec: dict, frame: pd.DataFrame, dataset: str):
    """``rec -> (path relative to the root, or None, and the reason)`` for the image of one row; every
    candidate path passes the root wall before the file system is asked about it."""
    where = f"dataset {dataset!r}, image"
    base = spec.get("base", "")
    extensions = list(spec.get("extensions") or [""])
    no_image = {cell_text(v) for v in spec.get("no_image", [])}
    if "column" in spec:
        need_column(frame, spec["column"], f"dataset {dataset!r}", "`image`")

        def name_of(rec):
            return rec[spec["column"]]
    elif "template" in spec:
        def name_of(rec):
            return spec["template"].format_map(Row(rec))
    elif "index" in spec:
        lookup = index_files(root, spec["index"], key=lambda p: p.stem)
        key_template = spec.get("key")
        if not key_template:
            raise TableConfigError(f"{where}: `index` needs `key` (a template giving the file stem)")

        def resolve_indexed(rec):
            key = key_template.format_map(Row(rec))
            if key in no_image:
                return None, f"no image for this row ({key!r})"
            rel = lookup.get(key)
            if rel is None:
                return None, f"image file not found: no file with stem {key!r} under {spec['index']!r}"
            rel = wall.relative(rel.as_posix(), file=rec["_file"], row=rec["_row"])
            return (rel, "") if rel is not None else (None, "outside the dataset root")
        return resolve_indexed
    elif "path" in frame.columns:  # listing source: the file itself
        def name_of(rec):
            return rec["path"]
    else:
        raise TableConfigError(f"{where}: give `column`, `template` or `index` + `key`")

    def resolve(rec):
        name = name_of(rec)
        if name in no_image or not name:
            return None, f"no image for this row ({name!r})"
        tried = []
        for ext in extensions:
            rel = (Path(base) / f"{name}{ext}").as_posix() if base else f"{name}{ext}"
            rel = wall.relative(rel, file=rec["_file"], row=rec["_row"])
            if rel is None:
                return None, "outside the dataset root"
            tried.append(rel)
            if (root / rel).is_file():
                return rel, ""
        return None, f"image file not found: {' or '.join(tried)}"
    return resolve


def adapt_table(root: Path, entry: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    p = plan(root, entry)
    manifest = finish_manifest(p.rows, Path(root), p.label_columns)
    return manifest, p.exclusions.frame()
