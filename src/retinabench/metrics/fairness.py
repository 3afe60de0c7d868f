"""Subgroups, fairness and image-quality gaps with patient-clustered bootstrap CIs, and the summary scores.

Attributes (config ``reliability.attributes`` / ``reliability.quality``) are data: a manifest column and either
a cut (``median``: FOCUS's median split of the analysed rows, ages *above* the median (``>median``) vs the rest
(``<=median``), so ties at the median stay with the lower group; a number: ``<c`` / ``>=c``, OcularBench's 60 years)
or a list of groups (sex: female / male; quality: good / poor). Rows whose value is missing or outside the groups
are excluded from that attribute and counted.

Fairness attributes, per group: predicted-positive rate (binary only), accuracy, TPR, FPR, AUROC (macro
one-vs-rest TPR/FPR/AUROC for multi-class tasks); equalized-odds gap = max(TPR gap, FPR gap). Quality strata
(FOCUS's quality robustness), per group: accuracy, AUROC, AUPRC, F1 and ECE (multi-class: macro AUROC/AUPRC/F1 and
top-label ECE). Gaps are absolute differences between the two groups (max − min with more groups). A gap is skipped, with the reason recorded, when the attribute has
no values, fewer than two groups, a group below the minimum size (fairness 10, quality 5 rows), or a group
without the positives/negatives the metric needs (ECE of a one-class group: only under
``reliability.ece_one_class_strata: focus``, FOCUS's rule; by default it has a value). Never silently.

CIs: patients (or images, setting ``reliability.bootstrap.unit``) of the analysed rows are resampled with
replacement (stats.bootstrap.cluster_weights); each replicate recomputes every group's metric on the same draw. ``ci_low``/``ci_high`` are the percentile interval
of the absolute gap; for two groups ``diff_ci_*`` is the interval of the signed difference (group b − group a),
and ``flagged`` says it excludes 0 (for equalized odds: the TPR or the FPR difference does). The interval of an
absolute gap never contains 0 in a strict sense, so only the signed interval is a test.

Summary scores (formulas also in docs/reliability.md and each score row's ``formula``):
  Fairness = 1 − mean of the available {equalized-odds, accuracy, AUROC} gaps over the score's attributes;
  Quality  = 1 − mean of the available {accuracy, AUROC, AUPRC, F1, ECE} gaps across quality strata;
  Shift    = 1 − (max − min) over datasets sharing a harmonised task of the per-dataset mean test AUROC.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from retinabench.metrics.table import metric_family, metric_family_names
from retinabench.metrics.thresholds import point_metrics
from retinabench.metrics.weighted import cluster_weights, percentile_ci, weighted_metrics

GAP_METRICS_BINARY = ("ppr", "accuracy", "tpr", "fpr", "auroc")
GAP_METRICS_MULTI = ("accuracy", "tpr_macro", "fpr_macro", "auroc_macro")
QUALITY_METRICS_BINARY = ("accuracy", "auroc", "auprc", "f1", "ece")
QUALITY_METRICS_MULTI = ("accuracy", "auroc_macro", "auprc_macro", "f1_macro", "ece_top_label")
SCORE_COMPONENTS = {"fairness": ("equalized_odds", "accuracy", "auroc"),
                    "quality": ("accuracy", "auroc", "auprc", "f1", "ece")}
# Columns of the rows subgroup_analysis returns (a table has them all even when every gap was skipped).
GROUP_FIELDS = ["attribute", "kind", "cut", "group", "metric", "value", "ci_low", "ci_high", "n", "n_patients",
                "n_pos", "below_min_size", "reason"]
GAP_FIELDS = ["attribute", "kind", "cut", "metric", "group_a", "group_b", "value_a", "value_b", "n_a", "n_b", "gap",
              "ci_low", "ci_high", "difference", "diff_ci_low", "diff_ci_high", "flagged", "n_boot", "n_valid",
              "skipped", "reason"]
FORMULAS = {
    "fairness": "1 - mean({equalized_odds, accuracy, auroc} gaps over available fairness attributes)",
    "quality": "1 - mean({accuracy, auroc, auprc, f1, ece} gaps across image-quality strata)",
    "shift": "1 - (max - min) over datasets sharing the harmonised task of the per-dataset mean test AUROC",
}


@dataclass(frozen=True)
class Attribute:
    name: str
    column: str
    kind: str = "fairness"              # fairness | quality
    cut: str | float | None = None      # "median" or a number (numeric column); None: categorical groups
    groups: tuple[str, ...] | None = None
    min_group_size: int = 10

    @classmethod
    def from_settings(cls, entry, *, kind: str, min_group_size: int) -> Attribute:
        """From a ``reliability.attributes`` / ``quality`` entry (retinabench.settings.AttributeSettings, checked
        there); ``min_group_size``: the section's, used unless the entry sets its own."""
        return cls(name=entry.name, column=entry.column, kind=kind, cut=entry.cut,
                   groups=tuple(entry.groups) if entry.groups is not None else None,
                   min_group_size=entry.min_group_size if entry.min_group_size is not None else min_group_size)


