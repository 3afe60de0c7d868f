"""Adapter for the raw folder written by :func:`retinabench.data.phantom.generate_phantom`.

Layout: ``metadata.csv`` (image_id, file, modality, patient_id, eye, age, sex, quality, site, dr_grade,
glaucoma, dme) and the images it names. DR and glaucoma are graded on fundus images, DME on OCT, so a label
that does not apply to a modality is not a missing label; one that should be there and is not is recorded.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from retinabench.data.adapters.common import Exclusions, finish_manifest

LABELS = {  # manifest column -> (metadata column, modality graded on, code -> class name)
    "dr3": ("dr_grade", "cfp", {"0": "none", "1": "npdr", "2": "pdr"}),
    "glaucoma": ("glaucoma", "cfp", {"0": "no", "1": "yes"}),
    "dme": ("dme", "oct", {"0": "no", "1": "yes"}),
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
    meta = pd.read_csv(meta_path, dtype=str, keep_default_na=False)
    missing = [c for c in _COLUMNS if c not in meta.columns]
    if missing:
        raise ValueError(f"{meta_path}: missing columns {missing}")
    excl = Exclusions(dataset)
    rows = []
    for i, rec in meta.iterrows():
        src = f"metadata.csv:row {i + 2}"
        if not (root / rec["file"]).is_file():
            excl.add(src, rec["image_id"], "image", f"image file {rec['file']} not found")
            continue
        row = {"image_id": rec["image_id"], "path": rec["file"], "dataset": dataset, "modality": rec["modality"],
               "patient_id": rec["patient_id"], "eye": rec["eye"] or None,
               "age": float(rec["age"]) if rec["age"] else None, "sex": _SEX.get(rec["sex"]),
               "quality": rec["quality"] or None, "site": rec["site"] or None}
        if rec["sex"] and row["sex"] is None:
            excl.add(src, rec["image_id"], "normalised", f"unknown sex code {rec['sex']!r} read as missing")
        for column, (raw_col, modality, codes) in LABELS.items():
            value = codes.get(rec[raw_col])
            if value is None and rec["modality"] == modality:
                excl.add(src, rec["image_id"], f"label:{column}", f"{raw_col} value {rec[raw_col]!r} not a grade")
            row[column] = value if rec["modality"] == modality else None
        rows.append(row)
    manifest = finish_manifest(pd.DataFrame(rows), root, list(LABELS))
    return manifest, excl.frame()
