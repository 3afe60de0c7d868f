"""Progress lines for long loops, written to stderr (inside a Snakemake job: the job's log).

Log files are read after the fact or with ``tail -f``, so a carriage-return progress bar is the wrong tool: each
report is one plain line with the count, the percentage, elapsed time, an ETA and what is being done::

    [progress] frozen probes vit_tiny_random/phantom_cfp_dr3: 6/36 runs (17%), 0:00:41 elapsed, ETA 0:03:25 (linear seed 1 u-b)

A line is printed for the first item, whenever another ``every_frac`` of the total is done or ``every_s`` seconds
have passed since the last line, and for the last item, so a job of any length leaves a readable trail.
"""
from __future__ import annotations

import sys
import time
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Counts work items and prints a progress line at intervals (see the module docstring)."""

    def __init__(self, total: int | None, desc: str, *, unit: str = "items", every_s: float = 30.0,
                 every_frac: float = 0.1, file=None, clock=time.monotonic):
        self.total, self.desc, self.unit = total, desc, unit
        self.every_s, self.every_frac = every_s, every_frac
        self.file = file
        self._clock = clock
        self.start = self._last_time = clock()
        self.done = 0
        self._last_frac = -1.0
        self.lines = 0

    def _line(self, note: str) -> str:
        elapsed = self._clock() - self.start
        if self.total:
            pct = 100.0 * self.done / self.total
            eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
            eta_text = _clock(eta) if eta == eta else "?"
            text = (f"{self.desc}: {self.done}/{self.total} {self.unit} ({pct:.0f}%), {_clock(elapsed)} elapsed, "
                    f"ETA {eta_text}")
        else:
            text = f"{self.desc}: {self.done} {self.unit}, {_clock(elapsed)} elapsed"
        return f"[progress] {text}" + (f" ({note})" if note else "")

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = self._clock()
        frac = self.done / self.total if self.total else 0.0
        last = bool(self.total) and self.done >= self.total
        if self.done == n or last or now - self._last_time >= self.every_s or \
                (self.total and frac - self._last_frac >= self.every_frac):
            print(self._line(note), file=self.file or sys.stderr, flush=True)
            self.lines += 1
            self._last_time, self._last_frac = now, frac


def progress(items: Iterable[T], desc: str, *, total: int | None = None, unit: str = "items",
             note=None, **kwargs) -> Iterator[T]:
    """Yield ``items``, reporting progress after each (``note(item)``: text naming the item just done)."""
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            total = None
    bar = Progress(total, desc, unit=unit, **kwargs)
    for item in items:
        yield item
        bar.update(1, note(item) if note else "")


# --- the last line of every job's log ---------------------------------------------------------------------------

SUMMARY_PREFIX = "[done]"
_LISTED = 6  # outputs named in the summary line; the rest are counted


def describe_output(path) -> str:
    """What a written output holds, briefly: rows of a table, pixels of a figure, files of a folder, else bytes.
    Read from metadata only (a Parquet footer, a PNG header), so a summary of a large output costs nothing."""
    from pathlib import Path
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
            import pandas as pd
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
            f": wrote {len(outs)} output(s): {'; '.join(named) or 'nothing'} in {_clock(seconds)} "
            f"({seconds:.1f} s)")
