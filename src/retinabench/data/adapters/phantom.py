"""Adapter for the raw folder written by :func:`retinabench.data.phantom.generate_phantom`.

Layout: ``metadata.csv`` (image_id, file, modality, patient_id, eye, age, sex, quality, site, dr_grade,
glaucoma, dme) and the images it names. DR and glaucoma are graded on fundus images, DME on OCT, so a label
that does not apply to a modality is not a missing label; an empty grade where one applies is a missing label
(recorded), and any other value is invalid (an error listing every such row; see ``adapters/labels.py``).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from retinabench.data.adapters.common import Exclusions, finish_manifest
from retinabench.data.adapters.index_text import read_index_csv
from retinabench.data.adapters.labels import LabelCoding, LabelReader
from retinabench.data.adapters.root_wall import RootWall

_UNGRADED = {"": "not graded"}
LABELS = {  # manifest column -> (coding of its metadata column, modality graded on)
    "dr3": (LabelCoding("dr3", "dr_grade", {"0": "none", "1": "npdr", "2": "pdr"}, _UNGRADED), "cfp"),
    "glaucoma": (LabelCoding("glaucoma", "glaucoma", {"0": "no", "1": "yes"}, _UNGRADED), "cfp"),
    "dme": (LabelCoding("dme", "dme", {"0": "no", "1": "yes"}, _UNGRADED), "oct"),
}
_SEX = {"F": "female", "M": "male"}
_COLUMNS = ["image_id", "file", "modality", "patient_id", "eye", "age", "sex", "quality", "site",
            "dr_grade", "glaucoma", "dme"]


def adapt_phantom(root: Path, entry: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    root = Path(root)
    dataset = entry.get("name", "phantom")
    meta_path = root / "metadata.csv"
    if not meta_path.is_file():
        raise FileNotFoundError(f"phantom adapter: {meta_path} not found (run the phantom rule first)")
    meta = read_index_csv(meta_path, dataset=dataset, configurable=False, dtype=str, keep_default_na=False)
    missing = [c for c in _COLUMNS if c not in meta.columns]
    if missing:
        raise ValueError(f"{meta_path}: missing columns {missing}")
    excl = Exclusions(dataset)
    labels = LabelReader.for_entry(excl, entry)
    wall = RootWall(root, dataset)
    rows = []
    for i, rec in meta.iterrows():
        src = f"metadata.csv:row {i + 2}"
        if wall.relative(rec["file"], file="metadata.csv", row=i + 2) is None:
            continue
        if not (root / rec["file"]).is_file():
            excl.add(src, rec["image_id"], "image", f"image file {rec['file']} not found")
            continue
        row = {"image_id": rec["image_id"], "path": rec["file"], "dataset": dataset, "modality": rec["modality"],
               "patient_id": rec["patient_id"], "eye": rec["eye"] or None,
               "age": float(rec["age"]) if rec["age"] else None, "sex": _SEX.get(rec["sex"]),
               "quality": rec["quality"] or None, "site": rec["site"] or None}
        if rec["sex"] and row["sex"] is None:
            excl.add(src, rec["image_id"], "normalised", f"unknown sex code {rec['sex']!r} read as missing")
        for column, (coding, modality) in LABELS.items():
            applies = rec["modality"] == modality
            row[column] = labels.read(coding, rec[coding.raw_column], source=src,
                                      image_id=rec["image_id"]) if applies else None
        rows.append(row)
    wall.raise_if_breached()
    labels.finish()
    manifest = finish_manifest(pd.DataFrame(rows), root, list(LABELS))
    return manifest, excl.frame()
