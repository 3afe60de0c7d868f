"""Raw-folder state: changed, added or removed raw files rerun their dataset's manifest, and can be verified.

Three files under ``<results>/data/<dataset>/``:

- ``raw_fingerprint.json`` — an *input* of the manifest rule. The workflow refreshes it when it starts
  (:meth:`RawState.refresh`): every regular file under the raw root is stat-ed (size, mtime); a file whose size
  and mtime equal the cache's is unchanged; one whose size changed, or that was added or removed, is a change; one
  whose mtime alone changed is re-hashed and is a change only if its sha256 differs (a ``touch`` or a copy that
  kept the bytes reruns nothing). On a change the file is rewritten (listing the changes), its mtime becomes newer
  than the manifest's, and Snakemake reruns the manifest and everything downstream ("updated input files").
- ``.raw_files_cache.parquet`` — path, size, mtime_ns, sha256 of every raw file; not a Snakemake output, so it
  survives reruns: it primes :func:`retinabench.hashing.sha256_file`, and a manifest rerun hashes only the files
  whose size or mtime changed.
- ``raw_files.parquet`` — an *output* of the manifest job: the same table as of the moment the manifest was built
  (what ``retinabench verify`` and the provenance chain compare against).

Files and folders whose names start with ``.`` are not raw data (``.DS_Store``, ``.git``) and are skipped.
"""
from __future__ import annotations

from typing import Any
import datetime as _dt
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

from retinabench import hashing
from retinabench.atomic import write_text_atomic

FINGERPRINT_NAME = "raw_fingerprint.json"
CACHE_NAME = ".raw_files_cache.parquet"
SNAPSHOT_NAME = "raw_files.parquet"
COLUMNS = ["path", "size", "mtime_ns", "sha256"]
_LISTED = 100


def scan(root: str | os.PathLike) -> dict[str, tuple[int, int]]:
    """``relative path -> (size, mtime_ns)`` of every regular, non-hidden file under ``root``."""
    root = Path(root)
    out: dict[str, tuple[int, int]] = {}
    if not root.is_dir():
        raise FileNotFoundError(f"raw folder {root} does not exist (is data_root right?)")
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except FileNotFoundError:  # vanished while walking
                continue
            if not os.path.isfile(full):
                continue
            out[os.path.relpath(full, root).replace(os.sep, "/")] = (int(st.st_size), int(st.st_mtime_ns))
    return out


def _read(path: Path) -> dict[str, tuple[int, int, str | None]]:
    if not path.is_file():
        return {}
    df = pd.read_parquet(path)
    return {r.path: (int(r.size), int(r.mtime_ns), r.sha256 if isinstance(r.sha256, str) else None)
            for r in df.itertuples()}


def _write(entries: dict[str, tuple[int, int, str | None]], path: Path) -> None:
    from retinabench.schemas import write_table
    df = pd.DataFrame([(p, s, m, h) for p, (s, m, h) in sorted(entries.items())], columns=COLUMNS)
    write_table(df, path, "raw_files")


