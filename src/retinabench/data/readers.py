"""The one decoder of raw image files: :func:`decode_image` gives an 8-bit RGB PIL image, whatever the published
container and pixel format, so the decode pass, the image cache and ``datasets --check`` see the same pixels.
Nothing else in retinabench opens a raw image (tests/data/test_decoding.py pins it).

Containers: PNG/JPEG/TIFF/BMP/PGM (Pillow), DICOM (pydicom), NumPy NPZ (numpy).

Pixel formats are converted explicitly, never by a bare ``convert("RGB")`` (which clips 16-bit grey to white):

- **EXIF orientation** is applied first (``ImageOps.exif_transpose``), so a rotated camera JPEG is stored the
  way it is shown.
- **Integer grey deeper than 8 bits** (PIL ``I;16*``, ``I``) is scaled linearly from its *declared* range to
  0–255 and rounded: 16-bit PNG 0–65535 (a value ``v`` becomes ``round(v / 257)``); TIFF by its BitsPerSample
  (a 12-bit TIFF 0–4095) and SampleFormat (signed: ``-2^(b-1)`` … ``2^(b-1)-1``); PGM 0–65535 (Pillow rescales its
  maxval). A 32-bit integer image from a format that declares no range, or values outside the declared range,
  are an error: guessing would change the pixels silently.
- **16-bit colour** (RGB / RGBA PNG and TIFF) is reduced by Pillow as it reads, to the high byte (``v >> 8``):
  scaled, not clipped (tests/data/test_decoding.py pins it).
- **Float grey** (PIL ``F``; NPZ float arrays) has no declared range; the rule: finite values all in [0, 1] are
  scaled by 255; all in [0, 255] are taken as the 8-bit scale; otherwise the image's own min–max is stretched to
  0–255. Non-finite pixels take the lowest finite value.
- **Palette** (``P``, ``PA``) goes through its palette to RGB (RGBA where it has transparency, then as below).
- **Alpha** (``RGBA``, ``LA``, ``PA``) is composited onto black: fundus and OCT backgrounds are black, so a
  transparent border becomes the background it stands for, while dropping alpha would expose whatever colour the
  transparent pixels happen to store.
- **CMYK** becomes RGB by Pillow's ``(255 - C)(255 - K) / 255`` per channel (an embedded ICC profile is not
  applied); ``YCbCr`` and ``HSV`` by Pillow's conversions; ``1`` (bilevel) as 0/255. ``LAB`` and other modes are
  an error naming the mode (Pillow's LAB -> RGB does not convert the colour space).
- **Grey** (``L``) is replicated to three channels.

- **DICOM** (AI-READI): ``pixel_array`` of a single-frame file; a multi-frame file (an OCT volume) gives its
  middle frame. Scaled by the declared BitsStored (signed when PixelRepresentation is 1); ``MONOCHROME1`` is
  inverted within that range so bright is always bright; ``YBR_*`` colour comes back as RGB (pydicom 3).
- **NPZ** (the Harvard ophthalmology family): the image is the first key of :data:`NPZ_IMAGE_KEYS` the archive
  holds (``slo_fundus`` before ``fundus`` before ``rnflt`` …); an archive with none of them is an error that
  lists its keys. A 3-D ``oct_bscans`` volume gives its middle B-scan. RNFLT float maps are scaled by the fixed
  0–350 µm range so thickness stays comparable across images; other float arrays by the float rule above; integer
  arrays (no declared bit depth) as the 8-bit scale when within 0–255, else by their own min–max. Archives are
  opened with ``allow_pickle=False``: object arrays are never unpickled.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

# Keys tried in order for the image of an NPZ archive (Harvard FairVision / FairGenMed / FairFedMed: slo_fundus;
# Harvard-DR: fundus; Harvard-GF: rnflt; an OCT-only archive: oct_bscans).
NPZ_IMAGE_KEYS = ("slo_fundus", "fundus", "rnflt", "oct_bscans")
_RNFLT_RANGE = (0.0, 350.0)  # µm
DICOM_SUFFIXES = (".dcm", ".dicom")
_DEEP_GREY = ("I;16", "I;16L", "I;16B", "I;16N", "I")
_ALPHA = ("RGBA", "LA", "PA")
_TIFF_BITS, _TIFF_SAMPLE_FORMAT = 258, 339


class ImageReadError(OSError):
    pass


@dataclass(frozen=True)
class DecodedImage:
    """A decoded raw image: ``image`` is 8-bit RGB with its orientation applied; ``mode`` is the stored pixel
    format (PIL mode, e.g. ``I;16``; ``L`` / ``RGB`` for DICOM and NPZ), recorded by the decode pass."""
    image: Image.Image
    mode: str

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size


def decode_image(path: str | os.PathLike) -> DecodedImage:
    """The image at ``path``, fully decoded to 8-bit RGB (module docstring: the rules); an unreadable file or an
    unconvertible pixel format is an :class:`ImageReadError` naming the file."""
    path = Path(path)
    suffix = path.suffix.lower()
    try:
        if suffix in (".npz", *DICOM_SUFFIXES):
            arr = _npz_array(path) if suffix == ".npz" else _dicom_array(path)
            im = _from_array(arr, path)
            return DecodedImage(im.convert("RGB"), im.mode)  # uint8 L or RGB: replication only
        with Image.open(path) as stored:
            stored.load()  # the whole file: truncation and corrupt data fail here
            mode = stored.mode
            return DecodedImage(to_rgb(ImageOps.exif_transpose(stored), declared_range(stored)), mode)
    except ImageReadError as err:
        raise ImageReadError(f"{path}: {err}" if str(path) not in str(err) else str(err)) from err
    except (OSError, ValueError, KeyError) as err:
        raise ImageReadError(f"cannot read image {path}: {err}") from err


def declared_range(im: Image.Image) -> tuple[float, float] | None:
    """The value range an integer grey image (``I;16*``, ``I``) declares, or None where its format declares none."""
    if im.mode not in _DEEP_GREY:
        return None
    tags = getattr(im, "tag_v2", None)
    if im.format == "TIFF" and tags is not None and _TIFF_BITS in tags:
        bits = int(np.ravel(tags[_TIFF_BITS])[0])
        signed = int(np.ravel(tags.get(_TIFF_SAMPLE_FORMAT, 1))[0]) == 2
        return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
    if im.mode.startswith("I;16") or im.format == "PPM":  # PNG's 16 bits; Pillow rescales a PGM maxval to 16 bits
        return (0, 65535)
    return None


def to_rgb(im: Image.Image, value_range: tuple[float, float] | None = None) -> Image.Image:
    """``im`` as 8-bit RGB by the per-mode rules of the module docstring (``value_range``: of an ``I;16*`` / ``I``
    image, see :func:`declared_range`); an RGB ``im`` is returned as it is."""
    mode = im.mode
    if mode == "RGB":
        return im
    if mode in ("L", "1", "RGBX", "YCbCr", "HSV", "CMYK"):
        return im.convert("RGB")
    if mode == "P":
        return _onto_black(im.convert("RGBA")) if im.has_transparency_data else im.convert("RGB")
    if mode in _ALPHA:
        return _onto_black(im.convert("RGBA"))
    if mode in _DEEP_GREY:
        if value_range is None:
            raise ImageReadError(f"{im.format or 'image'} in mode {mode} declares no value range; save it as 8- or "
                                 f"16-bit PNG or TIFF")
        return Image.fromarray(scale_to_uint8(np.asarray(im), *value_range)).convert("RGB")
    if mode == "F":
        return Image.fromarray(float_to_uint8(np.asarray(im, dtype=np.float64))).convert("RGB")
    raise ImageReadError(f"pixel format (PIL mode) {mode} is not supported; convert the file to RGB or grey PNG")


def _onto_black(rgba: Image.Image) -> Image.Image:
    return Image.alpha_composite(Image.new("RGBA", rgba.size, (0, 0, 0, 255)), rgba).convert("RGB")


def scale_to_uint8(arr: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``arr`` mapped linearly from its declared range [lo, hi] to 0–255 and rounded; a value outside the range is
    an error (the declaration is wrong, and clipping would hide it)."""
    arr = np.asarray(arr, dtype=np.float64)
    if arr.size and (arr.min() < lo or arr.max() > hi):
        raise ImageReadError(f"pixel values {arr.min():g}..{arr.max():g} exceed the declared range {lo:g}..{hi:g}")
    return np.rint((arr - lo) * (255.0 / (hi - lo))).astype(np.uint8)


