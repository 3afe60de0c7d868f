"""Content hashes used by provenance records and checkpoint verification."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

_CHUNK = 1 << 20
# Keyed by (path, size, mtime_ns): a job hashes its inputs once even when it records them twice.
_memo: dict[tuple[str, int, int], str] = {}


def sha256_file(path: str | os.PathLike) -> str:
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key in _memo:
        return _memo[key]
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    digest = h.hexdigest()
    _memo[key] = digest
    return digest


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
