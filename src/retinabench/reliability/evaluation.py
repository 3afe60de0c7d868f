"""Reliability layer: calibration, thresholds, fairness and quality gaps, transfer, paired bootstrap comparisons.

Everything is computed from the shared predictions schema (image_id, dataset, task, encoder, protocol, seed,
regime, split, y_true, y_pred, p_<class>...) plus the manifest (patient_id, age, sex, quality, site), so it
applies unchanged to kNN, linear and logistic probes, fine-tuning and, later, zero-shot models. A predictions
table may carry ``train_dataset``/``train_task`` (transfer); without them the model was trained on the task it
is tested on.

Evaluation unit = (source, train_dataset, train_task, encoder, protocol, seed, regime): its validation rows fit
the temperature and the validation-chosen threshold, which are carried unchanged to each of its test cells
(dataset, task). Plain functions, DataFrames in and out (the stages are in retinabench.pipeline.reliability). Formulas: docs/reliability.md.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from retinabench.schemas import PREDICTIONS
from retinabench.settings.base import BOOTSTRAP_UNITS
from retinabench.settings.reliability import ReliabilitySettings

KINDS = ("metrics", "thresholds", "calibration", "bins", "subgroups", "gaps", "coverage")
# The hard decision a protocol wrote (its `y_pred`: the argmax for every probe and fine-tuning, FOCUS's argmax rule;
# a parsed answer for an MLLM). Never recomputed from the probabilities.
AS_WRITTEN = "y_pred"
UNIT_KEYS = ["source", "train_dataset", "train_task", "encoder", "protocol", "seed", "regime"]
CELL_KEYS = [*UNIT_KEYS, "dataset", "task"]
ATTRIBUTE_COLUMNS = ("age", "sex", "quality", "site")


def attributes_of(settings: ReliabilitySettings):
    from retinabench.metrics.fairness import Attribute
    fair = [Attribute.from_settings(a, kind="fairness", min_group_size=settings.min_group_size)
            for a in settings.attributes]
    qual = [Attribute.from_settings(a, kind="quality", min_group_size=settings.min_quality_group_size)
            for a in settings.quality]
    names = [a.name for a in fair + qual]
    if len(set(names)) != len(names):
        raise ValueError(f"reliability: attribute names must be unique, got {names}")
    return fair + qual


# --------------------------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------------------------
def prepare_predictions(preds: pd.DataFrame, tasks: dict[str, dict], source: str) -> pd.DataFrame:
    """Check the schema columns and class probabilities; add source/train_dataset/train_task."""
    missing = [c for c in PREDICTIONS.names if c not in preds.columns]
    if missing:
        raise KeyError(f"predictions ({source}) lack columns {missing}")
    unknown = sorted(set(preds["task"]) - set(tasks))
    if unknown:
        raise KeyError(f"predictions ({source}) have tasks {unknown} without a registry entry (given {sorted(tasks)})")
    for t in preds["task"].unique():
        need = [f"p_{c}" for c in tasks[t]["classes"]]
        lack = [c for c in need if c not in preds.columns]
        if lack:
            raise KeyError(f"predictions ({source}) for task {t!r} lack probability columns {lack}")
    out = preds.copy()
    if "train_task" not in out.columns:
        out["train_task"] = out["task"]
    if "train_dataset" not in out.columns:
        out["train_dataset"] = out["dataset"]
    out["source"] = source
    bad = sorted(set(out["split"]) - {"val", "test"})
    if bad:
        raise ValueError(f"predictions ({source}): split values {bad}; expected val and test")
    from retinabench.metrics.classification import has_answers
    # generated answers: an invalid one is y_pred = -1, kept and counted wrong
    for (t, _), rows in out.groupby(["task", "protocol"]):
        k = len(tasks[t]["classes"])
        answered = has_answers(rows)
        wrong = sorted(set(rows["y_pred"].dropna().astype(int)) - set(range(k)) - ({-1} if answered else set()))
        if wrong or rows["y_pred"].isna().any():
            extra = " (or -1, an invalid answer)" if answered else ""
            raise ValueError(f"predictions ({source}) for task {t!r}: y_pred must be a class index 0..{k - 1}{extra}, "
                             f"got {wrong or 'missing values'}")
    return out


def resampling_units(rows: pd.DataFrame, unit: str) -> np.ndarray:
    """Cluster id of each row for the bootstrap: its patient, or the image itself (dataset-qualified)."""
    if unit == "patient":
        return rows["patient_id"].astype(str).to_numpy()
    if unit == "image":
        return (rows["dataset"].astype(str) + "/" + rows["image_id"].astype(str)).to_numpy()
    raise ValueError(f"bootstrap unit must be one of {BOOTSTRAP_UNITS}, got {unit!r}")


def decisions(rows: pd.DataFrame, proba: np.ndarray, rule: str, threshold: float | None) -> np.ndarray:
    """Hard predictions under a rule: the protocol's ``y_pred`` as written, or a validation-chosen threshold."""
    from retinabench.metrics.thresholds import predict
    if rule == AS_WRITTEN:
        return rows["y_pred"].to_numpy(dtype=np.int64)
    return predict(proba, rule, threshold)


