"""Signed rank distance between a reference and a comparison condition, and Kruskal–Wallis across encoder groups.

Convention (OcularBench, one for every signed-distance table): for an encoder with mean rank ``rank_reference``
under the reference condition and ``rank_comparison`` under the comparison (same encoders, lower rank = better),

    distance = (rank_reference − rank_comparison) / sqrt(2),

the signed distance of the point from the diagonal of the rank scatter. **Positive = the encoder has a better
relative rank under the comparison.** Which side is the reference is declared, never taken from the config order:

* protocols: full fine-tuning whenever it is in the pair (Fig. 5: (rank_FT − rank_LP)/√2, positive = better under
  linear probing); otherwise the protocol earlier in :data:`PROTOCOL_PRECEDENCE` (the more trained one);
* task subsets: the reference is the rest of the tasks, the comparison the subset (Figs. 9, A.10, A.11: positive =
  better relative rank on the subset);
* learning rate: the reference is the optimal lr, the comparison the sub-optimal one (positive = relatively better
  rank at the sub-optimal lr, i.e. less lr-sensitive than the other encoders).

Every table carries ``reference``, ``comparison``, ``distance`` and a one-line ``meaning``. Grouping the encoders by
the paper's pretraining-domain group and pretraining-method group (:mod:`retinabench.stats.groups`; or by model-size
class), :func:`scipy.stats.kruskal` tests whether the groups shift differently between the conditions (two-sided).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations

import pandas as pd
from scipy import stats

from retinabench.stats.groups import GROUP_FIELDS, domain_group, method_group, order_by_size
from retinabench.stats.ranks import select

GROUP_BYS = GROUP_FIELDS                 # the paper's groupings: pretraining-domain group, method group
INFO_FIELDS = ("domain", "method")       # the registry's own words, carried beside the groups
# Reference order of protocol pairs: the earlier protocol is the reference (fine-tuning first, the paper's).
PROTOCOL_PRECEDENCE = ("finetune", "linear_aug", "linear", "logreg", "knn")
DISTANCE_COLUMNS = ["name", "family", "reference", "comparison", "encoder", "rank_reference", "rank_comparison",
                    "distance", "meaning"]


def signed_rank_distance(rank_reference: pd.Series, rank_comparison: pd.Series) -> pd.Series:
    """(rank_reference − rank_comparison) / sqrt(2) per encoder (positive = better under the comparison); both
    rankings must cover the same encoders."""
    if set(rank_reference.index) != set(rank_comparison.index):
        raise ValueError("signed_rank_distance: the two conditions rank different encoders: "
                         f"{sorted(set(rank_reference.index) ^ set(rank_comparison.index))}")
    return ((rank_reference - rank_comparison.loc[rank_reference.index]) / math.sqrt(2)).rename("distance")


def protocol_reference(a: str, b: str) -> tuple[str, str]:
    """(reference, comparison) of a protocol pair: the one earlier in PROTOCOL_PRECEDENCE is the reference (a
    protocol not listed comes after the listed ones; two unlisted ones: alphabetical)."""
    def key(p: str):
        return (PROTOCOL_PRECEDENCE.index(p), "") if p in PROTOCOL_PRECEDENCE else (len(PROTOCOL_PRECEDENCE), p)
    ref, cmp_ = sorted((a, b), key=key)
    return ref, cmp_


def kruskal_by_group(values: pd.Series, groups: pd.Series, alpha: float = 0.05) -> dict:
    """Kruskal–Wallis H test of ``values`` (per encoder) across ``groups`` (per encoder), two-sided.

    Returns H, p, the group sizes and a note; H and p are NaN (with the reason in ``note``) when the test is
    undefined: fewer than two groups, or all values equal.
    """
    missing = sorted(set(values.index) - set(groups.index))
    if missing:
        raise KeyError(f"kruskal_by_group: no group for encoders {missing}")
    g = groups.loc[values.index]
    samples = {name: values[g == name].to_numpy(dtype=float) for name in order_by_size(g)}
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
    """Two conditions over the same encoders: the declared reference and the comparison, and each side's rows."""
    name: str
    family: str        # protocols | modality | task_family | lr
    reference: str
    comparison: str
    where_reference: dict = field(default_factory=dict)   # select() arguments of the reference side
    where_comparison: dict = field(default_factory=dict)
    meaning: str = ""


def protocol_meaning(reference: str, comparison: str) -> str:
    return f"positive = better relative rank under {comparison} than under {reference}"


def protocol_comparisons(protocols: list[str], *, metric: str, regime: str) -> list[Comparison]:
    """Every pair of ``protocols``, each with its declared reference (:func:`protocol_reference`)."""
    out = []
    for a, b in combinations(protocols, 2):
        ref, cmp_ = protocol_reference(a, b)
        out.append(Comparison(f"{ref} vs {cmp_}", "protocols", ref, cmp_,
                              {"metric": metric, "protocol": ref, "regime": regime},
                              {"metric": metric, "protocol": cmp_, "regime": regime}, protocol_meaning(ref, cmp_)))
    return out