def assign_groups(frame: pd.DataFrame, attr: Attribute) -> tuple[pd.Series, dict]:
    """Group label per row (NA where excluded) and what happened: cut value, excluded counts and reasons,
    and ``unavailable`` (a reason) when the attribute cannot be analysed at all on these rows."""
    if attr.column not in frame.columns:
        raise KeyError(f"attribute {attr.name!r}: column {attr.column!r} not in the analysed rows "
                       f"(columns: {sorted(frame.columns)})")
    values = frame[attr.column]
    info: dict = {"cut": None, "excluded": {}, "unavailable": None}
    known = values.notna()
    if not known.any():
        info["unavailable"] = f"no {attr.column} values in these rows"
        return pd.Series(pd.NA, index=frame.index, dtype="string"), info
    if int((~known).sum()):
        info["excluded"][f"{attr.column} unknown"] = int((~known).sum())
    labels = pd.Series(pd.NA, index=frame.index, dtype="string")
    if attr.cut is not None:
        num = pd.to_numeric(values, errors="coerce")
        if (known & num.isna()).any():
            raise ValueError(f"attribute {attr.name!r}: column {attr.column!r} has non-numeric values "
                             f"{sorted(values[known & num.isna()].astype(str).unique())[:5]}")
        if attr.cut == "median":
            # FOCUS: above the median vs the rest (ties at the median go with the rest)
            cut = float(num[known].median())
            lo, hi = "<=median", ">median"
            labels[known] = np.where(num[known] > cut, hi, lo)
        else:
            cut = float(attr.cut)
            lo, hi = f"<{cut:g}", f">={cut:g}"
            labels[known] = np.where(num[known] < cut, lo, hi)
        info["cut"] = cut
        info["groups"] = [lo, hi]
    else:
        vals = values[known].astype(str)
        if attr.groups is not None:
            outside = ~vals.isin(attr.groups)
            if outside.any():
                for v, n in vals[outside].value_counts().sort_index().items():
                    info["excluded"][f"{attr.column} value {v!r} not in {list(attr.groups)}"] = int(n)
            vals = vals[~outside]
            info["groups"] = list(attr.groups)
        else:
            info["groups"] = sorted(vals.unique())
        labels[vals.index] = vals
    return labels, info


def _gap_metrics(binary: bool, kind: str = "fairness") -> tuple[str, ...]:
    if kind == "quality":
        return QUALITY_METRICS_BINARY if binary else QUALITY_METRICS_MULTI
    return GAP_METRICS_BINARY if binary else GAP_METRICS_MULTI