def attach_manifest(preds: pd.DataFrame, manifest: pd.DataFrame, columns: tuple[str, ...] = (), *,
                    standard: bool = True, what: str = "predicted") -> pd.DataFrame:
    """Add patient_id, the attribute columns (``standard``) and ``columns`` (those the configured attributes group
    by, e.g. a manifest's ``eye``) by (dataset, image_id); every ``what`` image must be known."""
    need = list(dict.fromkeys(["dataset", "image_id", "patient_id", *(ATTRIBUTE_COLUMNS if standard else ()),
                               *columns]))
    missing = [c for c in need if c not in manifest.columns]
    if missing:
        raise KeyError(f"manifest lacks columns {missing}")
    m = manifest[need].drop_duplicates(["dataset", "image_id"])
    out = preds.merge(m, on=["dataset", "image_id"], how="left", validate="many_to_one", indicator=True)
    lost = out[out["_merge"] == "left_only"]
    if len(lost):
        raise KeyError(f"{len(lost)} {what} images are not in the manifest, e.g. "
                       f"{lost[['dataset', 'image_id']].head(3).to_dict('records')}")
    return out.drop(columns="_merge")


# --------------------------------------------------------------------------------------------------------------
# per-job evaluation
# --------------------------------------------------------------------------------------------------------------
def evaluate_predictions(preds: pd.DataFrame, manifest: pd.DataFrame, exclusions: pd.DataFrame,
                         splits: dict[str, pd.DataFrame], tasks: dict[str, dict], settings: ReliabilitySettings,
                         *, source: str) -> dict[str, pd.DataFrame]:
    """All reliability tables (KINDS) of one predictions table."""
    from retinabench.metrics import calibration as cal
    from retinabench.metrics.coverage import Coverage, label_exclusions
    from retinabench.metrics.fairness import assign_groups, subgroup_analysis
    from retinabench.metrics.thresholds import THRESHOLD_FREE, choose_threshold, metric_names, point_metrics
    from retinabench.metrics.weighted import cluster_weights, make_rng, percentile_ci, weighted_metrics

    attributes = attributes_of(settings)
    preds = attach_manifest(prepare_predictions(preds, tasks, source), manifest,
                            tuple(a.column for a in attributes))
    n_bins, edges, rule = settings.n_bins, settings.ece_bin_edges, settings.threshold_rule
    boot = settings.bootstrap
    n_boot, level, boot_unit = boot.n_boot, boot.level, boot.unit
    out: dict[str, list] = {k: [] for k in KINDS}
    cov = Coverage()
    from retinabench.progress import progress
    units = preds.groupby(UNIT_KEYS, sort=True)
    for unit_key, unit in progress(units, f"reliability {source}", total=units.ngroups, unit="models",
                                   note=lambda u: " ".join(map(str, u[0][3:]))):
        ukeys = dict(zip(UNIT_KEYS, unit_key))
        classes = list(tasks[ukeys["train_task"]]["classes"])
        pcols = [f"p_{c}" for c in classes]
        binary = len(classes) == 2
        val = unit[unit["split"] == "val"]
        yv, pv = val["y_true"].to_numpy(), val[pcols].to_numpy(dtype=np.float64)
        temperature, t_note = cal.fit_temperature(yv, pv, settings.temperature_min_per_class)
        fitted = not t_note
        rules: list[tuple[str, float | None, str]] = [(AS_WRITTEN, None, "")]
        if binary:
            chosen, why = choose_threshold(yv, pv[:, 1], rule)
            rules.append((rule, chosen, why))
        for name, thr, note in rules:
            vals = point_metrics(("accuracy", "f1", "tpr", "fpr") if binary else ("accuracy", "f1_macro"),
                                 yv, pv, decisions(val, pv, name, thr)) if len(yv) else {}
            out["thresholds"].append({**ukeys, "threshold": name, "value": thr, "n_val": int(len(yv)),
                                      "note": note, **{f"val_{k}": v for k, v in vals.items()}})
        for (dataset, task), test in unit[unit["split"] == "test"].groupby(["dataset", "task"], sort=True):
            if list(tasks[task]["classes"]) != classes:
                raise ValueError(f"{task!r} has classes {tasks[task]['classes']} but its model was trained on "
                                 f"{ukeys['train_task']!r} with {classes}")
            ckeys = {**ukeys, "dataset": dataset, "task": task}
            covkeys = {k: ckeys[k] for k in ("source", "encoder", "protocol", "dataset", "task", "regime")}
            y, proba = test["y_true"].to_numpy(), test[pcols].to_numpy(dtype=np.float64)
            patients = test["patient_id"].astype(str).to_numpy()
            clusters = resampling_units(test, boot_unit)
            n, n_pat = len(test), int(pd.unique(patients).size)
            n_pos = int((y == 1).sum()) if binary else None
            W = cluster_weights(clusters, n_boot, make_rng(boot.seed, "cell", *ckeys.values()))
            names = metric_names(len(classes))
            for name, thr, _ in rules:
                pred = decisions(test, proba, name, thr)
                vals = point_metrics(names, y, proba, pred, n_bins=n_bins, edges=edges)
                reps = weighted_metrics(names, y, proba, pred, W, n_bins=n_bins, edges=edges)
                for metric in names:
                    free = metric in THRESHOLD_FREE
                    if free and name != AS_WRITTEN:
                        continue  # threshold-free metrics once, under threshold "none"
                    lo, hi, n_valid = percentile_ci(reps[metric], level)
                    out["metrics"].append({**ckeys, "split": "test", "threshold": "none" if free else name,
                                           "metric": metric, "value": vals[metric], "ci_low": lo, "ci_high": hi,
                                           "n": n, "n_patients": n_pat, "n_pos": n_pos, "n_boot": n_boot,
                                           "n_valid": n_valid, "bootstrap_unit": boot_unit})
            # calibration: before / after temperature scaling fitted on the unit's validation rows
            # (`ece`: positive-class, binary only; `ece_top_label`: top-label, every task). Not fitted (too few
            # validation rows of a class): the "after" values stay NaN and no "after" bins, the reason in `note`.
            pos = (lambda pr: cal.binary_ece(y, pr[:, 1], n_bins, edges)) if binary else (lambda pr: np.nan)  # noqa: B023 (called within the iteration)
            stages = [("before", proba)]
            after = dict.fromkeys(("ece_after", "ece_top_label_after", "nll_after"), np.nan)
            if fitted:
                scaled = cal.apply_temperature(proba, temperature)
                stages.append(("after", scaled))
                after = {"ece_after": pos(scaled), "ece_top_label_after": cal.top_label_ece(y, scaled, n_bins, edges),
                         "nll_after": cal.nll(y, scaled)}
            out["calibration"].append({**ckeys, "temperature": temperature, "temperature_fitted": fitted,
                                       "n_val": int(len(yv)), "n": n, "ece_before": pos(proba),
                                       "ece_top_label_before": cal.top_label_ece(y, proba, n_bins, edges),
                                       "nll_before": cal.nll(y, proba), **after, "note": t_note})
            for stage, pr in stages:
                out["bins"].append(cal.reliability_bins(y, pr, n_bins, edges).assign(
                    **ckeys, calibration=stage, metric="ece" if binary else "ece_top_label"))
            # coverage of the cell
            cov.add(covkeys, "test", "evaluated", n, f"{n_pat} patients")
            split = splits.get(task)
            if split is not None:
                own = ckeys["train_task"] == task
                for part, why in (("train", "train split (fits the probe)"),
                                  ("val", "validation split (model selection, threshold, temperature)")):
                    if not own:  # transfer: this probe never saw the target's train/val rows
                        why = f"target's {part} split (the probe was trained on {ckeys['train_task']})"
                    cov.add(covkeys, "split", "not_evaluated", int((split["split"] == part).sum()), why)
                n_split_test = int((split["split"] == "test").sum())
                if n_split_test > n:
                    cov.add(covkeys, "split", "excluded", n_split_test - n,
                            f"class-balanced test subset of regime {ckeys['regime']} (undersampling)")
            m_ds = manifest[manifest["dataset"] == dataset]
            ex_ds = exclusions[exclusions["dataset"] == dataset]
            for scope, why, k in label_exclusions(ex_ds, m_ds, tasks[task]):
                cov.add(covkeys, scope, "excluded", k, why)
            if not binary:
                cov.add(covkeys, "threshold", "skipped", None,
                        f"multi-class task: the protocol's y_pred only, no {rule} threshold")
            elif rules[1][2]:
                cov.add(covkeys, "threshold", "evaluated", int(len(yv)), rules[1][2])
            if t_note:
                cov.add(covkeys, "calibration", "skipped", None, t_note)
            # subgroups and gaps under each decision rule; the same patient draws for both rules
            for attr in attributes:
                labels, info = assign_groups(test, attr)
                scope = f"attribute:{attr.name}"
                if info["unavailable"]:
                    cov.add(covkeys, scope, "skipped", n, info["unavailable"])
                for why, k in info["excluded"].items():
                    cov.add(covkeys, scope, "excluded", k, why)
                for name, thr, _ in rules:
                    rng = make_rng(boot.seed, "subgroup", *ckeys.values(), attr.name)
                    perm_rng = make_rng(boot.seed, "permutation", *ckeys.values(), attr.name)
                    groups, gaps = subgroup_analysis(y, proba, decisions(test, proba, name, thr), patients, labels,
                                                     attr, info, n_boot=n_boot, rng=rng, level=level,
                                                     clusters=clusters, n_bins=n_bins, edges=edges,
                                                     one_class_ece=settings.ece_one_class_strata,
                                                     n_perm=settings.n_permutations, perm_rng=perm_rng,
                                                     unit=boot_unit)
                    for g in groups:
                        out["subgroups"].append({**ckeys, "split": "test", "threshold": name, **g,
                                                 "bootstrap_unit": boot_unit})
                    for g in gaps:
                        out["gaps"].append({**ckeys, "split": "test", "threshold": name, **g,
                                            "bootstrap_unit": boot_unit})
                    if name == AS_WRITTEN:
                        done = [g for g in gaps if not g.get("skipped")]
                        if done:
                            cov.add(covkeys, scope, "evaluated", int(labels.notna().sum()),
                                    f"{len(done)} gaps with CIs")
                        for reason in sorted({g["reason"] for g in gaps if g.get("skipped")} - {info["unavailable"]}):
                            cov.add(covkeys, scope, "skipped", None, reason)
    frames = {k: _frame(k, v) for k, v in out.items() if k != "coverage"}
    gap_q_values(frames["gaps"])
    frames["coverage"] = cov.frame()
    return frames


