"""Reliability layer: calibration, thresholds, fairness and quality gaps, transfer, paired bootstrap comparisons.

Everything is computed from the shared predictions schema (image_id, dataset, task, encoder, protocol, seed,
regime, split, y_true, y_pred, p_<class>...) plus the manifest (patient_id, age, sex, quality, site), so it
applies unchanged to kNN, linear and logistic probes, fine-tuning and, later, zero-shot models. A predictions
table may carry ``train_dataset``/``train_task`` (transfer); without them the model was trained on the task it
is tested on.

Evaluation unit = (source, train_dataset, train_task, encoder, protocol, seed, regime): its validation rows fit
the temperature and the validation-chosen threshold, which are carried unchanged to each of its test cells
(dataset, task). Plain functions (DataFrames in, DataFrames out) come first; the ``stage_*`` wrappers that the
Snakemake rules call read inputs and write tables plus provenance sidecars. Formulas: docs/reliability.md.
"""
from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from retinabench.schemas import PREDICTIONS

# Defaults of the config's `reliability:` section (config/config.yaml documents the same values).
RELIABILITY_DEFAULTS: dict[str, Any] = {
    "n_bins": 10,
    "threshold_rule": "youden",            # youden | f1: the validation-chosen threshold (binary tasks)
    "bootstrap": {"n_boot": 1000, "seed": 0, "level": 0.95, "unit": "patient"},  # unit: patient | image
    "min_group_size": 10,
    "min_quality_group_size": 5,
    "attributes": [
        {"name": "age_median", "column": "age", "cut": "median"},
        {"name": "age", "column": "age", "cut": 60},
        {"name": "sex", "column": "sex", "groups": ["female", "male"]},
    ],
    "quality": [{"name": "quality", "column": "quality", "groups": ["good", "poor"]}],
    "fairness_score_attributes": ["age_median", "sex"],
    "harmonised": {},
    "transfer": {"protocols": ["linear", "logreg"], "seeds": [0], "regimes": ["u-u"]},
    "paired": {"sources": ["frozen", "transfer"], "protocols": None, "regime": "u-u",
               "metrics": ["auroc", "auprc", "accuracy", "f1", "ece"], "pairs": [], "domain": ["modality", "shift"]},
    "figures": {"source": "frozen", "protocol": None, "regime": "u-u", "seed": 0, "threshold": "y_pred",
                "metric": "accuracy"},
}
KINDS = ("metrics", "thresholds", "calibration", "bins", "subgroups", "gaps", "coverage")
# Bootstrap resampling unit: `patient` (default; a patient's images are drawn together, so correlated eyes and repeat
# images do not shrink the intervals) or `image` (FOCUS's image-level resampling, for reproducing it).
BOOTSTRAP_UNITS = ("patient", "image")
# The hard decision a protocol wrote (its `y_pred`: the argmax for every probe and fine-tuning, FOCUS's argmax rule;
# a parsed answer for an MLLM). Never recomputed from the probabilities.
AS_WRITTEN = "y_pred"
UNIT_KEYS = ["source", "train_dataset", "train_task", "encoder", "protocol", "seed", "regime"]
CELL_KEYS = [*UNIT_KEYS, "dataset", "task"]
ATTRIBUTE_COLUMNS = ("age", "sex", "quality", "site")