def float_to_uint8(arr: np.ndarray) -> np.ndarray:
    """A float image (no declared range) to 0–255: [0, 1] scaled by 255, [0, 255] as is, else min–max."""
    arr = np.asarray(arr, dtype=np.float64)
    finite = np.isfinite(arr)
    if not finite.any():
        raise ImageReadError("float image has no finite pixel")
    lo, hi = float(arr[finite].min()), float(arr[finite].max())
    arr = np.where(finite, arr, lo)
    if lo >= 0 and hi <= 1:
        return scale_to_uint8(arr, 0.0, 1.0)
    if lo >= 0 and hi <= 255:
        return np.rint(arr).astype(np.uint8)
    return scale_to_uint8(arr, lo, hi) if hi > lo else np.zeros(arr.shape, np.uint8)


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
        # the fixed µm scale, by design (thickness outside it is clipped to its ends); uint8 here so the float
        # rule of _from_array does not apply to it
        arr = np.rint(np.clip((np.nan_to_num(arr, nan=lo) - lo) / (hi - lo), 0, 1) * 255).astype(np.uint8)
    return arr


def _dicom_array(path: Path) -> np.ndarray:
    import pydicom

    ds = pydicom.dcmread(path)
    arr = ds.pixel_array  # pydicom 3 converts YBR colour to RGB itself
    frames = int(getattr(ds, "NumberOfFrames", 1) or 1)
    photometric = str(getattr(ds, "PhotometricInterpretation", "")).upper()
    if frames > 1:
        arr = arr[frames // 2]
    if arr.dtype != np.uint8:
        bits = int(getattr(ds, "BitsStored", 8) or 8)
        signed = int(getattr(ds, "PixelRepresentation", 0) or 0) == 1
        arr = scale_to_uint8(arr, *((-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)))
    if photometric == "MONOCHROME1":
        arr = 255 - arr
    return arr


def _from_array(arr: np.ndarray, path: Path) -> Image.Image:
    arr = np.asarray(arr)
    if arr.ndim == 3 and arr.shape[0] in (1, 3) and arr.shape[-1] not in (1, 3):
        arr = np.moveaxis(arr, 0, -1)  # channels-first -> channels-last
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[-1] != 3):
        raise ImageReadError(f"{path}: array of shape {arr.shape} is not a 2-D grey or RGB image")
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8) * 255
    elif np.issubdtype(arr.dtype, np.floating):
        arr = float_to_uint8(arr)
    elif arr.dtype != np.uint8:  # integers of an NPZ array: no declared bit depth
        lo, hi = int(arr.min()), int(arr.max())
        arr = arr.astype(np.uint8) if lo >= 0 and hi <= 255 else (
            scale_to_uint8(arr, lo, hi) if hi > lo else np.zeros(arr.shape, np.uint8))
    return Image.fromarray(np.ascontiguousarray(arr))
