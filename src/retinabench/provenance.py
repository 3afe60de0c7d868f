"""Provenance sidecars: every artifact ``X`` gets ``X.prov.json`` saying how it was made.

A sidecar records the rule, its wildcards, each input file with its sha256, the config subset the job saw,
the code commit (+ dirty flag), package versions, seed, time and host. Inputs that have sidecars of their own
make the records a chain, which :func:`provenance_chain` walks from a figure back to raw images and weights.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

from retinabench.atomic import write_text_atomic
from retinabench.hashing import SNAKEMAKE_MARKER, sha256_file

SIDECAR_SUFFIX = ".prov.json"
_PACKAGES = ("retinabench", "torch", "torchvision", "timm", "numpy", "pandas", "pyarrow", "scikit-learn",
             "scipy", "scikit-posthocs", "matplotlib", "snakemake", "open_clip_torch", "transformers", "peft", "accelerate")


def sidecar_path(artifact: str | os.PathLike) -> Path:
    return Path(str(artifact) + SIDECAR_SUFFIX)


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def code_state(start: str | os.PathLike | None = None) -> dict[str, Any]:
    """Commit of the checkout holding the package (or ``start``) and whether tracked files differ from it."""
    where = Path(start) if start else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True,
                                timeout=10)
        if commit.returncode != 0:
            return {"commit": None, "dirty": None, "why": commit.stderr.strip() or "not a git checkout"}
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                                capture_output=True, text=True, timeout=10)
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"commit": None, "dirty": None, "why": f"git unavailable: {err}"}


def folder_files(folder: str | os.PathLike) -> dict[str, str]:
    """sha256 of every file under ``folder`` (relative POSIX paths, sorted; Snakemake's marker left out); a folder
    artifact's content."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): sha256_file(p)
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != SNAKEMAKE_MARKER}


def folder_digest(files: dict[str, str]) -> str:
    """One sha256 for a folder: of its sorted ``path<TAB>sha256`` lines."""
    import hashlib
    return hashlib.sha256("".join(f"{k}\t{v}\n" for k, v in sorted(files.items())).encode()).hexdigest()


def artifact_sha256(path: str | os.PathLike) -> str:
    """A file's sha256, or a folder's :func:`folder_digest`."""
    path = Path(path)
    return folder_digest(folder_files(path)) if path.is_dir() else sha256_file(path)


def describe_inputs(paths: Iterable[str | os.PathLike]) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        p = Path(p)
        if not (p.is_file() or p.is_dir()):
            raise FileNotFoundError(f"provenance: input {p} does not exist")
        out.append({"path": str(p), "sha256": artifact_sha256(p), "sidecar": sidecar_path(p).is_file()})
    return out


