"""A rule's job as plain data, and the one way a stage writes its outputs (atomic, each with its sidecar)."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from retinabench.atomic import atomic_write, temp_files
from retinabench.progress import hms
from retinabench.provenance import sidecar_path, write_sidecar


@dataclass
class Job:
    """What Snakemake hands a `script:` (workflow/scripts/stage.py builds it): the rule's name, inputs, outputs,
    params, wildcards and threads. Tests build one directly; nothing here imports Snakemake."""
    rule: str
    input: dict[str, Any]
    output: dict[str, str]
    params: dict[str, Any] = field(default_factory=dict)
    wildcards: dict[str, str] = field(default_factory=dict)
    threads: int = 1

    def inputs_flat(self) -> list[str]:
        out: list[str] = []
        for v in self.input.values():
            out.extend([v] if isinstance(v, str) else list(v))
        return out

    def input_files(self, whole: tuple[str, ...] = ()) -> list[str]:
        """Every input file, a folder input (a model's weights) listed file by file (Snakemake's marker left out):
        what a sidecar records. Folders in ``whole`` (an adapter, which has a sidecar of its own) are one input."""
        from retinabench.hashing import SNAKEMAKE_MARKER
        out: list[str] = []
        for p in map(Path, self.inputs_flat()):
            if str(p) in whole:
                out.append(str(p))
                continue
            files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
            out += [str(f) for f in files if f.is_file() and f.name != SNAKEMAKE_MARKER]
        return out

    def outputs_flat(self) -> list[str]:
        out: list[str] = []
        for v in self.output.values():
            out.extend([str(v)] if isinstance(v, (str, Path)) else [str(x) for x in v])
        return out


def write_artifact(value: Any, path: str | Path, kind: str | None = None) -> str:
    """One artifact, atomically: a DataFrame as Parquet (checked against the ``kind`` schema of
    retinabench.schemas when given; ``metrics_part``: only its metrics columns are) or CSV (by suffix), a dict or
    list as JSON, a str as text."""
    path = Path(path)
    if isinstance(value, pd.DataFrame):
        if path.suffix == ".csv":
            atomic_write(path, lambda tmp: value.to_csv(tmp, index=False))
        elif kind == "metrics_part":
            from retinabench.schemas import METRICS, conform
            conform(value[METRICS.names], "metrics", where=str(path))
            atomic_write(path, lambda tmp: value.to_parquet(tmp, index=False))
        elif kind:
            from retinabench.schemas import write_table
            write_table(value, path, kind)  # atomic, schema-checked
        else:
            atomic_write(path, lambda tmp: value.to_parquet(tmp, index=False))
    elif isinstance(value, (dict, list)):
        atomic_write(path, lambda tmp: tmp.write_text(json.dumps(value, indent=1, sort_keys=True, default=float)))
    elif isinstance(value, str):
        atomic_write(path, lambda tmp: tmp.write_text(value))
    else:
        raise TypeError(f"write_artifact: cannot write a {type(value).__name__} to {path}")
    return str(path)


def write_outputs(job: Job, artifacts: dict[str, Any] | None = None, *, kinds: dict[str, str] | None = None,
                  written: list[str] | None = None, config: dict | None = None, seed=None, extra: dict | None = None,
                  inputs: list[str] | None = None) -> list[str]:
    """Write ``artifacts`` ({output key: value}) under the job's output paths (atomically, see
    :func:`write_artifact`; ``kinds`` names a key's table schema), then a provenance sidecar beside each of them
    and of the files in ``written`` (artifacts the domain code wrote itself: image arrays, figures, features).
    ``inputs`` defaults to every input of the job. Returns the paths."""
    kinds = kinds or {}
    paths = [write_artifact(value, job.output[key], kinds.get(key)) for key, value in (artifacts or {}).items()]
    paths += [str(p) for p in written or []]
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"rule {job.rule}: output {path} was not written")
        write_sidecar(path, rule=job.rule, inputs=job.inputs_flat() if inputs is None else inputs,
                      wildcards=job.wildcards, config=config or {}, seed=seed, extra=extra)
    return paths


def remove_leftovers(job: Job) -> list[str]:
    """Sidecars and temporary files of the job's outputs, before the job runs and when it fails. Snakemake deletes
    the outputs themselves before a job runs and after it fails, but not these: a sidecar left beside a deleted
    output would describe a file that no longer exists (or a later, different one).

    Temporary files (retinabench.atomic: ``<output>.<host>.<pid>.<random>.tmp``) are removed when this process
    wrote them or their writer is gone (this host, pid no longer running: a killed earlier attempt); any other
    writer's (alive here, or on another host, where nothing tells whether it still writes) is left and named.
    Returns the lines naming what was left."""
    left = []
    for out in map(Path, job.outputs_flat()):
        sidecar_path(out).unlink(missing_ok=True)
        for tmp in temp_files(out) + temp_files(sidecar_path(out)):
            if tmp.mine() or tmp.writer_gone():
                tmp.remove()
            else:
                left.append(f"rule {job.rule}: left {tmp.path}: another writer's temporary file ({tmp.writer()}); "
                            f"remove it by hand once that writer has stopped")
    for line in left:
        print(line, file=sys.stderr, flush=True)
    return left


def announce(text: str) -> None:
    """Print to the job's log (stdout is redirected there) and to the console Snakemake runs in."""
    print(text, flush=True)
    console = sys.__stderr__
    if console is not None and console is not sys.stdout:
        print(text, file=console, flush=True)