class RawState:
    def __init__(self, root: str | os.PathLike, data_dir: str | os.PathLike):
        self.root = Path(root)
        self.data_dir = Path(data_dir)
        self.fingerprint_path = self.data_dir / FINGERPRINT_NAME
        self.cache_path = self.data_dir / CACHE_NAME
        self.snapshot_path = self.data_dir / SNAPSHOT_NAME

    def refresh(self, *, threads: int = 4) -> dict:
        """Compare the raw folder with the cache; rewrite the fingerprint on a real change (see module doc).

        Returns ``{"changed": [...], "added": [...], "removed": [...], "touched": n, "rewritten": bool}``."""
        current = scan(self.root)
        cache = _read(self.cache_path)
        report: dict[str, Any] = {"changed": [], "added": [], "removed": sorted(set(cache) - set(current)),
                                  "touched": 0}
        new_cache: dict[str, tuple[int, int, str | None]] = {}
        rehash = []
        for rel, (size, mtime) in current.items():
            old = cache.get(rel)
            if old is None:
                report["added"].append(rel)
                new_cache[rel] = (size, mtime, None)
            elif old[:2] == (size, mtime):
                new_cache[rel] = old
            elif old[0] != size or old[2] is None:
                report["changed"].append(rel)
                new_cache[rel] = (size, mtime, None)
            else:
                rehash.append(rel)
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            digests = list(pool.map(lambda rel: hashing.sha256_file(self.root / rel), rehash))
        for rel, digest in zip(rehash, digests):
            size, mtime = current[rel]
            if digest == cache[rel][2]:
                report["touched"] += 1
            else:
                report["changed"].append(rel)
            new_cache[rel] = (size, mtime, digest)
        real = bool(report["changed"] or report["added"] or report["removed"])
        first = not self.fingerprint_path.is_file()
        if real or report["touched"] or not self.cache_path.is_file():
            _write(new_cache, self.cache_path)
        if real or first:
            self._write_fingerprint(report, len(current), first=first and not cache)
        report["rewritten"] = real or first
        return report

    def _write_fingerprint(self, report: dict, n_files: int, *, first: bool) -> None:
        record = {"root": str(self.root), "n_files": n_files,
                  "updated": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                  "event": "first scan" if first else "raw files changed"}
        for key in ("changed", "added", "removed"):
            record[f"n_{key}"] = len(report[key])
            record[key] = report[key][:_LISTED]
        write_text_atomic(self.fingerprint_path, json.dumps(record, indent=1))

    def prime_hash_memo(self) -> int:
        """Let ``sha256_file`` reuse the cached digest of every file whose size and mtime are unchanged."""
        current = scan(self.root)
        n = 0
        for rel, (size, mtime, digest) in _read(self.cache_path).items():
            if digest is not None and current.get(rel) == (size, mtime):
                hashing.remember(self.root / rel, size, mtime, digest)
                n += 1
        return n

    def record(self, snapshot_path: str | os.PathLike | None = None) -> dict[str, tuple[int, int, str | None]]:
        """After a manifest is built: every raw file with the sha256 this process computed (None if not read);
        written to the cache and to the job's ``raw_files.parquet`` output."""
        entries = {}
        for rel, (size, mtime) in scan(self.root).items():
            entries[rel] = (size, mtime, hashing.known_digest(self.root / rel, size, mtime))
        _write(entries, self.cache_path)
        _write(entries, Path(snapshot_path) if snapshot_path else self.snapshot_path)
        return entries


def compare_to_snapshot(root: str | os.PathLike, manifest: pd.DataFrame, snapshot: pd.DataFrame | None = None, *,
                        full: bool = True, threads: int = 4) -> pd.DataFrame:
    """Raw files that differ from what a manifest was built from: ``path, image_id, status, expected, actual``.

    ``status``: ``changed`` (sha256 differs), ``missing`` (manifest image gone), ``added`` (a file the snapshot
    does not list), ``removed`` (a listed non-image file gone). ``full`` re-hashes every hashed file; otherwise
    only files whose size or mtime differ from the snapshot are re-hashed (the provenance chain's quick check)."""
    root = Path(root)
    current = scan(root)
    snap = {} if snapshot is None else {r.path: (int(r.size), int(r.mtime_ns),
                                                 r.sha256 if isinstance(r.sha256, str) else None)
                                        for r in snapshot.itertuples()}
    expected = {r.path: (r.sha256, r.image_id) for r in manifest[["path", "sha256", "image_id"]].itertuples()}
    for rel, (_, _, digest) in snap.items():
        if digest is not None and rel not in expected:
            expected[rel] = (digest, None)
    rows = []
    to_hash = []
    for rel, (digest, image_id) in expected.items():
        if rel not in current:
            rows.append({"path": rel, "image_id": image_id, "status": "missing" if image_id else "removed",
                         "expected": digest, "actual": None})
        elif full or snap.get(rel, (None, None))[:2] != current[rel]:
            to_hash.append(rel)
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        digests = list(pool.map(lambda rel: hashing.sha256_file(root / rel, use_memo=not full), to_hash))
    for rel, digest in zip(to_hash, digests):
        if digest != expected[rel][0]:
            rows.append({"path": rel, "image_id": expected[rel][1], "status": "changed", "expected": expected[rel][0],
                         "actual": digest})
    if snapshot is not None:
        for rel in sorted(set(current) - set(snap)):
            rows.append({"path": rel, "image_id": None, "status": "added", "expected": None, "actual": None})
    return pd.DataFrame(rows, columns=["path", "image_id", "status", "expected", "actual"]).sort_values(
        ["status", "path"]).reset_index(drop=True)
