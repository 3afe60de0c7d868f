"""Nothing changes a result silently: artifacts are checked against their sidecars when read, and
``retinabench verify`` checks a whole results folder.

Three kinds of finding, each naming the file:

* ``CHANGED`` — an artifact's bytes differ from the sha256 its own sidecar records (edited, permuted, restored
  with an old mtime: content decides, not timestamps);
* ``MISSING`` — a sidecar describes an artifact that is gone, or a dataset's raw folder is gone;
* ``STALE`` — an aggregate (any artifact built from inputs) whose input now differs from the sha256 recorded when
  it was built, or is gone: a rerun rebuilt (or a failed run deleted) the input but not the aggregate.

Readers call :func:`verify_inputs` before using anything (``run_stage`` does it for every job's inputs), so a
changed intermediate stops the job with an :class:`ArtifactChanged` error naming the file, the rule that wrote it and
the command that rebuilds it. Each file is hashed once per process (:mod:`retinabench.hashing` memoises on path,
size, inode and mtime), so the sidecars the job writes afterwards reuse the digests.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from retinabench.hashing import SNAKEMAKE_MARKER
from retinabench.provenance import SIDECAR_SUFFIX, artifact_sha256, read_sidecar, sidecar_path

# Shown in every rebuild hint; a user on Slurm swaps the profile.
SNAKEMAKE_CMD = "snakemake --profile profiles/local"


class ArtifactChanged(RuntimeError):
    """An input's content differs from what its sidecar records."""


@dataclass(frozen=True)
class Finding:
    status: str          # CHANGED / MISSING / STALE
    path: str            # the artifact (or raw file) the finding is about
    detail: str          # what differs, and what to do

    def line(self) -> str:
        return f"{self.status:8} {self.path}  {self.detail}"


def writer(record: dict) -> str:
    """``rule features (encoder=x, dataset=y)``: who wrote an artifact, from its sidecar."""
    wc = ", ".join(f"{k}={v}" for k, v in (record.get("wildcards") or {}).items())
    return f"rule {record.get('rule', '?')}" + (f" ({wc})" if wc else "")


def rebuild_hint(path: str | os.PathLike, record: dict) -> str:
    rule = str(record.get("rule", ""))
    if rule.startswith("retinabench "):  # written by a CLI command, not by the workflow
        return f"rebuild it by rerunning `{rule} ...` ({record.get('extra', {}).get('command', rule)})"
    return f"rebuild it with `{SNAKEMAKE_CMD} --force {path}`, then rerun your target (downstream jobs follow)"


def changed_artifact(path: str | os.PathLike) -> Finding | None:
    """A finding when ``path`` no longer matches its own sidecar; None when it matches or has no sidecar (a source
    file: raw data, a config, a weight file; those are checked through their consumers' records)."""
    path = Path(path)
    side = sidecar_path(path)
    if not side.is_file():
        return None
    record = read_sidecar(path)
    if not (path.is_file() or path.is_dir()):
        return Finding("MISSING", str(path), f"written by {writer(record)} on {record.get('created', '?')}; its "
                                             f"sidecar {side} remains; {rebuild_hint(path, record)}")
    actual = artifact_sha256(path)
    if actual == record.get("sha256"):
        return None
    return Finding("CHANGED", str(path), f"sha256 {str(record.get('sha256'))[:12]} recorded by {writer(record)} on "
                                         f"{record.get('created', '?')}, now {actual[:12]}; {rebuild_hint(path, record)}")


def _sidecar_inputs(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """The paths to check: each input with a sidecar; in a folder input without one (a model's weights folder),
    every file inside that has one."""
    out: list[Path] = []
    for p in map(Path, paths):
        if sidecar_path(p).is_file() or not p.is_dir():
            out.append(p)
            continue
        out += [f for f in sorted(p.rglob("*")) if f.is_file() and f.name != SNAKEMAKE_MARKER
                and not f.name.endswith(SIDECAR_SUFFIX) and sidecar_path(f).is_file()]
    return out


def verify_inputs(paths: Iterable[str | os.PathLike], *, consumer: str = "") -> int:
    """Raise :class:`ArtifactChanged` listing every input that differs from its sidecar (all at once); return how
    many inputs were checked."""
    checked = _sidecar_inputs(paths)
    findings = [f for f in map(changed_artifact, checked) if f is not None]
    if findings:
        who = f"{consumer}: " if consumer else ""
        raise ArtifactChanged(f"{who}{len(findings)} input(s) differ from their provenance sidecars; a result "
                              "built from them would change silently:\n" + "\n".join("  " + f.line() for f in findings))
    return len(checked)


def stale_inputs(path: str | os.PathLike, record: dict) -> list[Finding]:
    """The inputs of an artifact that differ from, or are missing since, what its sidecar recorded."""
    out = []
    for inp in record.get("inputs", []):
        p = Path(inp["path"])
        if not (p.is_file() or p.is_dir()):
            out.append(Finding("STALE", str(path), f"input {p} is gone (built from it by {writer(record)}); "
                                                   f"{rebuild_hint(path, record)}"))
        elif inp.get("sha256") and artifact_sha256(p) != inp["sha256"]:
            out.append(Finding("STALE", str(path), f"input {p} changed since {writer(record)} used it "
                                                   f"(sha256 {inp['sha256'][:12]} -> {artifact_sha256(p)[:12]}); "
                                                   f"{rebuild_hint(path, record)}"))
    return out


def results_findings(results: str | os.PathLike) -> tuple[list[Finding], int]:
    """Every artifact under ``results`` against its sidecar, and every artifact's inputs against the hashes its
    sidecar recorded. Returns the findings and the number of artifacts checked."""
    results = Path(results)
    if not results.is_dir():
        raise FileNotFoundError(f"results folder {results} does not exist (is `results:` in the config right?)")
    findings: list[Finding] = []
    sidecars = sorted(p for p in results.rglob(f"*{SIDECAR_SUFFIX}") if p.is_file())
    for side in sidecars:
        artifact = Path(str(side)[: -len(SIDECAR_SUFFIX)])
        own = changed_artifact(artifact)
        if own is not None:
            findings.append(own)
            if own.status == "MISSING":
                continue
        findings += stale_inputs(artifact, read_sidecar(artifact))
    return findings, len(sidecars)


def stale_targets(targets: Iterable[str | os.PathLike]) -> list[Finding]:
    """Findings for the given aggregates only (their own content and their direct inputs): what a failed run
    prints about the results tables it left behind."""
    out: list[Finding] = []
    for t in targets:
        if not sidecar_path(t).is_file():
            continue
        own = changed_artifact(t)
        out += [own] if own else stale_inputs(t, read_sidecar(t))
    return out


def report_stale(targets: Iterable[str | os.PathLike], file=None) -> list[Finding]:
    """After a failed run: name every results table or figure left from an earlier run that no longer matches its
    inputs (a failed job's output is deleted, a rerun job's rewritten), so none passes as current."""
    import sys
    file = file or sys.stderr
    findings = stale_targets(targets)
    if findings:
        print(f"retinabench: this run failed; {len(findings)} result(s) left from an earlier run no longer match "
              "their inputs (do not use them until a run succeeds):", file=file)
        for f in findings:
            print("  " + f.line(), file=file)
    print("retinabench: `retinabench verify` checks every artifact under the results folder", file=file)
    return findings
