"""Content hashes used by provenance records, checkpoint verification and the raw-data fingerprint."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

_CHUNK = 1 << 20
# Snakemake's marker in a directory() output (written after the job): never part of a folder's content
SNAKEMAKE_MARKER = ".snakemake_timestamp"
# Keyed by (path, size, mtime_ns): a job hashes its inputs once even when it records them twice, and the raw-file
# cache (retinabench.data.raw_state) can hand over digests of files whose size and mtime did not change.
_memo: dict[tuple[str, int, int], str] = {}


def sha256_file(path: str | os.PathLike, *, use_memo: bool = True) -> str:
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if use_memo and key in _memo:
        return _memo[key]
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    digest = h.hexdigest()
    _memo[key] = digest
    return digest


def remember(path: str | os.PathLike, size: int, mtime_ns: int, digest: str) -> None:
    """Record a digest computed elsewhere for the file state (size, mtime_ns)."""
    _memo[(str(Path(path).resolve()), int(size), int(mtime_ns))] = digest


def known_digest(path: str | os.PathLike, size: int, mtime_ns: int) -> str | None:
    """The digest this process knows for the file state, or None (never read)."""
    return _memo.get((str(Path(path).resolve()), int(size), int(mtime_ns)))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def unit_hash(*parts) -> float:
    """A number in [0, 1) from the sha256 of the parts joined by ':' (stable across processes, platforms and
    versions; split placement and subsampling use it)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64
