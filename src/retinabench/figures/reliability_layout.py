"""Selection and page-layout helpers of the reliability figures (retinabench.figures.reliability): which rows a
figure draws, how panel groups are named and packed onto pages of at most the print height."""
from __future__ import annotations

import re
from typing import Sequence, TypeVar

import pandas as pd

# Vertical space (mm) a page needs beyond its panels: title lines, axis labels, legend rows.
_CHROME_MM = 30.0
K = TypeVar("K")  # a page block's key


def _select(df: pd.DataFrame, sel: dict, *, own_task: bool = True, threshold: str | None = None,
            source: str | None = None) -> pd.DataFrame:
    if df.empty:
        return df
    m = (df["protocol"] == sel["protocol"]) & (df["regime"] == sel["regime"]) & (df["seed"] == sel["seed"])
    m &= df["source"] == (source or sel["source"])
    if own_task:
        m &= df["train_task"] == df["task"]
    if threshold is not None and "threshold" in df.columns:
        m &= df["threshold"] == threshold
    return df[m]


def _err(x, lo, hi) -> list[list[float]]:
    """Error-bar half-widths; a percentile interval need not contain the point estimate, so clip at 0."""
    return [[max(0.0, x - lo)], [max(0.0, hi - x)]]


def _unit(df: pd.DataFrame) -> str:
    """The bootstrap resampling unit the table records (reliability.bootstrap.unit), for figure titles."""
    units = sorted(set(df["bootstrap_unit"].dropna())) if "bootstrap_unit" in df.columns and len(df) else []
    return "/".join(units) or "patient"


def _sel_text(sel: dict) -> str:
    return f"{sel['source']} {sel['protocol']}, regime {sel['regime']}, seed {sel['seed']}"


def _encoder_order(encoders: dict, present) -> list[str]:
    present = set(present)
    return [e for e in encoders if e in present] + sorted(present - set(encoders))


def file_stem(name: str) -> str:
    """A panel group's name as a file stem (letters, digits, ``._-``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("_") or "all"


def _pack(blocks: Sequence[tuple[K, float]], budget_mm: float) -> list[list[K]]:
    """Greedy pages of whole blocks (a block = its key and height in mm), each page at most ``budget_mm`` tall
    (a block taller than a page gets a page of its own)."""
    pages: list[list[K]] = []
    used = budget_mm + 1
    for key, h in blocks:
        if used + h > budget_mm and (not pages or pages[-1]):
            pages.append([])
            used = 0.0
        pages[-1].append(key)
        used += h
    return [p for p in pages if p]


def _page_names(stem: str, n: int) -> list[str]:
    return [stem] if n == 1 else [f"{stem}_part{i + 1}" for i in range(n)]


def _skip(part: str, reason: str, n: int | None = None) -> dict:
    return {"part": part, "reason": str(reason), "n": n}
