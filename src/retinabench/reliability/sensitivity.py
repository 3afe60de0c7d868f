"""Protocol sensitivity: both values of a named protocol convention on the same rows, compared with a paired
bootstrap (docs/reliability.md, "Protocol sensitivity").

One comparison: the test rows of one (model, task), two :class:`Variant` s (the convention's value a — ours — and
value b — the paper's) that score the same rows (or, for ``mllm.invalid_answers: drop``, a subset of them), one
weight matrix of resampled units (patients, or images: ``reliability.bootstrap.unit``) for both
(:func:`~retinabench.stats.bootstrap.cluster_weights`, the paired bootstrap of retinabench.reliability.paired), and
the weighted metric kernels (:func:`~retinabench.stats.bootstrap.weighted_metrics`). Each metric gives one row
overall and one row per fairness attribute (its gap: second group minus first, as the gaps table) with value a,
value b, delta = b − a, the percentile CI of the delta replicates and its two-sided bootstrap p-value.

Conclusions (:func:`add_calls`): every row carries the call it supports under each value (``call_a``, ``call_b``)
and ``conclusion_changes`` = the calls differ:

* an overall metric of a model: the model's rank among the models compared on the same (convention, source,
  protocol, task, metric) — rank 1 the best (highest AUROC / accuracy, lowest ECE), ties share the lower rank;
* a fairness gap: its significance call from its own bootstrap CI under that value (``+`` the CI lies above 0,
  ``-`` below, ``0`` it covers 0);
* a bootstrap convention's row (a paired model comparison): the comparison's significance call under each value.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from retinabench.metrics.fairness import Attribute, assign_groups
from retinabench.metrics.table import higher_is_better, reliability_name

# The table's columns, in order (retinabench.schemas.PROTOCOL_SENSITIVITY declares their types).
COLUMNS = ["convention", "variant_a", "variant_b", "source", "encoder", "protocol", "task", "dataset", "metric",
           "attribute", "value_a", "value_b", "delta", "ci_low", "ci_high", "p_value", "n_a", "n_b", "n_units",
           "conclusion", "call_a", "call_b", "conclusion_changes", "skipped", "reason"]
RANK, GAP, COMPARISON = "encoder rank", "gap significance", "comparison significance"


@dataclass(frozen=True)
class Variant:
    """One value of a convention on the comparison's rows: class probabilities and decisions of every row, the rows
    it keeps (None: all) and the ECE bin edges it computes with."""

    proba: np.ndarray
    pred: np.ndarray
    keep: np.ndarray | None = None
    edges: str = "right_closed"

    def rows(self, n: int) -> np.ndarray:
        return np.ones(n, dtype=bool) if self.keep is None else np.asarray(self.keep, dtype=bool)


def significance_call(lo: float, hi: float) -> str:
    """``+`` when the CI lies above 0, ``-`` below, ``0`` when it covers 0, ``n/a`` without a CI."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "n/a"
    return "+" if lo > 0 else "-" if hi < 0 else "0"


def skipped_row(convention: str, variants: tuple[str, str], reason: str, **keys) -> dict:
    """A row saying why a comparison was not made (the table keeps it)."""
    row = {c: keys.get(c, "") for c in ("source", "encoder", "protocol", "task", "dataset", "metric", "attribute")}
    return {"convention": convention, "variant_a": variants[0], "variant_b": variants[1], **row, "skipped": True,
            "reason": reason}


def fairness_groups(rows: pd.DataFrame, attributes: list[Attribute]) -> dict[str, tuple[np.ndarray, np.ndarray, str]]:
    """{attribute: (mask of its first group, mask of its second, reason)} of the analysed rows (with the manifest's
    columns); the reason is empty when both groups have at least ``min_group_size`` rows, else says why not."""
    out = {}
    for attr in attributes:
        if attr.column not in rows.columns:
            out[attr.name] = (np.zeros(len(rows), bool), np.zeros(len(rows), bool),
                              f"column {attr.column!r} is not in the manifest")
            continue
        labels, info = assign_groups(rows.reset_index(drop=True), attr)
        groups = list(info.get("groups") or [])
        if info["unavailable"] or len(groups) != 2:
            out[attr.name] = (np.zeros(len(rows), bool), np.zeros(len(rows), bool),
                              info["unavailable"] or f"{len(groups)} groups, a gap needs 2")
            continue
        masks = [(labels == g).fillna(False).to_numpy(dtype=bool) for g in groups]
        small = [f"{g} ({int(m.sum())})" for g, m in zip(groups, masks) if m.sum() < attr.min_group_size]
        reason = f"group(s) below {attr.min_group_size} rows: {', '.join(small)}" if small else ""
        out[attr.name] = (masks[0], masks[1], reason)
    return out


