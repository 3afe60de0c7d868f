"""Content hashes used by provenance records, checkpoint verification and the raw-data fingerprint."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

_CHUNK = 1 << 20
# Snakemake's marker in a directory() output (written after the job): never part of a folder's content
SNAKEMAKE_MARKER = ".snakemake_timestamp"
# Keyed by (path, size, inode, mtime_ns): a job hashes each input once although it verifies it on read and records it
# in its sidecars (retinabench.integrity, retinabench.provenance); a file rewritten in place gets a new mtime_ns.
_memo: dict[tuple[str, int, int, int], str] = {}
# Digests handed over by the raw-file cache (retinabench.data.raw_state), keyed by (path, size, mtime_ns): that cache
# is kept across processes and records no inode.
_primed: dict[tuple[str, int, int], str] = {}


def sha256_file(path: str | os.PathLike, *, use_memo: bool = True) -> str:
    p = Path(path)
    st = p.stat()
    resolved = str(p.resolve())
    key = (resolved, st.st_size, st.st_ino, st.st_mtime_ns)
    if use_memo:
        known = _memo.get(key) or _primed.get((resolved, st.st_size, st.st_mtime_ns))
        if known:
            return known
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    digest = h.hexdigest()
    _memo[key] = digest
    return digest


def remember(path: str | os.PathLike, size: int, mtime_ns: int, digest: str) -> None:
    """Record a digest computed elsewhere for the file state (size, mtime_ns)."""
    _primed[(str(Path(path).resolve()), int(size), int(mtime_ns))] = digest


def known_digest(path: str | os.PathLike, size: int, mtime_ns: int) -> str | None:
    """The digest this process knows for the file state, or None (never read)."""
    p = Path(path)
    resolved = str(p.resolve())
    primed = _primed.get((resolved, int(size), int(mtime_ns)))
    if primed:
        return primed
    try:
        st = p.stat()
    except FileNotFoundError:
        return None
    if (st.st_size, st.st_mtime_ns) != (int(size), int(mtime_ns)):
        return None
    return _memo.get((resolved, st.st_size, st.st_ino, st.st_mtime_ns))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def unit_hash(*parts) -> float:
    """A number in [0, 1) from the sha256 of the parts joined by ':' (stable across processes, platforms and
    versions; split placement and subsampling use it)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64
