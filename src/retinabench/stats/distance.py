"""Signed rank distance between two conditions and a Kruskal–Wallis test across encoder groups.

For an encoder with mean rank ``rank_a`` under condition A and ``rank_b`` under B (same encoders, same tasks'
ranks, lower = better), the signed rank distance is ``(rank_a - rank_b) / sqrt(2)``: the signed distance of
the point (rank_a, rank_b) from the diagonal of the A-vs-B rank scatter. Positive: the encoder ranks worse
under A than under B. Grouping the encoders by pretraining domain or method, :func:`scipy.stats.kruskal`
tests whether the groups shift differently between the conditions (two-sided).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations

import pandas as pd
from scipy import stats

from retinabench.stats.ranks import select

GROUP_BYS = ("domain", "method")


def signed_rank_distance(rank_a: pd.Series, rank_b: pd.Series) -> pd.Series:
    """(rank_a - rank_b) / sqrt(2) per encoder; both rankings must cover the same encoders."""
    if set(rank_a.index) != set(rank_b.index):
        raise ValueError("signed_rank_distance: the two conditions rank different encoders: "
                         f"{sorted(set(rank_a.index) ^ set(rank_b.index))}")
    return ((rank_a - rank_b.loc[rank_a.index]) / math.sqrt(2)).rename("distance")


def kruskal_by_group(values: pd.Series, groups: pd.Series, alpha: float = 0.05) -> dict:
    """Kruskal–Wallis H test of ``values`` (per encoder) across ``groups`` (per encoder), two-sided.

    Returns H, p, the group sizes and a note; H and p are NaN (with the reason in ``note``) when the test is
    undefined: fewer than two groups, or all values equal.
    """
    missing = sorted(set(values.index) - set(groups.index))
    if missing:
        raise KeyError(f"kruskal_by_group: no group for encoders {missing}")
    g = groups.loc[values.index]
    samples = {name: values[g == name].to_numpy(dtype=float) for name in sorted(g.unique())}
    out = {"n_groups": len(samples), "n_encoders": int(len(values)),
           "groups": "; ".join(f"{k} (n={len(v)})" for k, v in samples.items())}
    if len(samples) < 2:
        return out | {"H": float("nan"), "p": float("nan"), "significant": False,
                      "note": "fewer than two groups: test undefined"}
    if all(len(v) == 1 for v in samples.values()):
        return out | {"H": float("nan"), "p": float("nan"), "significant": False,
                      "note": "one encoder per group: test undefined"}
    if values.nunique() == 1:
        return out | {"H": float("nan"), "p": float("nan"), "significant": False,
                      "note": "all distances equal: test undefined"}
    res = stats.kruskal(*samples.values())
    return out | {"H": float(res.statistic), "p": float(res.pvalue), "significant": bool(res.pvalue < alpha),
                  "note": ""}


@dataclass
class Comparison:
    """Two conditions over the same encoders: name, the family it belongs to, and each side's rank rows."""
    name: str
    family: str        # protocols | modality | task_family | lr
    label_a: str
    label_b: str
    where_a: dict = field(default_factory=dict)   # select() arguments of side A
    where_b: dict = field(default_factory=dict)


def protocol_comparisons(protocols: list[str], *, metric: str, regime: str) -> list[Comparison]:
    return [Comparison(f"{a} vs {b}", "protocols", a, b, {"metric": metric, "protocol": a, "regime": regime},
                       {"metric": metric, "protocol": b, "regime": regime}) for a, b in combinations(protocols, 2)]


def subset_comparisons(tasks: dict[str, dict], subsets: dict[str, list[str]], *, metric: str, protocol: str,
                       regime: str) -> list[Comparison]:
    """``<value> vs rest`` for each configured modality / task family that has tasks on both sides."""
    out = []
    family_name = {"modality": "modality", "family": "task_family"}
    for key, values in subsets.items():
        if key not in family_name:
            raise KeyError(f"subset key {key!r} unknown; expected one of {sorted(family_name)}")
        for value in values:
            inside = sorted(t for t, meta in tasks.items() if meta.get(key) == value)
            rest = sorted(t for t in tasks if t not in inside)
            if inside and rest:
                base = {"metric": metric, "protocol": protocol, "regime": regime}
                out.append(Comparison(f"{value} vs rest", family_name[key], value, "rest",
                                      base | {"tasks": inside}, base | {"tasks": rest}))
    return out


def distance_table(ranks: pd.DataFrame, comparisons: list[Comparison], encoders: dict[str, dict]) -> pd.DataFrame:
    """One row per (comparison, encoder): mean ranks under A and B, the signed distance, domain and method."""
    frames = []
    for c in comparisons:
        ra = select(ranks, **c.where_a).groupby("encoder")["rank"].mean()
        rb = select(ranks, **c.where_b).groupby("encoder")["rank"].mean()
        frames.append(distance_rows(c.name, c.family, c.label_a, c.label_b, ra, rb))
    if not frames:
        raise ValueError("distance_table: no comparisons")
    out = pd.concat(frames, ignore_index=True)
    return _with_groups(out, encoders)


def distance_rows(name: str, family: str, label_a: str, label_b: str, rank_a: pd.Series,
                  rank_b: pd.Series) -> pd.DataFrame:
    """Rows of a distance table for one comparison, from the two mean-rank series (index: encoder)."""
    d = signed_rank_distance(rank_a, rank_b)
    return pd.DataFrame({"comparison": name, "family": family, "a": label_a, "b": label_b, "encoder": d.index,
                         "rank_a": rank_a.loc[d.index].to_numpy(), "rank_b": rank_b.loc[d.index].to_numpy(),
                         "distance": d.to_numpy()})


def with_groups(table: pd.DataFrame, encoders: dict[str, dict]) -> pd.DataFrame:
    """Add each encoder's pretraining domain and method (the Kruskal–Wallis groupings) to a distance table."""
    return _with_groups(table.copy(), encoders)


def _with_groups(table: pd.DataFrame, encoders: dict[str, dict]) -> pd.DataFrame:
    unknown = sorted(set(table["encoder"]) - set(encoders))
    if unknown:
        raise KeyError(f"no registry entry (domain/method) for encoders {unknown}")
    for key in GROUP_BYS:
        table[key] = [_meta(encoders[e], key, e) for e in table["encoder"]]
    return table


def _meta(entry: dict, key: str, name: str) -> str:
    if key not in entry:
        raise KeyError(f"encoder {name!r}: registry entry lacks {key!r}")
    return str(entry[key])


def kruskal_table(distances: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Kruskal–Wallis across pretraining domains and across methods, for every comparison of a distance table."""
    rows = []
    for (name, family), d in distances.groupby(["comparison", "family"], sort=False):
        values = d.set_index("encoder")["distance"]
        for key in GROUP_BYS:
            res = kruskal_by_group(values, d.set_index("encoder")[key], alpha)
            rows.append({"comparison": name, "family": family, "group_by": key, **res})
    return pd.DataFrame(rows)