def _requirement(metric: str, binary: bool, y: np.ndarray, one_class_ece: str = "compute") -> str | None:
    """Why ``metric`` is undefined on rows with labels ``y`` (None when it is defined). ``one_class_ece``
    (``reliability.ece_one_class_strata``): ``focus`` leaves ECE undefined on one class, as FOCUS's
    ``evaluate_calibration`` (NaN when ``y`` has fewer than two classes); ``compute`` gives it a value."""
    base = metric_family(metric)
    if base == "ece" and one_class_ece == "focus" and len(np.unique(y)) < 2:
        return "one class only (ece_one_class_strata: focus)"
    if base == "ece" and one_class_ece not in ("compute", "focus"):
        raise ValueError(f"reliability.ece_one_class_strata {one_class_ece!r} unknown: compute | focus")
    if base == "tpr" and binary and not (y == 1).any():
        return "no positive rows"
    if base == "fpr" and binary and not (y == 0).any():
        return "no negative rows"
    if base == "auroc" and len(np.unique(y)) < 2:
        return "one class only"
    if base == "auprc" and binary and not (y == 1).any():
        return "no positive rows"
    if base == "auprc" and len(np.unique(y)) < 2:
        return "one class only"
    return None


def subgroup_analysis(y, proba, pred, patients, labels: pd.Series, attr: Attribute, info: dict, *,
                      n_boot: int, rng: np.random.Generator, level: float = 0.95, clusters=None,
                      n_bins: int = 10, edges: str = "right_closed", one_class_ece: str = "compute"
                      ) -> tuple[list[dict], list[dict]]:
    """(group rows, gap rows) for one attribute on one set of evaluated rows under one decision rule.

    ``clusters``: the bootstrap's resampling unit per row (default: ``patients``; image ids resample images).
    ``n_bins``, ``edges``: the ECE binning (calibration.ece_bins); ``one_class_ece``: see :func:`_requirement`.

    Group rows: attribute, group, metric, value, ci_low, ci_high, n, n_patients, n_pos. Gap rows: attribute,
    metric, group_a, group_b, value_a, value_b, n_a, n_b, gap, ci_low, ci_high, difference, diff_ci_low,
    diff_ci_high, flagged, n_boot, n_valid, skipped, reason.
    """
    y = np.asarray(y, dtype=np.int64)
    proba = np.asarray(proba, dtype=np.float64)
    pred = np.asarray(pred, dtype=np.int64)
    binary = proba.shape[1] == 2
    quality = attr.kind == "quality"
    metrics = _gap_metrics(binary, attr.kind)
    gap_names = [*metrics] if quality else [*metrics, "equalized_odds"] + ([] if binary else ["ppr"])
    base_gap = {"attribute": attr.name, "kind": attr.kind, "cut": info.get("cut"), "n_boot": n_boot}

    def skipped_all(reason: str, groups=None) -> list[dict]:
        ga, gb = (groups[0], groups[-1]) if groups and len(groups) >= 2 else (None, None)
        return [{**base_gap, "metric": m, "group_a": ga, "group_b": gb, "skipped": True, "reason": reason}
                for m in gap_names]

    if info.get("unavailable"):
        return [], skipped_all(info["unavailable"])
    lab = labels.to_numpy(dtype=object)
    known = pd.notna(labels).to_numpy()
    present = [g for g in info["groups"] if (lab[known] == g).any()]
    sizes = {g: int((lab[known] == g).sum()) for g in info["groups"]}
    if len(present) < 2:
        return [], skipped_all(f"fewer than two groups present ({', '.join(f'{g}: {n}' for g, n in sizes.items())})",
                               info["groups"])
    small = [g for g in present if sizes[g] < attr.min_group_size]
    groups = present
    # Rows of the analysed (known) part only; patients are resampled among them.
    yk, pk, prk, labk = y[known], proba[known], pred[known], lab[known]
    patk = np.asarray(patients, dtype=object)[known]
    W = cluster_weights(np.asarray(patients if clusters is None else clusters, dtype=object)[known], n_boot, rng)
    group_rows, point, reps = [], {}, {}
    for g in groups:
        m = labk == g
        vals = point_metrics(metrics, yk[m], pk[m], prk[m], n_bins=n_bins, edges=edges)
        wreps = weighted_metrics(metrics, yk, pk, prk, W * m, n_bins=n_bins, edges=edges)
        point[g], reps[g] = vals, wreps
        for metric in metrics:
            lo, hi, _ = percentile_ci(wreps[metric], level)
            why = _requirement(metric, binary, yk[m], one_class_ece)
            group_rows.append({"attribute": attr.name, "kind": attr.kind, "cut": info.get("cut"), "group": g,
                               "metric": metric, "value": np.nan if why else vals[metric],
                               "ci_low": np.nan if why else lo, "ci_high": np.nan if why else hi,
                               "n": int(m.sum()), "n_patients": int(pd.unique(patk[m]).size),
                               "n_pos": int((yk[m] == 1).sum()) if binary else None,
                               "below_min_size": sizes[g] < attr.min_group_size, "reason": why or ""})
    gap_rows = []
    ga, gb = groups[0], groups[-1]
    two = len(groups) == 2
    if small:
        reason = "; ".join(f"group {g!r} has {sizes[g]} rows < minimum {attr.min_group_size}" for g in small)
        return group_rows, skipped_all(reason, groups)
    per_metric: dict[str, dict] = {}
    for metric in metrics:
        whys = [f"group {g!r}: {w}" for g in groups if (w := _requirement(metric, binary, yk[labk == g], one_class_ece))]
        row = {**base_gap, "metric": metric, "group_a": ga if two else ",".join(groups), "group_b": gb if two else None}
        if whys:
            gap_rows.append({**row, "skipped": True, "reason": "; ".join(whys)})
            continue
        values = np.array([point[g][metric] for g in groups])
        R = np.stack([reps[g][metric] for g in groups])  # (groups, B)
        if two:
            diff = values[1] - values[0]
            dreps = R[1] - R[0]
            dlo, dhi, _ = percentile_ci(dreps, level)
            greps = np.abs(dreps)
            row |= {"value_a": values[0], "value_b": values[1], "n_a": sizes[ga], "n_b": sizes[gb],
                    "difference": diff, "diff_ci_low": dlo, "diff_ci_high": dhi,
                    "flagged": bool(dlo > 0 or dhi < 0)}
        else:
            diff, dreps = np.nan, None
            with np.errstate(invalid="ignore"):
                greps = R.max(0) - R.min(0)
            row |= {"flagged": None}
        lo, hi, n_valid = percentile_ci(greps, level)
        gap = float(values.max() - values.min())
        row |= {"gap": gap, "ci_low": lo, "ci_high": hi, "n_valid": n_valid, "skipped": False, "reason": ""}
        gap_rows.append(row)
        per_metric[metric] = {"gap": gap, "greps": greps, "dreps": dreps, "flagged": row["flagged"]}
    if quality:
        return group_rows, gap_rows
    tpr, fpr = ("tpr", "fpr") if binary else ("tpr_macro", "fpr_macro")
    eo = {**base_gap, "metric": "equalized_odds", "group_a": ga if two else ",".join(groups),
          "group_b": gb if two else None}
    if tpr in per_metric and fpr in per_metric:
        greps = np.fmax(per_metric[tpr]["greps"], per_metric[fpr]["greps"])
        greps[np.isnan(per_metric[tpr]["greps"]) | np.isnan(per_metric[fpr]["greps"])] = np.nan
        lo, hi, n_valid = percentile_ci(greps, level)
        flagged = (bool(per_metric[tpr]["flagged"] or per_metric[fpr]["flagged"]) if two else None)
        gap_rows.append({**eo, "n_a": sizes[ga], "n_b": sizes[gb] if two else None,
                         "gap": max(per_metric[tpr]["gap"], per_metric[fpr]["gap"]), "ci_low": lo, "ci_high": hi,
                         "flagged": flagged, "n_valid": n_valid, "skipped": False, "reason": ""})
    else:
        gone = [m for m in (tpr, fpr) if m not in per_metric]
        gap_rows.append({**eo, "skipped": True, "reason": f"needs the {' and '.join(gone)} gap(s), skipped"})
    if not binary:
        gap_rows.append({**base_gap, "metric": "ppr", "group_a": ga, "group_b": gb, "skipped": True,
                         "reason": "predicted-positive rate is defined for binary tasks only"})
    return group_rows, gap_rows


