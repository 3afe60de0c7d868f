"""Adapter for the TVHL eye fundus + OCT dataset (Hughes Cano, Olivares Pinto & Thébault).

Raw layout: ``EYE FUNDUS.csv`` and ``OCT.csv`` (columns Name, DME, DR, Size, Format) and images under
``EYE FUNDUS/EYE FUNDUS<k>/<Name>.jpg`` and ``OCT/OCT<k>/<Name>.jpg``. Names are
``<patient>_<eye OD|OI>_<modality f|o>_<sample>``.

Decisions (each recorded in the exclusions table):
- eye codes in lower case (``od``/``oi``) are normalised; ``OI`` (oculus izquierdo) becomes ``OS``.
- the modality letter sometimes disagrees with the CSV/folder the image is listed in; the folder (and CSV) is
  trusted — it is how the authors grouped and graded the images — and the disagreement is recorded.
- DR ``-`` (documented as unknown) and an empty DR are missing labels for the DR task only; the image stays for
  DME. Any other DR or DME value is invalid: an error listing every such row (or, with the dataset entry's
  ``invalid_labels: exclude``, an exclusion with reason "invalid value").
- the same image file name in two sub-folders is an error naming both paths.
- a CSV row without its image, or an image without a CSV row, is dropped and recorded.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from retinabench.data.adapters.common import Exclusions, finish_manifest, index_files
from retinabench.data.adapters.index_text import read_index_csv
from retinabench.data.adapters.labels import LabelCoding, LabelReader
from retinabench.data.adapters.root_wall import RootWall

_SOURCES = {  # modality -> (csv name, image folder, expected modality letter)
    "cfp": ("EYE FUNDUS.csv", "EYE FUNDUS", "f"),
    "oct": ("OCT.csv", "OCT", "o"),
}
_NAME = re.compile(r"^(?P<patient>\d+)_(?P<eye>[A-Za-z]{2})_(?P<mod>[A-Za-z])_(?P<sample>\d+)$")
_EYES = {"OD": "OD", "OI": "OS", "OS": "OS"}
DR = LabelCoding("dr3", "DR", {"0": "none", "NPDR": "npdr", "PDR": "pdr"},
                 missing={"-": "DR grade '-' (unknown)", "": "DR grade empty"})
DME = LabelCoding("dme", "DME", {"0": "no", "1": "yes"})
LABEL_COLUMNS = ["dr3", "dme"]


def adapt_tvhl(root: Path, entry: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    root = Path(root)
    dataset = entry.get("name", "tvhl")
    excl = Exclusions(dataset)
    labels = LabelReader.for_entry(excl, entry)
    wall = RootWall(root, dataset)
    rows = []
    for modality, (csv_name, folder, letter) in _SOURCES.items():
        csv_path = root / csv_name
        if not csv_path.is_file():
            raise FileNotFoundError(f"tvhl adapter: {csv_path} not found (is data_root right?)")
        table = read_index_csv(csv_path, dataset=dataset, configurable=False, dtype=str, keep_default_na=False)
        missing_cols = {"Name", "DME", "DR"} - set(table.columns)
        if missing_cols:
            raise ValueError(f"{csv_path}: missing columns {sorted(missing_cols)}")
        on_disk = index_files(root, f"{folder}/*/*.jpg")
        listed = set()
        for i, rec in table.iterrows():
            src = f"{csv_name}:row {i + 2}"  # +2: header line and 1-based numbering, as a spreadsheet shows it
            name = rec["Name"].strip()
            listed.add(name)
            image_id = f"{modality}_{name}"
            m = _NAME.match(name)
            if not m:
                excl.add(src, image_id, "image", f"unparseable name {name!r}")
                continue
            eye_raw = m["eye"]
            eye = _EYES.get(eye_raw.upper())
            if eye is None:
                excl.add(src, image_id, "image", f"unknown eye code {eye_raw!r}")
                continue
            if eye_raw != eye_raw.upper():
                excl.add(src, image_id, "normalised", f"lower-case eye code {eye_raw!r} read as {eye}")
            if m["mod"] != letter:
                excl.add(src, image_id, "normalised",
                         f"modality letter {m['mod']!r} disagrees with {folder}/ and {csv_name}; kept as {modality}")
            path = on_disk.get(name)
            if path is None:
                excl.add(src, image_id, "image", f"image file {name}.jpg not found under {folder}/")
                continue
            rel = wall.relative(path.as_posix(), file=csv_name, row=i + 2)
            if rel is None:
                continue
            dr = labels.read(DR, rec["DR"], source=src, image_id=image_id)
            dme = labels.read(DME, rec["DME"], source=src, image_id=image_id)
            rows.append({"image_id": image_id, "path": rel, "dataset": dataset,
                         "modality": modality, "patient_id": m["patient"], "eye": eye, "dr3": dr, "dme": dme})
        for stem in sorted(set(on_disk) - listed):
            excl.add(str(on_disk[stem]), f"{modality}_{stem}", "image",
                     f"image not listed in {csv_name}: no labels")
    wall.raise_if_breached()
    labels.finish()
    manifest = finish_manifest(pd.DataFrame(rows), root, LABEL_COLUMNS)
    return manifest, excl.frame()
