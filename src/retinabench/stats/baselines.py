"""Reference levels beside every headline number: the majority-class predictor and chance, per task, regime,
split and metric, computed from the splits alone (the same rows the protocols are evaluated on).

- ``majority``: the metrics of the constant predictor that always answers the most frequent class of the
  regime's training rows, with the training class frequencies as its probabilities — scored by
  :func:`retinabench.metrics.classification.classification_metrics`, exactly as every protocol is. Its accuracy is
  the *no-information rate* (the share of that class in the evaluated rows; with stratified splits the largest
  class share); its AUROC is 0.5, its balanced accuracy 1/K, its kappa 0.
- ``chance``: the expected value of uniform random guessing: accuracy and balanced accuracy 1/K, AUROC 0.5,
  AUPRC the class prevalence (macro: 1/K), macro F1 mean_c 2·p_c/K / (p_c + 1/K), kappa 0; calibration error has
  no chance level (NaN).

A score at or below the majority level (within half an evaluated image, :func:`not_above`) says the model learned
nothing usable on that task: the appendix and ranking tables mark it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from retinabench.data.splits import regime_rows
from retinabench.regimes import Regime

COLUMNS = ["dataset", "task", "regime", "split", "metric", "majority", "chance", "n", "n_classes", "majority_class",
           "majority_share"]


def chance_levels(prevalence: np.ndarray) -> dict[str, float]:
    k = len(prevalence)
    p = np.asarray(prevalence, dtype=float)
    f1 = np.where(p > 0, 2 * p / k / (p + 1 / k), 0.0)
    out = {"accuracy": 1 / k, "balanced_accuracy": 1 / k, "auroc": 0.5,
           "auprc": float(p[1]) if k == 2 else float(p.mean()), "f1_macro": float(f1.mean()), "kappa": 0.0,
           "ece": float("nan"), "ece_top_label": float("nan")}
    return out


def task_baselines(split: pd.DataFrame, task: dict, regimes: list[str]) -> pd.DataFrame:
    """Baseline rows of one task's split for each regime ``a-b``: validation rows of training kind ``a`` (what the
    protocols select on) and test rows of kind ``b``."""
    from retinabench.metrics.classification import classification_metrics, metric_names
    classes = list(task["classes"])
    k = len(classes)
    rows = []
    for regime in regimes:
        parsed = Regime.parse(regime)
        train = regime_rows(split, "train", parsed.train_balanced)
        if train.empty:
            raise ValueError(f"baselines: task {task['name']!r} has no training rows in regime {regime}")
        counts = np.bincount(train["y"].to_numpy(dtype=int), minlength=k).astype(float)
        prior = counts / counts.sum()
        majority = int(np.argmax(counts))
        for part, balanced in (("val", parsed.train_balanced), ("test", parsed.test_balanced)):
            rows_ = regime_rows(split, part, balanced)
            if rows_.empty:
                continue
            y = rows_["y"].to_numpy(dtype=int)
            proba = np.tile(prior, (len(y), 1))
            values = classification_metrics(y, proba, np.full(len(y), majority), ordinal=bool(task.get("ordinal")))
            prevalence = np.bincount(y, minlength=k) / len(y)
            chance = chance_levels(prevalence)
            for metric in metric_names(k):
                rows.append({"dataset": task["dataset"], "task": task["name"], "regime": regime, "split": part,
                             "metric": metric, "majority": float(values[metric]), "chance": chance[metric],
                             "n": int(len(y)), "n_classes": k, "majority_class": classes[majority],
                             "majority_share": float(prevalence[majority])})
    return pd.DataFrame(rows, columns=COLUMNS)


def baselines_table(splits: dict[str, pd.DataFrame], tasks: dict[str, dict], regimes: list[str]) -> pd.DataFrame:
    """All tasks' baselines (``splits``: task name -> split table)."""
    missing = sorted(set(tasks) - set(splits))
    if missing:
        raise KeyError(f"baselines: no split table for task(s) {missing}")
    frames = [task_baselines(splits[t], tasks[t], regimes) for t in sorted(tasks)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)


def check_baselines(df: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise KeyError(f"baselines table lacks columns {missing}")
    return df


def not_above(score, majority, n) -> np.ndarray:
    """True where a (higher-is-better) score does not exceed the majority level by at least half an image of the
    evaluated rows (ties to the majority-class rate, and anything below it)."""
    score, majority = np.asarray(score, dtype=float), np.asarray(majority, dtype=float)
    tol = 0.5 / np.maximum(np.asarray(n, dtype=float), 1.0)
    return np.where(np.isfinite(majority), score <= majority + tol, False)


def select(baselines: pd.DataFrame, metric: str, split: str, regime: str | None = None) -> pd.DataFrame:
    b = baselines[(baselines["metric"] == metric) & (baselines["split"] == split)]
    if regime is not None:
        b = b[b["regime"] == regime]
    return b