GAP_FAMILY = ["threshold", "kind", "metric"]


def gap_q_values(gaps: pd.DataFrame) -> pd.DataFrame:
    """Benjamini–Hochberg ``p_perm_bh`` (in place) of the gaps' permutation p-values within each family: one
    decision rule, kind (fairness | quality) and metric, over every cell and attribute of the table (one
    predictions table: its encoders, seeds, tasks), as the paired comparisons' BH runs within a metric family."""
    from retinabench.stats.bootstrap import benjamini_hochberg
    gaps["p_perm_bh"] = np.nan
    tested = gaps[gaps["p_perm"].notna()]
    for _, idx in tested.groupby(GAP_FAMILY, sort=True).groups.items():
        gaps.loc[idx, "p_perm_bh"] = benjamini_hochberg(gaps.loc[idx, "p_perm"].to_numpy(dtype=np.float64))
    return gaps


def table_columns(kind: str) -> list[str]:
    """Fixed columns of each per-job table, so a table keeps its columns even when, e.g., every gap is skipped."""
    from retinabench.metrics.fairness import GAP_FIELDS, GROUP_FIELDS
    cell = [*CELL_KEYS, "split", "threshold"]
    return {
        "metrics": [*cell, "metric", "value", "ci_low", "ci_high", "n", "n_patients", "n_pos", "n_boot", "n_valid",
                    "bootstrap_unit"],
        "thresholds": [*UNIT_KEYS, "threshold", "value", "n_val", "note", "val_accuracy", "val_f1", "val_tpr",
                       "val_fpr", "val_f1_macro"],
        "calibration": [*CELL_KEYS, "temperature", "temperature_fitted", "n_val", "n", "ece_before", "ece_after", "ece_top_label_before",
                        "ece_top_label_after", "nll_before", "nll_after", "note"],
        "bins": [*CELL_KEYS, "calibration", "metric", "bin", "lower", "upper", "n", "mean_prob", "observed"],
        "subgroups": [*cell, *GROUP_FIELDS, "bootstrap_unit"],
        "gaps": [*cell, *GAP_FIELDS, "bootstrap_unit"],
    }[kind]


_BOOL = {"flagged", "skipped", "below_min_size", "temperature_fitted"}
_INT = {"seed", "n", "n_pos", "n_a", "n_b", "n_valid", "n_boot", "n_perm", "n_patients", "n_val", "bin"}
_STR = {*UNIT_KEYS, "dataset", "task", "split", "threshold", "metric", "attribute", "kind", "group", "group_a",
        "group_b", "reason", "note", "calibration", "bootstrap_unit", "perm_unit"} - {"seed"}


def _frame(kind: str, rows: list) -> pd.DataFrame:
    if kind == "bins":
        df = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
    else:
        df = pd.DataFrame(rows)
    cols = table_columns(kind)
    extra = sorted(set(df.columns) - set(cols))
    if extra:
        raise KeyError(f"reliability {kind} table: unexpected columns {extra}")
    df = df.reindex(columns=cols)
    for col in cols:
        if col in _BOOL:
            df[col] = df[col].astype("boolean")
        elif col in _INT:
            df[col] = pd.to_numeric(df[col]).astype("Int64")
        elif col in _STR:
            df[col] = df[col].astype("string")
        else:
            df[col] = pd.to_numeric(df[col]).astype("float64")
    return df
