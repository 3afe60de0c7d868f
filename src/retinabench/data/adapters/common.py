"""Helpers shared by adapters: exclusion records (defined in :mod:`retinabench.data.adapters.exclusions`, which
``image_ids`` imports without this module) and manifest finishing (checks, hashes)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

from retinabench.data.adapters.exclusions import Exclusions as Exclusions  # adapters import it from here
from retinabench.data.adapters.image_ids import settle_duplicate_ids
from retinabench.data.adapters.root_wall import RootWall
from retinabench.hashing import sha256_file
from retinabench.schemas import MANIFEST, MODALITIES


class DuplicateFileError(ValueError):
    """Two files under an adapter's image folder map to the same key (file name): which one is meant is unknown."""


def index_files(root: Path, pattern: str, *, key=lambda p: p.stem) -> dict[str, Path]:
    """``key(path) -> path`` (relative to ``root``) for the files matching the glob ``pattern`` under ``root``.

    Two files with the same key (e.g. the same file name in two sub-folders) are an error that names both
    paths: glob order must never decide which image a label row gets."""
    root = Path(root)
    out: dict[str, Path] = {}
    clashes: list[tuple[str, Path, Path]] = []
    for path in sorted(root.glob(pattern)):
        if not path.is_file():
            continue
        rel = path.relative_to(root)
        k = key(rel)
        if k in out:
            clashes.append((k, out[k], rel))
        else:
            out[k] = rel
    if clashes:
        lines = "\n".join(f"  {k!r}: {a} and {b}" for k, a, b in clashes[:50])
        raise DuplicateFileError(f"{root}: {len(clashes)} file name(s) occur more than once under {pattern!r}:\n"
                                 f"{lines}")
    return out


def validate_manifest_rows(df: pd.DataFrame, root: Path, dataset: str | None = None) -> None:
    """What every manifest must satisfy, checked before hashing (and by ``datasets --check``): unique image ids,
    known modalities, and every path inside the dataset root (after symlinks)."""
    dataset = dataset or (str(df["dataset"].iloc[0]) if len(df) and "dataset" in df else Path(root).name)
    settle_duplicate_ids(df, [f"manifest row {k + 1}" for k in range(len(df))], dataset=dataset)
    bad_mod = sorted(set(df["modality"]) - set(MODALITIES))
    if bad_mod:
        raise ValueError(f"manifest for {root}: unknown modality values {bad_mod}; allowed {MODALITIES}")
    wall = RootWall(root, dataset)
    for image_id, rel in zip(df["image_id"], df["path"]):
        wall.relative(rel, file=f"the {dataset} adapter's manifest", row=f"image {image_id}")
    wall.raise_if_breached()


def finish_manifest(df: pd.DataFrame, root: Path, label_columns: list[str], threads: int = 4) -> pd.DataFrame:
    """Check the fixed columns, add each file's sha256 and return columns in schema order.

    Hashing goes through :func:`retinabench.hashing.sha256_file`, which the manifest job primes from the raw-file
    cache (retinabench.data.raw_state), so a rerun re-hashes only files whose size or mtime changed. The decode
    pass (corrupt images, perceptual hashes) runs after the adapter, in the manifest stage, for every adapter."""
    validate_manifest_rows(df, root)
    from retinabench.progress import progress
    with ThreadPoolExecutor(max_workers=threads) as pool:
        hashes = pool.map(lambda rel: sha256_file(root / rel), df["path"])
        df = df.assign(sha256=list(progress(hashes, f"manifest {root.name}: sha256 of each image",
                                            total=len(df), unit="images")))
    for col in MANIFEST.names:
        if col not in df.columns:
            df[col] = None
    df["age"] = df["age"].astype("float64")
    for col in label_columns:
        df[col] = df[col].astype("string")
    return df[MANIFEST.names + label_columns].sort_values("image_id", kind="stable").reset_index(drop=True)
