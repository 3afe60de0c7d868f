"""The manifest job's decode pass: every image decoded once, in parallel, cached by sha256.

One pass gives both the corrupt-image check (a file retinabench.data.readers cannot open or fully decode —
JPEG/PNG/TIFF, DICOM and NPZ alike: truncated JPEG, garbage bytes, empty file, zero-size image) and the perceptual
hash the duplicate search uses (retinabench.data.duplicates).
Results are cached by the file's sha256 in a Parquet table beside the manifest (``.image_checks.parquet``, not a
Snakemake output, so it survives reruns): after one image changes, a rerun decodes that one image. A cache entry
records the checker version; entries of another version are recomputed.

Policy (dataset entry ``on_corrupt``): ``error`` (default) — one :class:`CorruptImageError` listing *every*
corrupt image; ``exclude`` — each becomes an ``image`` exclusion with reason ``corrupt image: <error>``.

Minimum size (config ``images.min_side``, retinabench.settings): a decoded image whose short side is under it
becomes an ``image`` exclusion with reason ``too_small (WxH < N px short side)`` (:func:`exclude_too_small`),
counted in the manifest job's summary. The rule is applied to the recorded sizes after the cache, so changing
``min_side`` takes effect without re-decoding anything.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
from PIL import ImageFile

from retinabench.data.readers import decode_image

from retinabench.atomic import atomic_write

PHASH_SIZE = 16                 # 16 x 16 = 256-bit DCT hash (why: retinabench.data.duplicates)
PHASH_BYTES = PHASH_SIZE * PHASH_SIZE // 8
HASH_VERSION = f"imagehash.phash(hash_size={PHASH_SIZE}) of the grayscale image"
CORRUPT_POLICIES = ("error", "exclude")
# v3: decode_image (explicit bit depth / palette / alpha / CMYK / EXIF orientation); phash of the decoded image
CHECKER_VERSION = f"decode (retinabench.data.readers.decode_image)+{HASH_VERSION}; v3"
CACHE_NAME = ".image_checks.parquet"
CHECK_COLUMNS = ["sha256", "ok", "error", "width", "height", "mode", "phash", "checker"]
_MAX_LISTED = 50


class CorruptImageError(ValueError):
    """Images of a manifest that cannot be decoded."""

    def __init__(self, dataset: str, bad: pd.DataFrame):
        self.dataset = dataset
        self.bad = bad
        lines = [f"  {r.path} (image {r.image_id}): {r.error}" for r in bad.head(_MAX_LISTED).itertuples()]
        more = f"\n  ... and {len(bad) - _MAX_LISTED} more" if len(bad) > _MAX_LISTED else ""
        super().__init__(f"dataset {dataset!r}: {len(bad)} image(s) cannot be decoded:\n" + "\n".join(lines) + more
                         + "\nReplace the files, or set `on_corrupt: exclude` on the dataset entry to record them "
                           "as exclusions.")


def perceptual_hash(image) -> str:
    """Hex string of the 256-bit phash of a decoded PIL image (converted to grayscale)."""
    import imagehash
    import numpy as np
    bits = imagehash.phash(image.convert("L"), hash_size=PHASH_SIZE).hash.ravel()
    return np.packbits(bits).tobytes().hex()


def decode_check(path: str | os.PathLike) -> dict:
    """Fully decode one image: its size (orientation applied), stored mode (e.g. ``I;16``) and the perceptual hash
    of the decoded pixels, or the error that stopped it."""
    if ImageFile.LOAD_TRUNCATED_IMAGES:  # some library switched PIL to pad truncated files silently
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set: truncated images would decode silently")
    try:
        # JPEG/PNG/TIFF, DICOM and NPZ alike, fully decoded by the one decoder the image cache uses:
        # truncation, corrupt data and unconvertible pixel formats fail here, not at a later resize
        decoded = decode_image(path)
        width, height = decoded.size
        if width == 0 or height == 0:
            raise ValueError(f"image has size {width}x{height}")
        return {"ok": True, "error": None, "width": int(width), "height": int(height), "mode": decoded.mode,
                "phash": perceptual_hash(decoded.image)}
    except Exception as err:  # noqa: BLE001 - recorded per file and raised as one list (or excluded) by the caller
        return {"ok": False, "error": f"{type(err).__name__}: {err}", "width": None, "height": None, "mode": None,
                "phash": None}


def _read_cache(path: Path | None) -> pd.DataFrame:
    if path is None or not path.is_file():
        return pd.DataFrame(columns=CHECK_COLUMNS)
    cache = pd.read_parquet(path)
    if list(cache.columns) != CHECK_COLUMNS:
        return pd.DataFrame(columns=CHECK_COLUMNS)
    return cache[cache["checker"] == CHECKER_VERSION]


def check_images(manifest: pd.DataFrame, root: str | os.PathLike, *, cache_path: str | os.PathLike | None = None,
                 threads: int = 4) -> tuple[pd.DataFrame, dict]:
    """Decode every image of ``manifest`` (``image_id, path, sha256``) once per distinct sha256.

    Returns one row per manifest image (``image_id, path`` + :data:`CHECK_COLUMNS`) and counts
    ``{"decoded", "cached", "corrupt"}``. The cache keeps the entries of this manifest's files only."""
    root = Path(root)
    cache_path = Path(cache_path) if cache_path else None
    cache = _read_cache(cache_path).drop_duplicates("sha256").set_index("sha256")
    distinct = manifest.drop_duplicates("sha256")[["sha256", "path"]]
    todo = distinct[~distinct["sha256"].isin(cache.index)]
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        fresh = list(pool.map(lambda rel: decode_check(root / rel), todo["path"]))
    new = pd.DataFrame(fresh, columns=CHECK_COLUMNS[1:-1]).assign(sha256=todo["sha256"].to_numpy(),
                                                                   checker=CHECKER_VERSION)
    known = pd.concat([cache.reset_index()[CHECK_COLUMNS], new[CHECK_COLUMNS]], ignore_index=True) \
        if len(cache) else new[CHECK_COLUMNS]
    known = known[known["sha256"].isin(distinct["sha256"])].drop_duplicates("sha256")
    if cache_path is not None:
        _write_cache(known, cache_path)
    out = manifest[["image_id", "path", "sha256"]].merge(known, on="sha256", how="left")
    stats = {"decoded": int(len(todo)), "cached": int(len(distinct) - len(todo)),
             "corrupt": int((~out["ok"].astype(bool)).sum())}
    return out, stats