# The last line of every job's log (run_stage prints it): what was written, how much, how long.
SUMMARY_PREFIX = "[done]"
_LISTED = 6  # outputs named in the summary line; the rest are counted


def describe_output(path) -> str:
    """What a written output holds, briefly: rows of a table, pixels of a figure, files of a folder, else bytes.
    Read from metadata only (a Parquet footer, a PNG header), so a summary of a large output costs nothing."""
    p = Path(path)
    if p.is_dir():
        files = [f for f in p.rglob("*") if f.is_file() and not f.name.endswith(".prov.json")]
        return f"{p}/ ({len(files)} files)"
    if not p.exists():
        return f"{p} (not written)"
    suffix = p.suffix.lower()
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq
            return f"{p} ({pq.read_metadata(p).num_rows} rows)"
        if suffix in (".csv", ".tsv"):
            sep = "," if suffix == ".csv" else "\t"
            if p.stat().st_size == 0:
                return f"{p} (empty file)"
            return f"{p} ({len(pd.read_csv(p, sep=sep, dtype=str))} rows)"
        if suffix == ".png":
            from PIL import Image
            with Image.open(p) as im:
                return f"{p} ({im.width}x{im.height} px)"
    except Exception as err:  # the summary must not fail a finished job; say what could not be read
        return f"{p} ({p.stat().st_size} bytes; unreadable as {suffix}: {type(err).__name__})"
    return f"{p} ({p.stat().st_size} bytes)"


def job_summary(rule: str, wildcards: dict, outputs, seconds: float) -> str:
    """One line ending a job's log: the rule and wildcards, what it wrote (rows / pixels / files) and how long it
    took, e.g. ``[done] frozen (encoder=resnet18, task=t): wrote results/predictions/frozen/resnet18/t.parquet
    (1440 rows) in 0:00:12``."""
    outs = [str(o) for o in outputs]
    named = [describe_output(o) for o in outs[:_LISTED]]
    if len(outs) > _LISTED:
        named.append(f"{len(outs) - _LISTED} more")
    where = ", ".join(f"{k}={v}" for k, v in wildcards.items())
    return (f"{SUMMARY_PREFIX} {rule}" + (f" ({where})" if where else "") +
            f": wrote {len(outs)} output(s): {'; '.join(named) or 'nothing'} in {hms(seconds)} "
            f"({seconds:.1f} s)")