def paired_variant_rows(convention: str, variants: tuple[str, str], a: Variant, b: Variant, y: np.ndarray,
                        units: np.ndarray, families: list[str], n_classes: int, *, groups: dict | None = None,
                        n_boot: int, level: float, seed: int, n_bins: int, keys: dict) -> list[dict]:
    """Rows of one paired comparison of two values of ``convention`` on the same rows (the module docstring):
    every metric family of ``families`` overall, then as the gap of each attribute of ``groups``
    (:func:`fairness_groups`). ``keys``: source, encoder, protocol, task, dataset of the rows."""
    from retinabench.metrics.thresholds import point_metrics
    from retinabench.stats.bootstrap import bootstrap_p_value, cluster_weights, make_rng, percentile_ci, \
        weighted_metrics
    y = np.asarray(y, dtype=np.int64)
    n = len(y)
    names = [reliability_name(m, n_classes) for m in families]
    rng = make_rng(seed, "protocol_sensitivity", convention, *keys.values())
    W = cluster_weights(np.asarray(units, dtype=str), n_boot, rng)

    def score(v: Variant, part: np.ndarray) -> tuple[dict, dict]:
        m = v.rows(n) & part
        point = point_metrics(names, y[m], v.proba[m], v.pred[m], n_bins=n_bins, edges=v.edges)
        reps = weighted_metrics(names, y[m], v.proba[m], v.pred[m], W[:, m], n_bins=n_bins, edges=v.edges)
        return point, reps

    everything = np.ones(n, dtype=bool)
    parts = {"": (everything, None, "")}
    for attr, (first, second, reason) in (groups or {}).items():
        parts[attr] = (first, second, reason)
    base = {"convention": convention, "variant_a": variants[0], "variant_b": variants[1], **keys}
    rows = []
    for attr, (first, second, reason) in parts.items():
        if reason:
            rows += [{**base, "metric": nm, "attribute": attr, "skipped": True, "reason": reason} for nm in names]
            continue
        if second is None:   # overall
            (pa_, ra), (pb, rb) = score(a, first), score(b, first)
            stats = {nm: (pa_[nm], pb[nm], ra[nm], rb[nm]) for nm in names}
        else:                # the gap: second group minus first
            sa = [score(a, first), score(a, second)]
            sb = [score(b, first), score(b, second)]
            stats = {nm: (sa[1][0][nm] - sa[0][0][nm], sb[1][0][nm] - sb[0][0][nm],
                          sa[1][1][nm] - sa[0][1][nm], sb[1][1][nm] - sb[0][1][nm]) for nm in names}
        for nm, (va, vb, reps_a, reps_b) in stats.items():
            d = reps_b - reps_a
            lo, hi, _ = percentile_ci(d, level)
            row = {**base, "metric": nm, "attribute": attr, "value_a": float(va), "value_b": float(vb),
                   "delta": float(vb - va), "ci_low": lo, "ci_high": hi, "p_value": bootstrap_p_value(d),
                   "n_a": int((a.rows(n) & (first if second is None else first | second)).sum()),
                   "n_b": int((b.rows(n) & (first if second is None else first | second)).sum()),
                   "n_units": int(pd.unique(np.asarray(units)).size), "skipped": False, "reason": ""}
            if second is not None:   # each value's own gap CI: its significance call
                row["call_a"] = significance_call(*percentile_ci(reps_a, level)[:2])
                row["call_b"] = significance_call(*percentile_ci(reps_b, level)[:2])
                row["conclusion"] = GAP
            rows.append(row)
    return rows


def _text(col: pd.Series) -> pd.Series:
    return col.astype(object).where(col.notna(), "").astype(str)


def _ranks(values: pd.Series, metric: str) -> pd.Series:
    ascending = not higher_is_better(metric)  # the metric table's direction (ECE: lower is better)
    return values.rank(method="min", ascending=ascending, na_option="keep")


def add_calls(table: pd.DataFrame) -> pd.DataFrame:
    """``call_a``, ``call_b``, ``conclusion`` and ``conclusion_changes`` of every row (the module docstring): rank
    calls for overall metrics of a model among the models of its (convention, source, protocol, task, metric);
    rows that already carry a call (gaps, comparisons) keep it. Skipped rows: no call, no change."""
    t = table.reindex(columns=COLUMNS).copy()
    t["skipped"] = t["skipped"].fillna(False).astype(bool)
    for col in ("call_a", "call_b", "conclusion", "reason", "attribute"):
        t[col] = _text(t[col])
    ranked = ~t["skipped"] & (t["conclusion"] == "")
    for _, idx in t[ranked].groupby(["convention", "source", "protocol", "task", "metric"]).groups.items():
        part = t.loc[idx]
        metric = str(part["metric"].iloc[0])
        k = len(part)
        for side in ("a", "b"):
            r = _ranks(part[f"value_{side}"], metric)
            t.loc[idx, f"call_{side}"] = [f"rank {int(v)} of {k}" if np.isfinite(v) else "n/a" for v in r]
        t.loc[idx, "conclusion"] = RANK
    t["conclusion_changes"] = ~t["skipped"] & (t["call_a"] != t["call_b"]) & (t["call_a"] != "n/a") \
        & (t["call_b"] != "n/a")
    for col in ("n_a", "n_b", "n_units"):
        t[col] = t[col].fillna(0).astype(np.int64)
    for col in ("value_a", "value_b", "delta", "ci_low", "ci_high", "p_value"):
        t[col] = t[col].astype(np.float64)
    text = [c for c in COLUMNS if c not in ("n_a", "n_b", "n_units", "value_a", "value_b", "delta", "ci_low",
                                            "ci_high", "p_value", "conclusion_changes", "skipped")]
    for col in text:
        t[col] = _text(t[col])
    return t.reset_index(drop=True)