def _write_cache(known: pd.DataFrame, path: Path) -> None:
    table = known.astype({"width": "Int64", "height": "Int64", "ok": bool})
    atomic_write(path, lambda tmp: table.to_parquet(tmp, index=False))


def apply_corrupt_policy(manifest: pd.DataFrame, exclusions: pd.DataFrame, checks: pd.DataFrame, *,
                         dataset: str, policy: str = "error") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Raise one error listing every corrupt image (``error``), or drop them with exclusion rows (``exclude``)."""
    if policy not in CORRUPT_POLICIES:
        raise ValueError(f"dataset {dataset!r}: on_corrupt must be one of {CORRUPT_POLICIES}, got {policy!r}")
    bad = checks[~checks["ok"].astype(bool)].sort_values("path")
    if bad.empty:
        return manifest, exclusions
    if policy == "error":
        raise CorruptImageError(dataset, bad)
    rows = pd.DataFrame({"dataset": dataset, "source": bad["path"].to_numpy(), "image_id": bad["image_id"].to_numpy(),
                         "scope": "image", "reason": ("corrupt image: " + bad["error"]).to_numpy()})
    kept = manifest[~manifest["image_id"].isin(bad["image_id"])].reset_index(drop=True)
    return kept, pd.concat([exclusions, rows], ignore_index=True)


def exclude_too_small(manifest: pd.DataFrame, exclusions: pd.DataFrame, checks: pd.DataFrame, *, dataset: str,
                      min_side: int) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """Drop the decoded images whose short side is under ``min_side`` px, each with an ``image`` exclusion row
    ``too_small (WxH < N px short side)``; returns (manifest, exclusions, how many)."""
    if int(min_side) < 1:
        raise ValueError(f"dataset {dataset!r}: images.min_side must be a positive number of pixels, got {min_side!r}")
    decoded = checks[checks["ok"].astype(bool) & checks["image_id"].isin(manifest["image_id"])]
    short = decoded[["width", "height"]].astype("int64").min(axis=1)
    small = decoded[short < int(min_side)].sort_values("path")
    if small.empty:
        return manifest, exclusions, 0
    reasons = [f"too_small ({int(w)}x{int(h)} < {int(min_side)} px short side)"
               for w, h in zip(small["width"], small["height"])]
    rows = pd.DataFrame({"dataset": dataset, "source": small["path"].to_numpy(),
                         "image_id": small["image_id"].to_numpy(), "scope": "image", "reason": reasons})
    kept = manifest[~manifest["image_id"].isin(small["image_id"])].reset_index(drop=True)
    return kept, pd.concat([exclusions, rows], ignore_index=True), int(len(small))