# --------------------------------------------------------------------------------------------------------------
# summary scores
# --------------------------------------------------------------------------------------------------------------
def _component(metric: str, kind: str) -> str | None:
    base = metric_family(metric)
    return base if base in SCORE_COMPONENTS[kind] else None


def gap_score(gaps: pd.DataFrame, attributes: list[str] | None, kind: str) -> dict:
    """1 − mean of the available score-component gaps among ``gaps`` (rows of one evaluation cell).

    ``attributes``: the attributes that count (None: all of ``kind``). Returns value, n_components,
    components ('attribute:metric=gap' list) and reason (why NaN, or which components were skipped)."""
    g = gaps[gaps["kind"] == kind]
    if attributes is not None:
        g = g[g["attribute"].isin(attributes)]
    g = g[g["metric"].map(lambda m: _component(m, kind)).notna()]
    ok = g[~g["skipped"].astype(bool)]
    skipped = g[g["skipped"].astype(bool)]
    comps = [f"{a}:{m}={v:.4g}" for a, m, v in zip(ok["attribute"], ok["metric"], ok["gap"])]
    why = "; ".join(sorted({f"{a}:{m} skipped ({r})" for a, m, r in
                            zip(skipped["attribute"], skipped["metric"], skipped["reason"])}))
    if ok.empty:
        return {"value": np.nan, "n_components": 0, "components": "",
                "reason": why or f"no {kind} attributes configured for these rows"}
    return {"value": float(1.0 - ok["gap"].astype(float).mean()), "n_components": int(len(ok)),
            "components": ", ".join(comps), "reason": why}


