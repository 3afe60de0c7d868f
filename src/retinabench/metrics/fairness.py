"""Subgroups, fairness and image-quality gaps with patient-clustered bootstrap CIs, and the summary scores.

Attributes (config ``reliability.attributes`` / ``reliability.quality``) are data: a manifest column and either
a cut (``median``: FOCUS's median split of the analysed rows, ages *above* the median (``>median``) vs the rest
(``<=median``), so ties at the median stay with the lower group; a number: ``<c`` / ``>=c``, OcularBench's 60 years)
or a list of groups (sex: female / male; quality: good / poor). Rows whose value is missing or outside the groups
are excluded from that attribute and counted.

Fairness attributes, per group: predicted-positive rate (binary only), accuracy, TPR, FPR, AUROC (macro
one-vs-rest TPR/FPR/AUROC for multi-class tasks); equalized-odds gap = max(TPR gap, FPR gap). Quality strata
(FOCUS's quality robustness), per group: accuracy, AUROC, AUPRC, F1 and ECE (multi-class: macro AUROC/AUPRC/F1 and
top-label ECE). Each gap is reported twice: signed, ``gap_b_minus_a`` = value(group b) − value(group a), the group
order declared by ``group_a`` / ``group_b`` (the configured groups' order; a cut: the lower group first); and
absolute, ``abs_gap`` (max − min with more groups: then no signed gap). A gap is skipped, with the reason recorded, when the attribute has
no values, fewer than two groups, a group below the minimum size (fairness 10, quality 5 rows), or a group
without the positives/negatives the metric needs (ECE of a one-class group: only under
``reliability.ece_one_class_strata: focus``, FOCUS's rule; by default it has a value). Never silently.

CIs: patients (or images, setting ``reliability.bootstrap.unit``) of the analysed rows are resampled with
replacement (stats.bootstrap.cluster_weights); each replicate recomputes every group's metric on the same draw.
``gap_b_minus_a_ci_*``: percentile interval of the signed gap; ``flagged``: it excludes 0 (for equalized odds: the
TPR or the FPR difference's does). ``abs_gap_ci_*``: of the absolute gap, which is never below 0, so that interval
excludes 0 for any real data and is no test. The test of "no gap" is a permutation test (:func:`permuted_groups`):
the group labels are permuted among the resampling units (patients; rows when an attribute varies within a
patient, e.g. image quality), ``n_perm`` times, seeded; statistic |gap| (max − min; equalized odds: max of the
TPR and FPR gaps); ``p_perm`` = (1 + #{permuted >= observed}) / (1 + #valid permutations).

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
from retinabench.metrics.weighted import cluster_codes, cluster_weights, percentile_ci, weighted_metrics

GAP_METRICS_BINARY = ("ppr", "accuracy", "tpr", "fpr", "auroc")
GAP_METRICS_MULTI = ("accuracy", "tpr_macro", "fpr_macro", "auroc_macro")
QUALITY_METRICS_BINARY = ("accuracy", "auroc", "auprc", "f1", "ece")
QUALITY_METRICS_MULTI = ("accuracy", "auroc_macro", "auprc_macro", "f1_macro", "ece_top_label")
SCORE_COMPONENTS = {"fairness": ("equalized_odds", "accuracy", "auroc"),
                    "quality": ("accuracy", "auroc", "auprc", "f1", "ece")}
# Columns of the rows subgroup_analysis returns (a table has them all even when every gap was skipped).
GROUP_FIELDS = ["attribute", "kind", "cut", "group", "metric", "value", "ci_low", "ci_high", "n", "n_patients",
                "n_pos", "below_min_size", "reason"]
GAP_FIELDS = ["attribute", "kind", "cut", "metric", "group_a", "group_b", "value_a", "value_b", "n_a", "n_b",
              "gap_b_minus_a", "gap_b_minus_a_ci_low", "gap_b_minus_a_ci_high", "flagged", "abs_gap",
              "abs_gap_ci_low", "abs_gap_ci_high", "p_perm", "p_perm_bh", "n_perm", "perm_unit", "n_boot", "n_valid",
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
                      n_bins: int = 10, edges: str = "right_closed", one_class_ece: str = "compute",
                      n_perm: int = 1000, perm_rng: np.random.Generator | None = None, unit: str = "patient"
                      ) -> tuple[list[dict], list[dict]]:
    """(group rows, gap rows) for one attribute on one set of evaluated rows under one decision rule.

    ``clusters``: the bootstrap's resampling unit per row (default: ``patients``; image ids resample images).
    ``n_bins``, ``edges``: the ECE binning (calibration.ece_bins); ``one_class_ece``: see :func:`_requirement`.
    ``n_perm``, ``perm_rng`` (default: a generator seeded 0), ``unit`` (the clusters' name): the permutation test.

    Group rows: attribute, group, metric, value, ci_low, ci_high, n, n_patients, n_pos. Gap rows: GAP_FIELDS
    (``p_perm_bh`` is left to the caller, which knows the family).
    """
    y = np.asarray(y, dtype=np.int64)
    proba = np.asarray(proba, dtype=np.float64)
    pred = np.asarray(pred, dtype=np.int64)
    binary = proba.shape[1] == 2
    quality = attr.kind == "quality"
    metrics = _gap_metrics(binary, attr.kind)
    gap_names = [*metrics] if quality else [*metrics, "equalized_odds"] + ([] if binary else ["ppr"])
    base_gap = {"attribute": attr.name, "kind": attr.kind, "cut": info.get("cut"), "n_boot": n_boot, "n_perm": n_perm}

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
    unitk = np.asarray(patients if clusters is None else clusters, dtype=object)[known]
    W = cluster_weights(unitk, n_boot, rng)
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
    P, perm_unit = permuted_groups(labk, unitk, groups, n_perm, perm_rng or np.random.default_rng(0), unit)
    base_gap["perm_unit"] = perm_unit
    perm = {g: weighted_metrics(metrics, yk, pk, prk, (P == i).astype(np.float64), n_bins=n_bins, edges=edges)
            for i, g in enumerate(groups)}
    for metric in metrics:
        whys = [f"group {g!r}: {w}" for g in groups if (w := _requirement(metric, binary, yk[labk == g], one_class_ece))]
        row = {**base_gap, "metric": metric, "group_a": ga if two else ",".join(groups), "group_b": gb if two else None}
        if whys:
            row.pop("perm_unit")
            gap_rows.append({**row, "skipped": True, "reason": "; ".join(whys)})
            continue
        values = np.array([point[g][metric] for g in groups])
        R = np.stack([reps[g][metric] for g in groups])  # (groups, B)
        if two:
            dreps = R[1] - R[0]
            dlo, dhi, _ = percentile_ci(dreps, level)
            greps = np.abs(dreps)
            row |= {"value_a": values[0], "value_b": values[1], "n_a": sizes[ga], "n_b": sizes[gb],
                    "gap_b_minus_a": values[1] - values[0], "gap_b_minus_a_ci_low": dlo, "gap_b_minus_a_ci_high": dhi,
                    "flagged": bool(dlo > 0 or dhi < 0)}
        else:
            with np.errstate(invalid="ignore"):
                greps = R.max(0) - R.min(0)
            row |= {"flagged": None}
        lo, hi, n_valid = percentile_ci(greps, level)
        gap = float(values.max() - values.min())
        Q = np.stack([perm[g][metric] for g in groups])  # (groups, n_perm)
        with np.errstate(invalid="ignore"):
            pstat = Q.max(0) - Q.min(0)
        row |= {"abs_gap": gap, "abs_gap_ci_low": lo, "abs_gap_ci_high": hi, "p_perm": permutation_p_value(gap, pstat),
                "n_valid": n_valid, "skipped": False, "reason": ""}
        gap_rows.append(row)
        per_metric[metric] = {"gap": gap, "greps": greps, "pstat": pstat, "flagged": row["flagged"]}
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
        gap = max(per_metric[tpr]["gap"], per_metric[fpr]["gap"])
        pstat = np.fmax(per_metric[tpr]["pstat"], per_metric[fpr]["pstat"])
        pstat[np.isnan(per_metric[tpr]["pstat"]) | np.isnan(per_metric[fpr]["pstat"])] = np.nan
        # no signed equalized-odds gap: it is the larger of two absolute gaps (their signed gaps are the rows above)
        gap_rows.append({**eo, "n_a": sizes[ga], "n_b": sizes[gb] if two else None, "abs_gap": gap,
                         "abs_gap_ci_low": lo, "abs_gap_ci_high": hi, "p_perm": permutation_p_value(gap, pstat),
                         "flagged": flagged, "n_valid": n_valid, "skipped": False, "reason": ""})
    else:
        gone = [m for m in (tpr, fpr) if m not in per_metric]
        eo.pop("perm_unit")
        gap_rows.append({**eo, "skipped": True, "reason": f"needs the {' and '.join(gone)} gap(s), skipped"})
    if not binary:
        gap_rows.append({**base_gap, "metric": "ppr", "group_a": ga, "group_b": gb, "skipped": True,
                         "reason": "predicted-positive rate is defined for binary tasks only"})
    return group_rows, gap_rows


def permuted_groups(labels, units, groups: list, n_perm: int, rng: np.random.Generator, unit: str = "patient"
                    ) -> tuple[np.ndarray, str]:
    """``(n_perm, n)`` group indices (into ``groups``) under ``n_perm`` permutations of the group labels, and the
    unit permuted: the resampling ``unit`` when every unit holds one group (a patient's images move together),
    else ``image`` (the attribute varies within units: rows are permuted)."""
    codes, k = cluster_codes(units)
    gi = pd.Series(pd.Categorical(np.asarray(labels, dtype=object), categories=groups).codes)
    per_unit = gi.groupby(codes)
    if int(per_unit.nunique().max()) == 1:
        unit_group = per_unit.first().to_numpy()  # index 0..k-1: the codes
        order = np.argsort(rng.random((n_perm, k)), axis=1)
        return unit_group[order][:, codes], unit
    order = np.argsort(rng.random((n_perm, len(gi))), axis=1)
    return gi.to_numpy()[order], "image"


def permutation_p_value(observed: float, permuted: np.ndarray) -> float:
    """(1 + #{permuted >= observed}) / (1 + #valid): the +1 correction counts the observed labelling as one of the
    permutations, so p is never 0 and the test is exact under exchangeability; NaN permutations (a group
    without a class the metric needs) are left out; NaN without any valid one."""
    permuted = np.asarray(permuted, dtype=np.float64)
    valid = permuted[~np.isnan(permuted)]
    if not len(valid) or np.isnan(observed):
        return float("nan")
    return float((1 + np.sum(valid >= observed - 1e-12)) / (1 + len(valid)))


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
    comps = [f"{a}:{m}={v:.4g}" for a, m, v in zip(ok["attribute"], ok["metric"], ok["abs_gap"])]
    why = "; ".join(sorted({f"{a}:{m} skipped ({r})" for a, m, r in
                            zip(skipped["attribute"], skipped["metric"], skipped["reason"])}))
    if ok.empty:
        return {"value": np.nan, "n_components": 0, "components": "",
                "reason": why or f"no {kind} attributes configured for these rows"}
    return {"value": float(1.0 - ok["abs_gap"].astype(float).mean()), "n_components": int(len(ok)),
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
