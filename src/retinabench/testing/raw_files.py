"""The files of the raw-layout fixtures (retinabench.testing.raw_fixtures): small phantom images in the published
formats (JPEG/PNG/TIFF/BMP via Pillow, DICOM via pydicom, NPZ via numpy) and index files (CSV/TSV with header quirks,
XLSX). Each file is generated; nothing here is committed as binary.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

SIZE = 64


# ------------------------------------------------------------------------------------------ phantom images
def phantom_array(seed: int, size: int = SIZE, grey: bool = False) -> np.ndarray:
    """A small fundus-like (or, grey, B-scan-like) uint8 image, different for each seed."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    if grey:
        layers = 0.5 + 0.5 * np.sin((yy + rng.uniform(0, 1)) * 12)
        img = (layers * 200 + rng.normal(0, 10, (size, size))).clip(0, 255)
        return img.astype(np.uint8)
    r = np.hypot(xx - 0.5, yy - 0.5)
    field = (r < 0.45).astype(float)
    disc = np.exp(-((xx - rng.uniform(0.3, 0.7)) ** 2 + (yy - 0.5) ** 2) / 0.004)
    base = np.stack([0.75, 0.35, 0.15]) * rng.uniform(0.8, 1.0)
    img = field[..., None] * (base + 0.4 * disc[..., None]) + rng.normal(0, 0.02, (size, size, 3))
    return (img.clip(0, 1) * 255).astype(np.uint8)


def write_image(path: Path, seed: int, *, grey: bool = False, size: int = SIZE) -> Path:
    """Write a phantom image in the format the file name says (.jpg/.jpeg/.JPG/.png/.tif/.bmp/.dcm)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = phantom_array(seed, size, grey)
    suffix = path.suffix.lower()
    if suffix in (".dcm", ".dicom"):
        write_dicom(path, arr)
        return path
    fmt = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".tif": "TIFF", ".tiff": "TIFF", ".bmp": "BMP"}[suffix]
    Image.fromarray(arr).save(path, format=fmt)
    return path


def write_dicom(path: Path, arr: np.ndarray) -> None:
    from pydicom.dataset import FileMetaDataset, Dataset
    from pydicom.uid import UID, ExplicitVRLittleEndian, generate_uid

    sop_class = "1.2.840.10008.5.1.4.1.1.77.1.5.1"  # Ophthalmic Photography 8 Bit Image Storage
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = UID(sop_class)
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Modality = "OP"
    ds.Rows, ds.Columns = arr.shape[:2]
    ds.SamplesPerPixel = 3 if arr.ndim == 3 else 1
    ds.PhotometricInterpretation = "RGB" if arr.ndim == 3 else "MONOCHROME2"
    if arr.ndim == 3:
        ds.PlanarConfiguration = 0
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.PixelData = np.ascontiguousarray(arr).tobytes()
    ds.save_as(path, enforce_file_format=True)


def write_npz(path: Path, seed: int, *, image_key: str | None = "slo_fundus", **scalars) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, Any] = {k: np.asarray(v) for k, v in scalars.items()}
    if image_key == "slo_fundus":
        arrays["slo_fundus"] = phantom_array(seed, 40)
    elif image_key == "rnflt":
        arrays["rnflt"] = (phantom_array(seed, 40, grey=True).astype(np.float32) / 255 * 300).astype(np.float32)
    np.savez(path, **arrays)
    return path


def write_csv(path: Path, header: list[str], rows: list[list], *, sep: str = ",", encoding: str = "utf-8",
              raw_header: str | None = None, trailer: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding=encoding) as fh:
        if raw_header is not None:
            fh.write(raw_header + "\n")
        w = csv.writer(fh, delimiter=sep, lineterminator="\n")
        if raw_header is None:
            w.writerow(header)
        w.writerows(rows)
        fh.write(trailer)
    return path


def write_xlsx(path: Path, sheets: dict[str, list[list]]) -> Path:
    import openpyxl

    path.parent.mkdir(parents=True, exist_ok=True)
    wb = openpyxl.Workbook()
    wb.remove(wb.active)
    for name, rows in sheets.items():
        ws = wb.create_sheet(name)
        for r in rows:
            ws.append(r)
    wb.save(path)
    return path
