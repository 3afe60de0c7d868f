"""Roots are walls: every path an adapter reads (images, index files) is resolved, after symlinks, against the
dataset root (``data_root/<entry root>``) and refused when it lands outside it.

A manifest path outside the root (``../other/x.jpg``, an absolute path, a symlink pointing elsewhere) would make
the raw snapshot, ``verify`` and provenance describe files the dataset does not hold. Adapters collect every
such path in a :class:`RootWall` and raise one :class:`OutsideRootError` listing the count, the first rows
(index file, row, value) and the fix; ``datasets --check`` shows the same message, because it runs the same
adapter code.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_SHOWN = 10


class OutsideRootError(ValueError):
    """Paths named by a dataset's raw files resolve outside its root."""


@dataclass(frozen=True)
class Breach:
    file: str            # the index file (or listing / adapter) that named the path
    row: int | str | None
    value: str           # the path as written
    resolved: Path

    def line(self) -> str:
        where = (self.file if self.row is None else f"{self.file}:row {self.row}" if str(self.row).isdigit()
                 else f"{self.file} ({self.row})")
        return f"{where}: {self.value!r} -> {self.resolved}"


class RootWall:
    """``relative(name, file=, row=)`` gives ``name`` as a path relative to the root, or ``None`` when it
    resolves outside (recorded once per row); ``raise_if_breached()`` then fails with every recorded path."""

    def __init__(self, root: Path, dataset: str):
        self.root = Path(root)
        self.real = self.root.resolve()
        self.dataset = dataset
        self.breaches: dict[tuple[str, str], Breach] = {}
        self._real_parents: dict[Path, Path] = {}

    def resolve(self, path: Path) -> Path:
        """``path.resolve()``, with each folder resolved once (a dataset has many images per folder)."""
        if path.name in ("", ".", ".."):
            return path.resolve()
        parent = self._real_parents.get(path.parent)
        if parent is None:
            parent = self._real_parents[path.parent] = path.parent.resolve()
        real = parent / path.name
        return real.resolve() if real.is_symlink() else real

    def relative(self, name: str | Path, *, file: str, row: int | str | None = None) -> str | None:
        real = self.resolve(self.root / name)
        if real != self.real and not real.is_relative_to(self.real):
            key = (file, str(row) if row is not None else str(name))
            self.breaches.setdefault(key, Breach(file, row, str(name), real))
            return None
        if not Path(name).is_absolute():
            return str(name) if isinstance(name, str) else Path(name).as_posix()
        absolute = Path(name)  # inside the root: stored relative to it, so manifests stay portable
        return (absolute.relative_to(self.root) if absolute.is_relative_to(self.root)
                else real.relative_to(self.real)).as_posix()

    def raise_if_breached(self) -> None:
        if not self.breaches:
            return
        found = list(self.breaches.values())
        files = sorted({b.file for b in found})
        shown = "\n".join(f"  {b.line()}" for b in found[:_SHOWN])
        more = f"\n  ... {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
        raise OutsideRootError(
            f"dataset {self.dataset!r}: {len(found)} path(s) resolve outside the dataset root {self.root} "
            f"(after symlinks; an adapter reads nothing outside its root), named by {', '.join(files)}:\n"
            f"{shown}{more}\nFix: move or copy those files under {self.root} and name them relative to it, "
            f"or point the entry's `root` at the folder that holds them.")


def inside_root(root: Path, name: str | Path, *, dataset: str, what: str) -> Path:
    """``root / name`` when it resolves inside ``root``; otherwise an :class:`OutsideRootError` naming it."""
    wall = RootWall(root, dataset)
    rel = wall.relative(name, file=what)
    wall.raise_if_breached()
    assert rel is not None  # None only for a breach, which raised
    return Path(root) / rel
