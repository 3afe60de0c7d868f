"""Rankings on subsets of tasks (by modality, by task family). Per-task ranks are always among all encoders of
the task; a subset's ranking is the mean of those ranks over the subset's tasks."""
from __future__ import annotations

import pandas as pd

from retinabench.stats.ranks import positions, select

SUBSET_KEYS = ("modality", "family")


def task_subsets(tasks: dict[str, dict], subsets: dict[str, list[str]]) -> dict[str, list[str]]:
    """``{"modality=cfp": [tasks...], "family=glaucoma": [...]}`` for each configured value that has tasks."""
    out: dict[str, list[str]] = {}
    for key, values in subsets.items():
        if key not in SUBSET_KEYS:
            raise KeyError(f"subset key {key!r} unknown; expected one of {SUBSET_KEYS}")
        for value in values:
            members = sorted(t for t, meta in tasks.items() if _field(meta, key, t) == value)
            if members:
                out[f"{key}={value}"] = members
    return out


def _field(meta: dict, key: str, task: str):
    if key not in meta:
        raise KeyError(f"task {task!r}: registry entry lacks {key!r} (needed for subset analyses)")
    return meta[key]


def subset_rankings(ranks: pd.DataFrame, subsets: dict[str, list[str]], *, metric: str, protocol: str,
                    regime: str) -> pd.DataFrame:
    """Mean rank ± sd and position per (subset, encoder); subset ``all`` first."""
    frames = []
    for name, members in {"all": None, **subsets}.items():
        d = select(ranks, metric=metric, protocol=protocol, regime=regime, tasks=members)
        g = d.groupby("encoder")["rank"]
        out = pd.DataFrame({"mean_rank": g.mean(), "sd_rank": g.std(), "n_tasks": g.size()})
        out["position"] = positions(out["mean_rank"])
        frames.append(out.reset_index().assign(subset=name))
    table = pd.concat(frames, ignore_index=True)
    table = table.assign(metric=metric, protocol=protocol, regime=regime)
    return table[["subset", "encoder", "mean_rank", "sd_rank", "n_tasks", "position", "metric", "protocol", "regime"]]
