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


def hms(seconds: float) -> str:
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
            eta_text = hms(eta) if eta == eta else "?"
            text = (f"{self.desc}: {self.done}/{self.total} {self.unit} ({pct:.0f}%), {hms(elapsed)} elapsed, "
                    f"ETA {eta_text}")
        else:
            text = f"{self.desc}: {self.done} {self.unit}, {hms(elapsed)} elapsed"
        return f"[progress] {text}" + (f" ({note})" if note else "")

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = self._clock()
        frac = self.done / self.total if self.total else 0.0
        last = self.total is not None and self.total != 0 and self.done >= self.total
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
