"""Decode and resize every image of a dataset once into a uint8 array store ``[N, S, S, 3]`` (+ Parquet index).

Later stages (feature extraction, fine-tuning) memory-map the ``.npy`` file and never decode full-size JPEGs
again. Every image is decoded by retinabench.data.readers.decode_image (16-bit grey scaled, palette, alpha, CMYK
and EXIF orientation handled explicitly; grey replicated to three channels). ``resize``: ``squash`` scales to
S×S ignoring aspect ratio (keeps the whole B-scan/fundus field); ``center_crop`` scales the short side to S and
crops.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from retinabench.atomic import atomic_path
from retinabench.data.readers import decode_image
from retinabench.schemas import write_table, read_table

RESIZE_MODES = ("squash", "center_crop")
_CHUNK = 64


def load_image(path: Path, size: int, resize: str) -> np.ndarray:
    try:
        # the one decoder (data/readers.py): any container and pixel format to 8-bit RGB, orientation applied,
        # grey replicated to 3 channels
        im = decode_image(path).image
        if resize == "squash":
            im = im.resize((size, size), Image.Resampling.BICUBIC)
        elif resize == "center_crop":
            w, h = im.size
            scale = size / min(w, h)
            im = im.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.Resampling.BICUBIC)
            w, h = im.size
            left, top = (w - size) // 2, (h - size) // 2
            im = im.crop((left, top, left + size, top + size))
        else:
            raise ValueError(f"unknown resize mode {resize!r}; expected one of {RESIZE_MODES}")
        return np.asarray(im, dtype=np.uint8)
    except (OSError, ValueError) as err:
        raise type(err)(f"image cache: cannot read {path}: {err}") from err


def _try_load(path: Path, size: int, resize: str):
    try:
        return load_image(path, size, resize)
    except (OSError, ValueError) as err:
        return str(err)


def build_image_cache(manifest: pd.DataFrame, root: str | os.PathLike, out_array: str | os.PathLike,
                      out_index: str | os.PathLike, *, size: int = 224, resize: str = "squash",
                      threads: int = 2, progress: bool = True) -> int:
    if resize not in RESIZE_MODES:
        raise ValueError(f"unknown resize mode {resize!r}; expected one of {RESIZE_MODES}")
    root = Path(root)
    out_array = Path(out_array)
    n = len(manifest)
    paths = [root / p for p in manifest["path"]]
    failed: list[str] = []
    with atomic_path(out_array) as tmp:  # removed on any failure: a failed job leaves no partial array behind
        store = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(n, size, size, 3))
        bar = _progress(n, f"cache {out_array.parent.name}", progress)
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            for start in range(0, n, _CHUNK):  # chunked so memory stays flat whatever the dataset size
                chunk = paths[start:start + _CHUNK]
                for j, arr in enumerate(pool.map(lambda p: _try_load(p, size, resize), chunk)):
                    if isinstance(arr, str):
                        failed.append(arr)
                    else:
                        store[start + j] = arr
                bar.update(len(chunk))
        bar.close()
        if failed:  # every unreadable image at once (the manifest's decode pass normally catches them first)
            more = f"\n  ... and {len(failed) - 50} more" if len(failed) > 50 else ""
            raise OSError(f"image cache: {len(failed)} image(s) cannot be read:\n  " + "\n  ".join(failed[:50])
                          + more)
        store.flush()
        del store
    write_table(pd.DataFrame({"image_id": manifest["image_id"].to_numpy(), "row": np.arange(n, dtype="int64")}),
                out_index, "image_index")
    return n


def open_image_cache(array_path: str | os.PathLike, index_path: str | os.PathLike) -> tuple[np.ndarray, pd.DataFrame]:
    arr = np.load(array_path, mmap_mode="r")
    index = read_table(index_path, "image_index")
    if len(index) != arr.shape[0]:
        raise ValueError(f"image cache {array_path}: {arr.shape[0]} images but index {index_path} has {len(index)}")
    return arr, index


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="img", disable=not enabled, mininterval=5)
