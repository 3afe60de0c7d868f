"""Reliability summaries: harmonised-task coverage, the analysis layer's subgroup table, summary scores."""
from __future__ import annotations

import pandas as pd

from retinabench.reliability.evaluation import AS_WRITTEN, CELL_KEYS
from retinabench.settings.reliability import ReliabilitySettings


def harmonised_coverage(settings: ReliabilitySettings, datasets: list[str], tasks: dict[str, dict]) -> pd.DataFrame:
    """Coverage rows for harmonised tasks a dataset does not support, for groups without a transfer partner, and
    for each paper label variant (scope ``label_variant``, its approximation in the reason)."""
    from retinabench.data.derived import harmonised_groups, label_variants, unsupported_harmonised
    from retinabench.metrics.coverage import COVERAGE_COLUMNS
    rows = []
    catalogue = {h: entry.plain() for h, entry in settings.harmonised.items()}
    for r in unsupported_harmonised(catalogue, datasets, tasks).to_dict("records"):
        rows.append({"source": "*", "encoder": "*", "protocol": "*", "dataset": r["dataset"], "task": r["task"],
                     "regime": "*", "scope": "harmonised", "status": "not_supported", "n_rows": 0,
                     "reason": r["reason"]})
    for group, names in harmonised_groups(tasks).items():
        if len(names) < 2:
            t = tasks[names[0]]
            rows.append({"source": "transfer", "encoder": "*", "protocol": "*", "dataset": t["dataset"],
                         "task": names[0], "regime": "*", "scope": "transfer", "status": "skipped", "n_rows": 0,
                         "reason": f"harmonised group {group}: no other selected dataset has the task"})
    for r in label_variants(tasks).to_dict("records"):
        how = f"approximation: {r['approximation']}" if r["approximation"] else "the paper's definition, exact"
        ours = f"; ours: {r['variant_of']}" if r["variant_of"] else "; no task of ours (not supported)"
        rows.append({"source": "*", "encoder": "*", "protocol": "*", "dataset": r["dataset"], "task": r["task"],
                     "regime": "*", "scope": "label_variant", "status": "evaluated", "n_rows": None,
                     "reason": f"label variant {r['label_variant']}: {how}{ours}"})
    df = pd.DataFrame(rows, columns=COVERAGE_COLUMNS)
    df["n_rows"] = df["n_rows"].astype("Int64")
    return df


def analysis_subgroup_metrics(subgroups: pd.DataFrame) -> pd.DataFrame:
    """Per-group metrics in the analysis layer's format (METRICS columns + attribute + group): models evaluated
    on their own task (no transfer), the protocols' own decisions (``y_pred`` as written). Groups below the minimum size keep their value and are
    marked ``below_min_size`` (their gaps are skipped in gaps.parquet), so a consumer can filter them."""
    from retinabench.schemas import METRICS
    if subgroups.empty:
        return pd.DataFrame(columns=[*METRICS.names, "attribute", "group", "n_patients", "below_min_size", "source"])
    s = subgroups[(subgroups["train_task"] == subgroups["task"]) & (subgroups["threshold"] == AS_WRITTEN)
                  & (subgroups["source"] != "transfer")]
    s = s.assign(n=s["n"].astype("int64"))
    return s[[*METRICS.names, "attribute", "group", "n_patients", "below_min_size", "source"]].reset_index(drop=True)


def summary_scores(gaps: pd.DataFrame, metrics: pd.DataFrame, tasks: dict[str, dict], settings: ReliabilitySettings
                   ) -> pd.DataFrame:
    """Fairness and Quality per (model cell, threshold) averaged over seeds; Shift per model and harmonised task."""
    from retinabench.metrics.fairness import FORMULAS, gap_score, shift_scores
    rows = []
    keys = [k for k in CELL_KEYS if k != "seed"] + ["threshold"]
    if not gaps.empty:
        g = gaps.copy()
        g["skipped"] = g["skipped"].fillna(False).astype(bool)
        # Skip decisions do not depend on the seed (they depend on rows and labels), so averaging each gap over
        # seeds first and then scoring equals averaging the per-seed scores.
        agg = (g.groupby([*keys, "kind", "attribute", "metric"], dropna=False, sort=True)
               .agg(abs_gap=("abs_gap", "mean"), skipped=("skipped", "all"), reason=("reason", "first"),
                    n_seeds=("seed", "nunique")).reset_index())
        for key, cell in agg.groupby(keys, dropna=False, sort=True):
            base = dict(zip(keys, key))
            for score, kind, attrs in (("fairness", "fairness", settings.fairness_score_attributes),
                                       ("quality", "quality", None)):
                rows.append({"score": score, **base, **gap_score(cell, attrs, kind),
                             "n_seeds": int(cell["n_seeds"].max()), "formula": FORMULAS[score]})
    if not metrics.empty:
        m = metrics[(metrics["threshold"] == "none")]
        skeys = ["source", "encoder", "protocol", "regime"]
        parts = [(m[(m["source"] != "transfer") & (m["train_task"] == m["task"])], skeys),
                 (m[m["source"] == "transfer"], [*skeys, "train_dataset", "train_task"])]
        for part, k in parts:
            if part.empty:
                continue
            sh = shift_scores(part, tasks, keys=k)
            for r in sh.to_dict("records"):
                rows.append({"score": "shift", **{c: r.get(c) for c in k}, "threshold": "none",
                             "dataset": r["datasets"], "task": r["group"], "value": r["value"],
                             "n_components": r["n_datasets"], "components": r["per_dataset"],
                             "reason": r["reason"], "n_seeds": r["n_seeds"], "formula": FORMULAS["shift"]})
    cols = ["score", "source", "train_dataset", "train_task", "encoder", "protocol", "regime", "threshold",
            "dataset", "task", "value", "n_components", "components", "n_seeds", "reason", "formula"]
    df = pd.DataFrame(rows)
    for c in cols:
        if c not in df.columns:
            df[c] = None
    return df[cols]