def subset_comparisons(tasks: dict[str, dict], subsets: dict[str, list[str]], *, metric: str, protocol: str,
                       regime: str) -> list[Comparison]:
    """``<value> vs rest`` for each configured modality / task family that has tasks on both sides; the rest is
    the reference, so a positive distance means a better relative rank on the subset."""
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
                out.append(Comparison(f"{value} vs rest", family_name[key], "rest", value, base | {"tasks": rest},
                                      base | {"tasks": inside},
                                      f"positive = better relative rank on {value} tasks than on the rest"))
    return out


def distance_table(ranks: pd.DataFrame, comparisons: list[Comparison], encoders: dict[str, dict]) -> pd.DataFrame:
    """One row per (comparison, encoder): :data:`DISTANCE_COLUMNS` plus the encoder's domain and method (the
    registry's words) and its domain group and method group (the paper's groups)."""
    frames = []
    for c in comparisons:
        r_ref = select(ranks, **c.where_reference).groupby("encoder")["rank"].mean()
        r_cmp = select(ranks, **c.where_comparison).groupby("encoder")["rank"].mean()
        frames.append(distance_rows(c.name, c.family, c.reference, c.comparison, r_ref, r_cmp, c.meaning))
    if not frames:
        raise ValueError("distance_table: no comparisons")
    out = pd.concat(frames, ignore_index=True)
    return _with_groups(out, encoders, (*INFO_FIELDS, *GROUP_BYS))


def distance_rows(name: str, family: str, reference: str, comparison: str, rank_reference: pd.Series,
                  rank_comparison: pd.Series, meaning: str) -> pd.DataFrame:
    """Rows of a distance table for one comparison, from the two mean-rank series (index: encoder)."""
    if not meaning:
        raise ValueError(f"distance_rows {name!r}: a signed distance needs its one-line meaning")
    d = signed_rank_distance(rank_reference, rank_comparison)
    return pd.DataFrame({"name": name, "family": family, "reference": reference, "comparison": comparison,
                         "encoder": d.index, "rank_reference": rank_reference.loc[d.index].to_numpy(),
                         "rank_comparison": rank_comparison.loc[d.index].to_numpy(), "distance": d.to_numpy(),
                         "meaning": meaning})[DISTANCE_COLUMNS]


def with_groups(table: pd.DataFrame, encoders: dict[str, dict], keys: tuple[str, ...] = GROUP_BYS) -> pd.DataFrame:
    """Add each encoder's grouping fields (domain group, method group, or registry fields such as size_class) to a
    distance table."""
    return _with_groups(table.copy(), encoders, keys)


def _with_groups(table: pd.DataFrame, encoders: dict[str, dict], keys: tuple[str, ...]) -> pd.DataFrame:
    unknown = sorted(set(table["encoder"]) - set(encoders))
    if unknown:
        raise KeyError(f"no registry entry ({'/'.join(keys)}) for encoders {unknown}")
    for key in keys:
        if key == "domain_group":
            table[key] = [domain_group(encoders[e].get("domain"), f"encoder {e!r}") for e in table["encoder"]]
        elif key == "method_group":
            table[key] = [method_group(encoders[e], f"encoder {e!r}") for e in table["encoder"]]
        else:
            table[key] = [_meta(encoders[e], key, e) for e in table["encoder"]]
    return table


def _meta(entry: dict, key: str, name: str) -> str:
    if key not in entry or entry[key] is None:
        raise KeyError(f"encoder {name!r}: registry entry lacks {key!r}")
    return str(entry[key])


def kruskal_table(distances: pd.DataFrame, alpha: float = 0.05, group_bys: tuple[str, ...] = GROUP_BYS
                  ) -> pd.DataFrame:
    """Kruskal–Wallis across each grouping (default: domain group, method group), for every comparison of a
    distance table."""
    rows = []
    keys = ["name", "family", "reference", "comparison"]
    for key_values, d in distances.groupby(keys, sort=False):
        values = d.set_index("encoder")["distance"]
        for key in group_bys:
            res = kruskal_by_group(values, d.set_index("encoder")[key], alpha)
            rows.append({**dict(zip(keys, key_values)), "group_by": key, **res})
    return pd.DataFrame(rows)


def group_means(values: pd.Series, groups: pd.Series) -> pd.DataFrame:
    """Per group: size and mean of ``values`` (index: encoder), largest group first (ties: by name) — the bars of
    the paper's signed-distance figures."""
    g = groups.loc[values.index]
    out = pd.DataFrame({"group": g.to_numpy(), "value": values.to_numpy()}).groupby("group")["value"].agg(
        n="size", mean="mean")
    return out.loc[order_by_size(g)].reset_index()