def reliability_settings(config: dict) -> dict:
    """The `reliability:` section merged over the defaults (nested dicts one level deep); unknown keys fail."""
    given = copy.deepcopy(config.get("reliability") or {})
    out = copy.deepcopy(RELIABILITY_DEFAULTS)
    unknown = sorted(set(given) - set(out))
    if unknown:
        raise KeyError(f"reliability: unknown key(s) {unknown}; known: {sorted(out)}")
    for key, value in given.items():
        if isinstance(out[key], dict) and key != "harmonised":
            bad = sorted(set(value or {}) - set(out[key]))
            if bad:
                raise KeyError(f"reliability.{key}: unknown key(s) {bad}; known: {sorted(out[key])}")
            out[key].update(value or {})
        else:
            out[key] = value
    if out["threshold_rule"] not in ("youden", "f1"):
        raise ValueError(f"reliability.threshold_rule must be youden or f1, got {out['threshold_rule']!r}")
    if out["bootstrap"]["n_boot"] < 1000:
        raise ValueError(f"reliability.bootstrap.n_boot must be >= 1000, got {out['bootstrap']['n_boot']}")
    if out["bootstrap"]["unit"] not in BOOTSTRAP_UNITS:
        raise ValueError(f"reliability.bootstrap.unit must be patient or image, got {out['bootstrap']['unit']!r}")
    domains = out["paired"]["domain"]
    out["paired"]["domain"] = [domains] if isinstance(domains, str) else list(domains)
    for h, entry in out["harmonised"].items():
        bad = sorted(set(entry or {}) - {"definition", "not_supported"})
        if bad:
            raise KeyError(f"reliability.harmonised.{h}: unknown key(s) {bad}; known: definition, not_supported")
    return out


def attributes_of(settings: dict):
    from retinabench.metrics.fairness import Attribute
    fair = [Attribute.from_config(a, kind="fairness", min_group_size=settings["min_group_size"])
            for a in settings["attributes"]]
    qual = [Attribute.from_config(a, kind="quality", min_group_size=settings["min_quality_group_size"])
            for a in settings["quality"]]
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
    for t, rows in out.groupby("task"):
        k = len(tasks[t]["classes"])
        wrong = sorted(set(rows["y_pred"].dropna().astype(int)) - set(range(k)))
        if wrong or rows["y_pred"].isna().any():
            raise ValueError(f"predictions ({source}) for task {t!r}: y_pred must be a class index 0..{k - 1}, got "
                             f"{wrong or 'missing values'}")
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


def attach_manifest(preds: pd.DataFrame, manifest: pd.DataFrame) -> pd.DataFrame:
    """Add patient_id and the attribute columns by (dataset, image_id); every predicted image must be known."""
    need = ["dataset", "image_id", "patient_id", *ATTRIBUTE_COLUMNS]
    missing = [c for c in need if c not in manifest.columns]
    if missing:
        raise KeyError(f"manifest lacks columns {missing}")
    m = manifest[need].drop_duplicates(["dataset", "image_id"])
    out = preds.merge(m, on=["dataset", "image_id"], how="left", validate="many_to_one", indicator=True)
    lost = out[out["_merge"] == "left_only"]
    if len(lost):
        raise KeyError(f"{len(lost)} predicted images are not in the manifest, e.g. "
                       f"{lost[['dataset', 'image_id']].head(3).to_dict('records')}")
    return out.drop(columns="_merge")


