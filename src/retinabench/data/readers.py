"""Open one raw image file as a PIL image, whatever its published container: PNG/JPEG/TIFF/BMP (Pillow),
DICOM (pydicom) or NumPy NPZ (numpy), so the image cache and the dataset check read every dataset the same way.

- **DICOM** (AI-READI): ``pixel_array`` of a single-frame file; a multi-frame file (an OCT volume) gives its
  middle frame. ``PhotometricInterpretation`` ``MONOCHROME1`` is inverted so bright is always bright;
  ``YBR_*`` colour comes back as RGB (pydicom 3); more than 8 bits are scaled to 0–255 by the stored bit depth.
- **NPZ** (the Harvard ophthalmology family): the image is the first key of :data:`NPZ_IMAGE_KEYS` the archive
  holds (``slo_fundus`` before ``fundus`` before ``rnflt`` …); an archive with none of them is an error that
  lists its keys. A 3-D ``oct_bscans`` volume gives its middle B-scan. Float maps are scaled to 0–255
  (RNFLT maps by the fixed 0–350 µm range so thickness stays comparable across images; others by their own
  min/max). Archives are opened with ``allow_pickle=False``: object arrays are never unpickled.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

# Keys tried in order for the image of an NPZ archive (Harvard FairVision / FairGenMed / FairFedMed: slo_fundus;
# Harvard-DR: fundus; Harvard-GF: rnflt; an OCT-only archive: oct_bscans).
NPZ_IMAGE_KEYS = ("slo_fundus", "fundus", "rnflt", "oct_bscans")
_RNFLT_RANGE = (0.0, 350.0)  # µm
DICOM_SUFFIXES = (".dcm", ".dicom")


class ImageReadError(OSError):
    pass


def open_image(path: str | Path) -> Image.Image:
    """The image at ``path`` as a PIL image (mode L or RGB for DICOM/NPZ; as stored otherwise)."""
    path = Path(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".npz":
            return _from_array(_npz_array(path), path)
        if suffix in DICOM_SUFFIXES:
            return _from_array(_dicom_array(path), path)
        im = Image.open(path)
        im.load()
        return im
    except ImageReadError:
        raise
    except (OSError, ValueError, KeyError) as err:
        raise ImageReadError(f"cannot read image {path}: {err}") from err


def _npz_array(path: Path) -> np.ndarray:
    with np.load(path, allow_pickle=False) as archive:
        keys = list(archive.files)
        for key in NPZ_IMAGE_KEYS:
            if key in archive.files:
                arr = np.asarray(archive[key])
                break
        else:
            raise ImageReadError(f"{path}: none of the image keys {list(NPZ_IMAGE_KEYS)} in the archive "
                                 f"(keys: {keys})")
    if key == "oct_bscans" and arr.ndim == 3:
        arr = arr[arr.shape[0] // 2]
    if key == "rnflt" and np.issubdtype(arr.dtype, np.floating):
        lo, hi = _RNFLT_RANGE
        arr = np.clip((np.nan_to_num(arr, nan=lo) - lo) / (hi - lo), 0, 1) * 255
    return arr


def _dicom_array(path: Path) -> np.ndarray:
    import pydicom

    ds = pydicom.dcmread(path)
    arr = ds.pixel_array  # pydicom 3 converts YBR colour to RGB itself
    frames = int(getattr(ds, "NumberOfFrames", 1) or 1)
    photometric = str(getattr(ds, "PhotometricInterpretation", "")).upper()
    if frames > 1:
        arr = arr[frames // 2]
    bits = int(getattr(ds, "BitsStored", 8) or 8)
    if arr.dtype != np.uint8 and bits > 8:
        arr = arr.astype(np.float64) / (2 ** bits - 1) * 255
    if photometric == "MONOCHROME1":
        arr = arr.max() - arr
    return arr


def _from_array(arr: np.ndarray, path: Path) -> Image.Image:
    arr = np.asarray(arr)
    if arr.ndim == 3 and arr.shape[0] in (1, 3) and arr.shape[-1] not in (1, 3):
        arr = np.moveaxis(arr, 0, -1)  # channels-first -> channels-last
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[-1] != 3):
        raise ImageReadError(f"{path}: array of shape {arr.shape} is not a 2-D grey or RGB image")
    if arr.dtype != np.uint8:
        arr = arr.astype(np.float64)
        if not np.isfinite(arr).all():
            arr = np.nan_to_num(arr)
        lo, hi = float(arr.min()), float(arr.max())
        if lo >= 0 and hi <= 255:
            arr = np.rint(arr)
        else:
            arr = (arr - lo) / (hi - lo) * 255 if hi > lo else np.zeros_like(arr)
        arr = arr.astype(np.uint8)
    return Image.fromarray(arr)