def shift_scores(metrics: pd.DataFrame, tasks: dict[str, dict], *, keys: list[str]) -> pd.DataFrame:
    """Shift score per (keys, harmonised group) from in-distribution test AUROC rows of ``metrics``.

    ``metrics``: tidy rows with columns keys + dataset, task, metric, value (threshold-free AUROC of models
    trained and tested on the same dataset). Per dataset the AUROC is averaged over the remaining rows (seeds);
    Shift = 1 − (max − min) over the datasets of the group; NaN with a reason below two datasets.
    """
    from retinabench.data.derived import harmonised_groups
    groups = harmonised_groups({t: tasks[t] for t in sorted(set(metrics["task"])) if t in tasks})
    rows = []
    for group, names in groups.items():
        part = metrics[metrics["task"].isin(names) & metrics["metric"].isin(metric_family_names("auroc"))]
        for key, cell in part.groupby(keys, sort=True, dropna=False):
            per = cell.groupby("dataset")["value"].mean().dropna()
            base = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
            rec = {**base, "group": group, "datasets": ",".join(per.index), "n_datasets": int(len(per)),
                   "per_dataset": ", ".join(f"{d}={v:.4g}" for d, v in per.items()), "n_seeds":
                   int(cell.groupby("dataset")["value"].count().max()) if len(cell) else 0}
            if len(per) < 2:
                rec |= {"value": np.nan, "reason": f"needs >= 2 datasets with the task; have {list(per.index)}"}
            else:
                rec |= {"value": float(1.0 - (per.max() - per.min())), "reason": ""}
            rows.append(rec)
    return pd.DataFrame(rows)