# --------------------------------------------------------------------------------------------------------------
# per-job evaluation
# --------------------------------------------------------------------------------------------------------------
def evaluate_predictions(preds: pd.DataFrame, manifest: pd.DataFrame, exclusions: pd.DataFrame,
                         splits: dict[str, pd.DataFrame], tasks: dict[str, dict], settings: dict, *,
                         source: str) -> dict[str, pd.DataFrame]:
    """All reliability tables (KINDS) of one predictions table."""
    from retinabench.metrics import calibration as cal
    from retinabench.metrics.coverage import Coverage, label_exclusions
    from retinabench.metrics.fairness import assign_groups, subgroup_analysis
    from retinabench.metrics.thresholds import THRESHOLD_FREE, choose_threshold, metric_names, point_metrics
    from retinabench.stats.bootstrap import cluster_weights, make_rng, percentile_ci, weighted_metrics

    preds = attach_manifest(prepare_predictions(preds, tasks, source), manifest)
    attributes = attributes_of(settings)
    n_bins, rule = settings["n_bins"], settings["threshold_rule"]
    boot = settings["bootstrap"]
    n_boot, level, boot_unit = int(boot["n_boot"]), float(boot["level"]), boot["unit"]
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
        temperature, t_note = cal.fit_temperature(yv, pv)
        rules: list[tuple[str, float | None, str]] = [(AS_WRITTEN, None, "")]
        if binary:
            thr, note = choose_threshold(yv, pv[:, 1], rule)
            rules.append((rule, thr, note))
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
            W = cluster_weights(clusters, n_boot, make_rng(boot["seed"], "cell", *ckeys.values()))
            names = metric_names(len(classes))
            for name, thr, _ in rules:
                pred = decisions(test, proba, name, thr)
                vals = point_metrics(names, y, proba, pred, n_bins=n_bins)
                reps = weighted_metrics(names, y, proba, pred, W, n_bins=n_bins)
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
            # (`ece`: positive-class, binary only; `ece_top_label`: top-label, every task)
            scaled = cal.apply_temperature(proba, temperature)
            pos = (lambda pr: cal.binary_ece(y, pr[:, 1], n_bins)) if binary else (lambda pr: np.nan)
            out["calibration"].append({**ckeys, "temperature": temperature, "n_val": int(len(yv)), "n": n,
                                       "ece_before": pos(proba), "ece_after": pos(scaled),
                                       "ece_top_label_before": cal.top_label_ece(y, proba, n_bins),
                                       "ece_top_label_after": cal.top_label_ece(y, scaled, n_bins),
                                       "nll_before": cal.nll(y, proba), "nll_after": cal.nll(y, scaled), "note": t_note})
            for stage, pr in (("before", proba), ("after", scaled)):
                out["bins"].append(cal.reliability_bins(y, pr, n_bins).assign(
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
                    rng = make_rng(boot["seed"], "subgroup", *ckeys.values(), attr.name)
                    groups, gaps = subgroup_analysis(y, proba, decisions(test, proba, name, thr), patients, labels,
                                                     attr, info, n_boot=n_boot, rng=rng, level=level,
                                                     clusters=clusters)
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
    frames["coverage"] = cov.frame()
    return frames


def table_columns(kind: str) -> list[str]:
    """Fixed columns of each per-job table, so a table keeps its columns even when, e.g., every gap is skipped."""
    from retinabench.metrics.fairness import GAP_FIELDS, GROUP_FIELDS
    cell = [*CELL_KEYS, "split", "threshold"]
    return {
        "metrics": [*cell, "metric", "value", "ci_low", "ci_high", "n", "n_patients", "n_pos", "n_boot", "n_valid",
                    "bootstrap_unit"],
        "thresholds": [*UNIT_KEYS, "threshold", "value", "n_val", "note", "val_accuracy", "val_f1", "val_tpr",
                       "val_fpr", "val_f1_macro"],
        "calibration": [*CELL_KEYS, "temperature", "n_val", "n", "ece_before", "ece_after", "ece_top_label_before",
                        "ece_top_label_after", "nll_before", "nll_after", "note"],
        "bins": [*CELL_KEYS, "calibration", "metric", "bin", "lower", "upper", "n", "mean_prob", "observed"],
        "subgroups": [*cell, *GROUP_FIELDS, "bootstrap_unit"],
        "gaps": [*cell, *GAP_FIELDS, "bootstrap_unit"],
    }[kind]


_BOOL = {"flagged", "skipped", "below_min_size"}
_INT = {"seed", "n", "n_pos", "n_a", "n_b", "n_valid", "n_boot", "n_patients", "n_val", "bin"}
_STR = {*UNIT_KEYS, "dataset", "task", "split", "threshold", "metric", "attribute", "kind", "group", "group_a",
        "group_b", "reason", "note", "calibration", "bootstrap_unit"} - {"seed"}


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


# --------------------------------------------------------------------------------------------------------------
# collected tables: coverage additions, analysis-compatible subgroup metrics, summary scores
# --------------------------------------------------------------------------------------------------------------
def harmonised_coverage(settings: dict, datasets: list[str], tasks: dict[str, dict]) -> pd.DataFrame:
    """Coverage rows for harmonised tasks a dataset does not support, and for groups without a transfer partner."""
    from retinabench.data.derived import harmonised_groups, unsupported_harmonised
    from retinabench.metrics.coverage import COVERAGE_COLUMNS
    rows = []
    for r in unsupported_harmonised(settings["harmonised"], datasets, tasks).to_dict("records"):
        rows.append({"source": "*", "encoder": "*", "protocol": "*", "dataset": r["dataset"], "task": r["task"],
                     "regime": "*", "scope": "harmonised", "status": "not_supported", "n_rows": 0,
                     "reason": r["reason"]})
    for group, names in harmonised_groups(tasks).items():
        if len(names) < 2:
            t = tasks[names[0]]
            rows.append({"source": "transfer", "encoder": "*", "protocol": "*", "dataset": t["dataset"],
                         "task": names[0], "regime": "*", "scope": "transfer", "status": "skipped", "n_rows": 0,
                         "reason": f"harmonised group {group}: no other selected dataset has the task"})
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


def summary_scores(gaps: pd.DataFrame, metrics: pd.DataFrame, tasks: dict[str, dict], settings: dict
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
               .agg(gap=("gap", "mean"), skipped=("skipped", "all"), reason=("reason", "first"),
                    n_seeds=("seed", "nunique")).reset_index())
        for key, cell in agg.groupby(keys, dropna=False, sort=True):
            base = dict(zip(keys, key))
            for score, kind, attrs in (("fairness", "fairness", settings["fairness_score_attributes"]),
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


# --------------------------------------------------------------------------------------------------------------
# paired comparisons
# --------------------------------------------------------------------------------------------------------------
PAIRED_VARIANTS = {"auroc": ("auroc", "auroc_macro"), "auprc": ("auprc", "auprc_macro"),
                   "accuracy": ("accuracy", "accuracy"), "f1": ("f1", "f1_macro"), "ece": ("ece", "ece_top_label")}
MODEL_KEYS = ("source", "encoder", "protocol")


def comparison_pairs(preds: pd.DataFrame, settings: dict, encoder_order: list[str]) -> list[tuple[dict, dict]]:
    """Model pairs (a, b): the configured ``pairs`` or, by default, every encoder pair within each
    (source, protocol), a = the encoder listed first in the config."""
    p = settings["paired"]
    if p["pairs"]:
        out = []
        for i, spec in enumerate(p["pairs"]):
            if set(spec) != {"a", "b"}:
                raise KeyError(f"reliability.paired.pairs[{i}] needs keys a and b, got {sorted(spec)}")
            models = []
            for side in ("a", "b"):
                m = {"source": "frozen", **spec[side]}
                bad = sorted(set(m) - set(MODEL_KEYS))
                lack = [k for k in ("encoder", "protocol") if k not in m]
                if bad or lack:
                    raise KeyError(f"reliability.paired.pairs[{i}].{side}: keys must be encoder, protocol "
                                   f"(+ source), got {sorted(spec[side])}")
                models.append(m)
            out.append((models[0], models[1]))
        return out
    order = {e: i for i, e in enumerate(encoder_order)}
    out = []
    protocols = p["protocols"]
    for (source, protocol), part in preds.groupby(["source", "protocol"], sort=True):
        if protocols is not None and protocol not in protocols:
            continue
        encs = sorted(part["encoder"].unique(), key=lambda e: (order.get(e, len(order)), e))
        for a, b in itertools.combinations(encs, 2):
            out.append(({"source": source, "encoder": a, "protocol": protocol},
                        {"source": source, "encoder": b, "protocol": protocol}))
    return out


def _model_rows(preds: pd.DataFrame, model: dict) -> pd.DataFrame:
    m = np.ones(len(preds), dtype=bool)
    for k, v in model.items():
        m &= (preds[k] == v).to_numpy()
    return preds[m]


SHIFT_FIELD = "shift"   # paired.domain value grouping comparisons by in-domain vs out-of-domain (FOCUS Table 5)


def paired_comparisons(preds: pd.DataFrame, manifest: pd.DataFrame, tasks: dict[str, dict], settings: dict,
                       encoder_order: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(comparison-level, domain-level) paired bootstrap comparisons; delta = model b − model a.

    Per (training task, test task): test rows of both models are aligned by image id (intersection over both
    models' seeds); ``setting`` is ``in-domain`` when the training dataset is the test dataset, else
    ``out-of-domain`` (transfer probes on another dataset; the transfer source's own in-domain rows repeat the frozen
    probes and are not compared twice). Each model's metric is the mean over its seeds; hard-decision metrics use
    each model's ``y_pred`` as written; the resampling units (patients, or images: ``bootstrap.unit``) of the aligned
    rows are drawn with replacement (the same draws for both models); CI = percentile interval of the delta
    replicates; two-sided bootstrap p-value; Benjamini–Hochberg within each metric family. Domain level, for each
    field of ``paired.domain`` (a task registry field such as ``modality``, or ``shift``: in-domain vs
    out-of-domain) and ``all``: mean of the comparison deltas, two-stage bootstrap (comparisons resampled, each with
    its own replicate), BH within each (metric family, domain field).
    """
    from retinabench.metrics.thresholds import point_metrics
    from retinabench.stats.bootstrap import (benjamini_hochberg, bootstrap_p_value, cluster_weights,
                                             hierarchical_mean_replicates, make_rng, percentile_ci,
                                             weighted_metrics)
    p, boot = settings["paired"], settings["bootstrap"]
    n_boot, level, n_bins, boot_unit = int(boot["n_boot"]), float(boot["level"]), settings["n_bins"], boot["unit"]
    fields = [p["domain"]] if isinstance(p["domain"], str) else list(p["domain"])
    preds = preds[(preds["split"] == "test") & (preds["regime"] == p["regime"])]
    own = preds["train_task"] == preds["task"]
    preds = preds[own | (preds["train_dataset"] != preds["dataset"])]
    preds = preds[~((preds["source"] == "transfer") & (preds["train_dataset"] == preds["dataset"]))]
    pairs = comparison_pairs(preds, settings, encoder_order)
    pid = manifest.set_index(["dataset", "image_id"])["patient_id"]
    rows, reps_of = [], {}
    from retinabench.progress import progress
    cells = preds.groupby(["train_task", "task"], sort=True)
    for (train_task, task), tp in progress(cells, "paired bootstrap comparisons", total=cells.ngroups,
                                           unit="(training, test) task cells", note=lambda c: c[0][1]):
        classes = list(tasks[task]["classes"])
        pcols = [f"p_{c}" for c in classes]
        train_dataset = str(tp["train_dataset"].iloc[0])
        setting = "in-domain" if train_dataset == tasks[task]["dataset"] else "out-of-domain"
        for a, b in pairs:
            ra, rb = _model_rows(tp, a), _model_rows(tp, b)
            if ra.empty and rb.empty:
                continue  # neither model has this (training task, test task) cell: not a comparison of this pair
            base = {**{f"{k}_a": a[k] for k in MODEL_KEYS}, **{f"{k}_b": b[k] for k in MODEL_KEYS},
                    "train_dataset": train_dataset, "train_task": train_task, "dataset": tasks[task]["dataset"],
                    "task": task, "setting": setting, "regime": p["regime"], "bootstrap_unit": boot_unit}
            if ra.empty or rb.empty:
                rows.append({**base, "skipped": True, "reason": f"no {p['regime']} test predictions for model "
                                                                f"{'a' if ra.empty else 'b'} on this task"})
                continue
            per_seed = {side: {s: g.set_index("image_id") for s, g in r.groupby("seed")}
                        for side, r in (("a", ra), ("b", rb))}
            id_sets = [set(g.index) for side in per_seed.values() for g in side.values()]
            common = sorted(set.intersection(*id_sets))
            n_unaligned = len(set.union(*id_sets)) - len(common)
            if not common:
                rows.append({**base, "skipped": True, "reason": "no image predicted by both models"})
                continue
            first = next(iter(per_seed["a"].values())).loc[common]
            y = first["y_true"].to_numpy()
            for side in per_seed.values():
                for g in side.values():
                    if not np.array_equal(g.loc[common, "y_true"].to_numpy(), y):
                        raise ValueError(f"paired comparison on {task}: the two models' y_true disagree on aligned "
                                         "images (different label definitions?)")
            patients = pid.reindex(pd.MultiIndex.from_arrays([first["dataset"].to_numpy(), common])).to_numpy()
            if pd.isna(patients).any():
                raise KeyError(f"paired comparison on {task}: {int(pd.isna(patients).sum())} images are not in "
                               "the manifest")
            units = patients.astype(str) if boot_unit == "patient" else np.asarray(common, dtype=str)
            W = cluster_weights(units, n_boot, make_rng(boot["seed"], "paired", train_task, task, len(common)))
            names = [PAIRED_VARIANTS[m][0 if len(classes) == 2 else 1] for m in p["metrics"]]
            values, reps = {}, {}
            for side, seeds in per_seed.items():
                pv, rv = [], []
                for g in seeds.values():
                    proba = g.loc[common, pcols].to_numpy(dtype=np.float64)
                    pred = g.loc[common, "y_pred"].to_numpy(dtype=np.int64)  # the model's own decisions
                    pv.append(point_metrics(names, y, proba, pred, n_bins=n_bins))
                    rv.append(weighted_metrics(names, y, proba, pred, W, n_bins=n_bins))
                values[side] = {m: float(np.mean([d[m] for d in pv])) for m in names}
                reps[side] = {m: np.mean([d[m] for d in rv], axis=0) for m in names}
            for base_name, m in zip(p["metrics"], names):
                d = reps["b"][m] - reps["a"][m]
                lo, hi, n_valid = percentile_ci(d, level)
                key = len(rows)
                reps_of[key] = d
                rows.append({**base, "metric": m, "metric_family": base_name, "value_a": values["a"][m],
                             "value_b": values["b"][m], "delta": values["b"][m] - values["a"][m], "ci_low": lo,
                             "ci_high": hi, "p_value": bootstrap_p_value(d), "n_images": len(common),
                             "n_patients": int(pd.unique(patients).size), "n_unaligned": n_unaligned,
                             "n_seeds_a": len(per_seed["a"]), "n_seeds_b": len(per_seed["b"]), "n_boot": n_boot,
                             "n_valid": n_valid, "skipped": False, "reason": ""})
    comp = pd.DataFrame(rows)
    if comp.empty:
        comp = pd.DataFrame(columns=["metric_family", "p_value", "skipped"])
    comp["p_bh"] = np.nan
    for fam, idx in comp[~comp["skipped"].astype(bool)].groupby("metric_family").groups.items():
        comp.loc[idx, "p_bh"] = benjamini_hochberg(comp.loc[idx, "p_value"].to_numpy())
    # domain level: per grouping field, each of its values and `all`
    drows = []
    done = comp[~comp["skipped"].astype(bool)] if "skipped" in comp else comp.iloc[0:0]
    mk = [f"{k}_{s}" for s in ("a", "b") for k in MODEL_KEYS]
    for field in progress(fields if len(done) else [], "domain-level bootstrap", unit="domain fields"):
        if field == SHIFT_FIELD:
            grouped = done.assign(domain=done["setting"])
        else:
            lacking = sorted({t for t in done["task"] if field not in tasks[t]})
            if lacking:
                raise KeyError(f"reliability.paired.domain {field!r}: task registry entries {lacking} lack it "
                               f"(use a task field such as modality, or {SHIFT_FIELD!r})")
            grouped = done.assign(domain=[str(tasks[t][field]) for t in done["task"]])
        for by_domain in (True, False):
            keys = [*mk, "metric_family"] + (["domain"] if by_domain else [])
            for key, grp in grouped.groupby(keys, sort=True):
                d = dict(zip(keys, key))
                dom = d.pop("domain", "all")
                r = hierarchical_mean_replicates([reps_of[i] for i in grp.index],
                                                 make_rng(boot["seed"], "domain", field, *key), n_boot)
                lo, hi, n_valid = percentile_ci(r, level)
                drows.append({**d, "domain_field": field, "domain": dom, "delta": float(grp["delta"].mean()),
                              "ci_low": lo, "ci_high": hi, "p_value": bootstrap_p_value(r),
                              "n_comparisons": int(len(grp)),
                              "tasks": ",".join(f"{tt}<-{tr}" if tt != tr else tt
                                                for tt, tr in zip(grp["task"], grp["train_task"])),
                              "bootstrap_unit": boot_unit, "n_boot": n_boot, "n_valid": n_valid})
    dom = pd.DataFrame(drows)
    if not dom.empty:
        dom["p_bh"] = np.nan
        for _, idx in dom.groupby(["metric_family", "domain_field"]).groups.items():
            dom.loc[idx, "p_bh"] = benjamini_hochberg(dom.loc[idx, "p_value"].to_numpy())
    return comp, dom


# --------------------------------------------------------------------------------------------------------------
# stages
# --------------------------------------------------------------------------------------------------------------
def _sidecars(job, outputs, *, config, extra=None, inputs=None, seed=None):
    from retinabench.stages import _sidecars as write
    write(job, outputs, config=config, extra=extra, inputs=inputs, seed=seed)


def _read_many(paths, kind) -> pd.DataFrame:
    from retinabench.schemas import read_table
    paths = [paths] if isinstance(paths, str) else list(paths)
    return pd.concat([read_table(p, kind) for p in paths], ignore_index=True)


def _write(df: pd.DataFrame, path: str) -> str:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(path + ".tmp")
    df.to_parquet(tmp, index=False)
    tmp.replace(path)  # atomic: a killed job never leaves a half-written table under the final name
    return path


def stage_transfer(job) -> None:
    import time

    import torch

    from retinabench.features.extract import load_features
    from retinabench.protocols.transfer import run_transfer
    from retinabench.schemas import read_table, write_table
    torch.set_num_threads(max(1, job.threads))
    tasks, p = job.params["tasks"], job.params["transfer"]
    features = {}
    for path in job.input["features"]:
        features[Path(path).stem] = load_features(path)
    splits = {Path(s).stem: read_table(s, "split") for s in job.input["splits"]}
    t0 = time.perf_counter()
    preds = run_transfer(tasks, features, splits, job.wildcards["encoder"], protocols=p["protocols"], seeds=p["seeds"],
                         regimes=p["regimes"], cfg=job.params["probes"])
    write_table(preds, job.output["predictions"], "predictions")
    _sidecars(job, [job.output["predictions"]], config={"tasks": tasks, "transfer": p, "probes": job.params["probes"]},
              seed=p["seeds"], extra={"seconds": round(time.perf_counter() - t0, 2),
                                      "pairs": [f"{s['name']} -> {t['name']}" for s in tasks for t in tasks]})


def stage_reliability(job) -> None:
    from retinabench.schemas import read_table
    settings, tasks = job.params["reliability"], job.params["tasks"]
    preds = read_table(job.input["predictions"], "predictions")
    manifest = _read_many(job.input["manifests"], "manifest")
    exclusions = _read_many(job.input["exclusions"], "exclusions")
    splits = {Path(s).stem: read_table(s, "split") for s in job.input["splits"]}
    tables = evaluate_predictions(preds, manifest, exclusions, splits, tasks, settings, source=job.wildcards["source"])
    paths = [_write(tables[k], job.output[k]) for k in KINDS]
    _sidecars(job, paths, config={"reliability": settings, "tasks": tasks}, seed=settings["bootstrap"]["seed"],
              extra={"rows": {k: int(len(v)) for k, v in tables.items()}})


def stage_reliability_collect(job) -> None:
    settings, tasks = job.params["reliability"], job.params["tasks"]
    tables = {}
    for kind in KINDS:
        frames = [pd.read_parquet(f) for f in job.input[kind]]
        frames = [f for f in frames if not f.empty]
        tables[kind] = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    tables["coverage"] = pd.concat([tables["coverage"], harmonised_coverage(settings, job.params["datasets"], tasks)],
                                   ignore_index=True)
    paths = [_write(tables[k], job.output[k]) for k in KINDS]
    _sidecars(job, paths, config={"reliability": settings})
    sub = analysis_subgroup_metrics(tables["subgroups"])
    scores = summary_scores(tables["gaps"], tables["metrics"], tasks, settings)
    from retinabench.metrics.fairness import FORMULAS
    _sidecars(job, [_write(sub, job.output["subgroup_metrics"])], config={"reliability": settings},
              inputs=[job.output["subgroups"]],
              extra={"note": "analysis-layer format: METRICS columns + attribute + group; own-task models, "
                                     "decisions y_pred as written"})
    _sidecars(job, [_write(scores, job.output["scores"])], config={"reliability": settings},
              inputs=[job.output["gaps"], job.output["metrics"]],
              extra={"formulas": FORMULAS, "fairness_score_attributes": settings["fairness_score_attributes"],
                     "doc": "docs/reliability.md"})


def stage_reliability_paired(job) -> None:
    from retinabench.schemas import read_table
    settings, tasks = job.params["reliability"], job.params["tasks"]
    frames = []
    for source, paths in job.params["sources"].items():
        for path in paths:
            frames.append(prepare_predictions(read_table(path, "predictions"), tasks, source))
    preds = pd.concat(frames, ignore_index=True)
    manifest = _read_many(job.input["manifests"], "manifest")
    comp, dom = paired_comparisons(preds, manifest, tasks, settings, job.params["encoders"])
    paths = [_write(comp, job.output["comparisons"]), _write(dom, job.output["domains"])]
    _sidecars(job, paths, config={"reliability": settings}, seed=settings["bootstrap"]["seed"],
              extra={"n_comparisons": int(len(comp)), "n_domain_rows": int(len(dom))})


def stage_reliability_figure(job) -> None:
    """One reliability figure as a folder of panel groups (figures/reliability.py) plus ``skipped.csv``: the groups
    and rows left out for lack of data, with the reason (collected into the skipped-analyses table)."""
    import shutil

    from retinabench import skipped as skip_table
    from retinabench.figures.reliability import FIGURES
    settings, which = job.params["reliability"], job.params["figure"]
    protocols = job.params["protocols"]
    # default: the linear probe (calibrated probabilities; kNN votes are coarse), else the first protocol run
    default = "linear" if "linear" in protocols else protocols[0]
    sel = {**settings["figures"], "protocol": settings["figures"]["protocol"] or default}
    tables = {k: pd.read_parquet(v) for k, v in job.input.items()}
    out_dir = Path(job.output["dir"])
    if out_dir.exists():
        shutil.rmtree(out_dir)  # a rerun must not keep panel groups that no longer have data
    out_dir.mkdir(parents=True)
    paths, skipped = FIGURES[which](tables, job.params["encoders"], out_dir, sel, groups=job.params.get("groups"))
    rows = [skip_table.record(which, r["reason"], part=r["part"], n=r["n"], source="figure") for r in skipped]
    paths.append(skip_table.write(rows, out_dir / "skipped.csv"))
    _sidecars(job, paths, config={"reliability": {"figures": sel}},
              extra={"figure": which, "panel_groups": sorted(Path(p).stem for p in paths if p.endswith(".png"))})


RELIABILITY_STAGES: dict[str, Callable] = {
    "transfer": stage_transfer, "reliability": stage_reliability, "reliability_collect": stage_reliability_collect,
    "reliability_paired": stage_reliability_paired, "reliability_figure": stage_reliability_figure,
}
