"""Adapter for the Harvard ophthalmology NPZ releases that publish no index table: one ``.npz`` archive per
subject holding the image(s) and the subject's attributes (Harvard Glaucoma Fairness ``dataset/{train,val,test}/
*.npz``; FairFedMed ``all/*.npz``).

Options (the dataset entry's ``npz:`` section):

- ``folders``: ``{folder: partition}`` — where the archives are and which official partition each folder is
  (``null`` when the folder mixes partitions); ``glob`` (default ``*.npz``).
- ``modality``: what the image key holds (``slo`` for ``slo_fundus``, ``oct`` for ``rnflt`` / ``oct_bscans``);
  which array is the image follows :data:`retinabench.data.readers.NPZ_IMAGE_KEYS` and is checked per file.
- ``labels``: ``{manifest column: {key, codes, missing}}`` — scalar keys of the archive read through
  :class:`LabelCoding` (``0``/``1`` as stored; documented codings only).
- metadata keys: ``age`` (years), ``male`` (0 female, 1 male), ``pid`` when present; without ``pid`` each
  archive is its own patient (the releases state one sample per patient), recorded once.

Archives are opened with ``allow_pickle=False``: an attribute stored as a pickled object array is an error
naming the file and key rather than code execution. A scalar key missing from one archive is a missing value,
recorded; an archive without any image key is dropped and recorded.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from retinabench.data.adapters.common import Exclusions, finish_manifest
from retinabench.data.adapters.labels import LabelCoding, LabelReader
from retinabench.data.adapters.root_wall import RootWall
from retinabench.data.adapters.table import OFFICIAL_SPLIT, Plan, cell_text
from retinabench.data.readers import NPZ_IMAGE_KEYS

_SEX = {"0": "female", "1": "male"}


def _config(entry: dict) -> dict:
    cfg = entry.get("npz")
    if not isinstance(cfg, dict) or not cfg.get("folders"):
        raise ValueError(f"dataset {entry.get('name', '?')!r}: adapter harvard_npz needs `npz.folders`")
    return cfg


def label_classes(entry: dict) -> dict[str, list[str]]:
    return {name: list(dict.fromkeys(str(v) for v in spec["codes"].values()))
            for name, spec in (_config(entry).get("labels") or {}).items()}


def _scalar(archive, key: str, path: Path):
    if key not in archive.files:
        return None
    try:
        value = archive[key]
    except ValueError as err:  # object arrays need pickle, which is never allowed here
        raise ValueError(f"{path}: key {key!r} is a pickled object array; refusing to unpickle it") from err
    value = np.asarray(value)
    if value.size != 1:
        raise ValueError(f"{path}: key {key!r} has shape {value.shape}, expected a scalar")
    return value.reshape(()).item()


def plan(root: Path, entry: dict) -> Plan:
    root = Path(root)
    dataset = entry.get("name", "harvard_npz")
    cfg = _config(entry)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset {dataset!r}: raw folder {root} not found (is data_root right?)")
    excl = Exclusions(dataset)
    reader = LabelReader.for_entry(excl, entry)
    codings = {name: LabelCoding(name, spec["key"], {cell_text(k): str(v) for k, v in spec["codes"].items()},
                                 {cell_text(k): str(v) for k, v in (spec.get("missing") or {}).items()})
               for name, spec in (cfg.get("labels") or {}).items()}
    modality = cfg.get("modality")
    if modality not in ("cfp", "oct", "slo", "uwf"):
        raise ValueError(f"dataset {dataset!r}: npz.modality must be cfp, oct, slo or uwf, got {modality!r}")
    rows, any_pid = [], False
    wall = RootWall(root, dataset)
    for folder, partition in cfg["folders"].items():
        base = root / folder
        if not base.is_dir():
            raise FileNotFoundError(f"dataset {dataset!r}: folder {base} not found")
        for path in sorted(base.glob(cfg.get("glob", "*.npz"))):
            rel = wall.relative(path.relative_to(root).as_posix(), file=f"folder {folder!r}")
            if rel is None:  # never opened: reported with every other such archive below
                continue
            image_id = str(Path(rel).with_suffix(""))
            with np.load(path, allow_pickle=False) as archive:
                if not any(k in archive.files for k in NPZ_IMAGE_KEYS):
                    excl.add(rel, image_id, "image", f"no image key {list(NPZ_IMAGE_KEYS)} in the archive "
                                                     f"(keys {archive.files})")
                    continue
                values = {k: _scalar(archive, k, path) for k in ["age", "male", "pid"] +
                          [c.raw_column for c in codings.values()]}
            pid = cell_text(values["pid"])
            any_pid |= bool(pid)
            sex = _SEX.get(cell_text(values["male"]))
            if values["male"] is not None and sex is None:
                excl.add(rel, image_id, "normalised", f"unknown male code {values['male']!r} read as missing")
            age = values["age"]
            row = {"image_id": image_id, "path": rel, "dataset": dataset, "modality": modality,
                   "patient_id": pid or image_id, "eye": None,
                   "age": float(age) if age is not None and cell_text(age) else None, "sex": sex,
                   "quality": None, "site": None, OFFICIAL_SPLIT: partition}
            for name, coding in codings.items():
                raw = values[coding.raw_column]
                if raw is None:
                    excl.add(rel, image_id, f"label:{name}", f"key {coding.raw_column!r} not in the archive")
                    row[name] = None
                else:
                    row[name] = reader.read(coding, raw, source=rel, image_id=image_id)
            rows.append(row)
    wall.raise_if_breached()
    reader.finish()
    if rows and not any_pid:
        excl.add("(dataset)", None, "normalised",
                 "no archive carries a `pid`: each archive is its own patient (the release states one sample "
                 "per patient)")
    cols = ["image_id", "path", "dataset", "modality", "patient_id", "eye", "age", "sex", "quality", "site",
            OFFICIAL_SPLIT, *codings]
    return Plan(rows=pd.DataFrame(rows, columns=cols), exclusions=excl,
                label_columns=list(codings) + [OFFICIAL_SPLIT])


def adapt_harvard_npz(root: Path, entry: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    p = plan(root, entry)
    return finish_manifest(p.rows, Path(root), p.label_columns), p.exclusions.frame()