def write_sidecar(artifact: str | os.PathLike, *, rule: str, inputs: Iterable[str | os.PathLike] = (),
                  wildcards: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
                  seed: int | list[int] | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Write ``artifact``'s sidecar. A folder artifact (an adapter) records every file with its sha256 under
    ``files`` and their :func:`folder_digest` as its ``sha256``."""
    artifact = Path(artifact)
    files = folder_files(artifact) if artifact.is_dir() else None
    record = {
        "artifact": str(artifact),
        "sha256": folder_digest(files) if files is not None else sha256_file(artifact),
        "rule": rule,
        "wildcards": dict(wildcards or {}),
        "inputs": describe_inputs(inputs),
        "config": config or {},
        "seed": seed,
        "code": code_state(),
        "packages": package_versions(),
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "argv": sys.argv[:1],
        "extra": extra or {},
    }
    if files is not None:
        record["files"] = files
    path = sidecar_path(artifact)
    write_text_atomic(path, json.dumps(record, indent=1, sort_keys=True, default=str))
    return path


def read_sidecar(artifact: str | os.PathLike) -> dict[str, Any]:
    path = sidecar_path(artifact)
    if not path.is_file():
        raise FileNotFoundError(f"no provenance sidecar for {artifact} (expected {path})")
    return json.loads(path.read_text())


def provenance_chain(artifact: str | os.PathLike, *, verify: bool = True) -> list[dict[str, Any]]:
    """Flatten the chain of sidecars reachable from ``artifact`` (depth-first, each artifact once).

    Each node: ``{"path", "depth", "record" | None, "stale", "changed", "missing"}``; ``stale`` is set when an
    input's current sha256 differs from the one its consumer recorded (the file changed after it was used),
    ``changed`` when an artifact differs from the sha256 its own sidecar records (edited after it was written).
    """
    nodes: list[dict[str, Any]] = []
    seen: set[str] = set()
    raw_checked: dict[str, list[dict]] = {}

    def visit(path: Path, depth: int, expected_sha: str | None) -> None:
        key = str(path)
        stale = False
        if verify and expected_sha is not None and path.exists():
            stale = artifact_sha256(path) != expected_sha
        if key in seen:
            return
        seen.add(key)
        record = read_sidecar(path) if sidecar_path(path).is_file() else None
        # changed: the artifact differs from its own sidecar (edited in place after it was written)
        changed = bool(verify and record and path.exists() and artifact_sha256(path) != record.get("sha256"))
        node = {"path": key, "depth": depth, "record": record, "stale": stale, "changed": changed,
                "missing": not path.exists()}
        raw = (record or {}).get("extra", {}).get("raw_images")
        if verify and raw:
            if raw["manifest"] not in raw_checked:
                raw_checked[raw["manifest"]] = raw_image_changes(raw)
            node["raw_changes"] = raw_checked[raw["manifest"]]
        nodes.append(node)
        if record:
            for inp in record.get("inputs", []):
                visit(Path(inp["path"]), depth + 1, inp.get("sha256"))

    visit(Path(artifact), 0, None)
    return nodes


def raw_image_changes(raw: dict) -> list[dict]:
    """Raw files of a manifest that changed since it was built (quick: only files whose size or mtime differ
    from the manifest job's snapshot are re-hashed; ``retinabench verify`` re-hashes everything)."""
    from retinabench.data.raw_state import compare_to_snapshot
    from retinabench.schemas import read_table
    manifest, snapshot = Path(raw["manifest"]), Path(raw["snapshot"])
    if not manifest.is_file() or not snapshot.is_file() or not Path(raw["root"]).is_dir():
        return [{"path": raw["root"], "status": "unavailable", "image_id": None}]
    diff = compare_to_snapshot(raw["root"], read_table(manifest, columns=["image_id", "path", "sha256"]),
                               read_table(snapshot, "raw_files"), full=False)
    return diff.to_dict("records")


def chain_flags(nodes: list[dict[str, Any]]) -> int:
    """How many problems a chain shows: changed, stale or missing artifacts and changed raw images."""
    count = sum(bool(n["stale"] or n.get("changed") or n["missing"]) for n in nodes)
    return count + sum(1 for n in nodes for c in n.get("raw_changes", []))


def format_chain(artifact: str | os.PathLike, nodes: list[dict[str, Any]] | None = None) -> str:
    lines = []
    leaves_raw: list[str] = []
    leaves_weights: list[str] = []
    for node in provenance_chain(artifact) if nodes is None else nodes:
        rec = node["record"]
        pad = "  " * node["depth"]
        flag = (" [CHANGED since used]" if node["stale"] else
                " [CHANGED: differs from its own sidecar]" if node.get("changed") else
                " [MISSING]" if node["missing"] else "")
        if rec is None:
            lines.append(f"{pad}{node['path']}{flag}  (no sidecar: source file)")
            continue
        code = rec.get("code", {})
        commit = (code.get("commit") or "no-commit")[:12] + ("+dirty" if code.get("dirty") else "")
        wc = ",".join(f"{k}={v}" for k, v in rec.get("wildcards", {}).items())
        lines.append(f"{pad}{node['path']}{flag}  <- rule {rec['rule']}"
                     f"{'[' + wc + ']' if wc else ''}  sha256 {rec['sha256'][:12]}  code {commit}  {rec['created']}")
        for change in node.get("raw_changes", []):
            what = f"image {change['image_id']}: " if change.get("image_id") else ""
            flag = "[CHANGED since used]" if change["status"] != "unavailable" else "[raw folder unavailable]"
            lines.append(f"{pad}  {flag} raw {what}{change['path']} ({change['status']})")
        extra = rec.get("extra", {})
        for raw in extra.get("raw_files", []):
            sha = f"sha256 {raw['sha256'][:12]}  " if raw.get("sha256") else ""
            leaves_raw.append(f"{raw['path']}  {sha}{raw.get('note', '')}".rstrip())
        if extra.get("weights"):
            w = extra["weights"]
            files = w.get("files")
            if files is None and w.get("file"):  # records written before the lock file
                files = {w["file"]: w.get("sha256")}
            desc = ", ".join(f"{f}  sha256 {sha}" for f, sha in (files or {}).items()) or "none (random init)"
            where = f"{w['hub_id']}@{w.get('revision')}  " if w.get("hub_id") else ""
            dropped = (w.get("dropped") or {}).get("count")
            leaves_weights.append(f"{rec['wildcards'].get('encoder', '?')}: {where}{desc}  source {w.get('source')}"
                                  + (f"  ({dropped} checkpoint keys dropped, listed in the sidecar)" if dropped else ""))
    if leaves_raw:
        lines.append("raw data:")
        lines.extend("  " + r for r in dict.fromkeys(leaves_raw))
    if leaves_weights:
        lines.append("weights:")
        lines.extend("  " + w for w in dict.fromkeys(leaves_weights))
    return "\n".join(lines)
