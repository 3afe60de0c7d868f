"""Content hashes used by provenance records, checkpoint verification and the raw-data fingerprint, and code hashes
(the source files of package parts and of a module's import closure: rule params that rerun jobs whose code changed;
used by the plan and by protocols, so it lives in this base module)."""
from __future__ import annotations

import hashlib
import os
from functools import cache
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


@cache
def package_code_hash(*parts: str) -> str:
    """Short sha256 over the source files of package parts (``"protocols"``, ``"data/splits.py"``, ...)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for part in parts:
        target = root / part
        if not target.exists():
            raise FileNotFoundError(f"package_code_hash: {target} does not exist")
        files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
        for f in files:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


_PACKAGE_ROOT = Path(__file__).resolve().parent
# Package registries that list every member: editing them (adding a dataset) must not count as a code change of
# the members' jobs.
_REGISTRY_MODULES = {"retinabench.data.adapters"}


def module_file(name: str) -> Path | None:
    """Source file of a ``retinabench.*`` module (``None`` for other packages or a name that is not a module)."""
    if name != "retinabench" and not name.startswith("retinabench."):
        return None
    parts = name.split(".")[1:]
    if not parts:
        return _PACKAGE_ROOT / "__init__.py"
    rel = Path(*parts)
    for candidate in (_PACKAGE_ROOT / rel.with_suffix(".py"), _PACKAGE_ROOT / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def import_names(node, module: str, is_init: bool) -> set[str]:
    """Module names imported anywhere inside the AST ``node`` of ``module`` (absolute and relative, at any depth:
    lazy imports count too); ``is_init``: the node comes from a package's ``__init__.py``."""
    import ast
    package = module if is_init else module.rpartition(".")[0]
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                parts = package.split(".")
                parts = parts[: len(parts) - n.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in n.names)  # `from pkg import module`
    return out


def module_imports(path: Path, module: str) -> set[str]:
    """Module names a source file imports."""
    import ast
    return import_names(ast.parse(path.read_text(), filename=str(path)), module, path.name == "__init__.py")


def module_closure(*modules: str) -> list[Path]:
    """The source files of ``modules`` and of every retinabench module they import, transitively; registry
    ``__init__`` modules (``retinabench.data.adapters``) excluded."""
    seen: dict[str, Path] = {}
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name in seen or name in _REGISTRY_MODULES:
            continue
        path = module_file(name)
        if path is None:
            continue
        seen[name] = path
        todo.extend(module_imports(path, name))
    return sorted(set(seen.values()))
