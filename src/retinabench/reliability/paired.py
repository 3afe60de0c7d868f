"""Paired bootstrap comparisons of models on the same images, Benjamini-Hochberg within each metric family and
grouping (FOCUS Table 5: in-domain vs out-of-domain summaries)."""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from retinabench.metrics.table import reliability_name
from retinabench.settings.reliability import ReliabilitySettings

MODEL_KEYS = ("source", "encoder", "protocol")


def comparison_pairs(preds: pd.DataFrame, settings: ReliabilitySettings,
                     encoder_order: list[str]) -> list[tuple[dict, dict]]:
    """Model pairs (a, b) as {source, encoder, protocol}: the configured ``paired.pairs`` or, by default, every
    encoder pair within each (source, protocol), a = the encoder listed first in the config."""
    p = settings.paired
    if p.pairs:
        return [(pair.a.plain(include=set(MODEL_KEYS)), pair.b.plain(include=set(MODEL_KEYS))) for pair in p.pairs]
    order = {e: i for i, e in enumerate(encoder_order)}
    out = []
    protocols = p.protocols
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


def paired_comparisons(preds: pd.DataFrame, manifest: pd.DataFrame, tasks: dict[str, dict],
                       settings: ReliabilitySettings, encoder_order: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(comparison-level, domain-level) paired bootstrap comparisons; delta = model b − model a.

    Per (training task, test task): test rows of both models are aligned by image id (intersection over both
    models' seeds); ``setting`` is ``in-domain`` when the training dataset is the test dataset, else
    ``out-of-domain`` (transfer probes on another dataset; the transfer source's own in-domain rows repeat the frozen
    probes and are not compared twice). Each model's metric is the mean over its seeds; hard-decision metrics use
    each model's ``y_pred`` as written; the resampling units (patients, or images: ``bootstrap.unit``) of the aligned
    rows are drawn with replacement (the same draws for both models); CI = percentile interval of the delta
    replicates; two-sided bootstrap p-value; Benjamini–Hochberg within each metric family. Domain level, for each
    field of ``paired.domain`` (a task registry field such as ``modality``, or ``shift``: in-domain vs
    out-of-domain) and ``all``: mean of the comparison deltas, bootstrap by ``bootstrap.summary`` (two_stage:
    comparisons resampled, each with its own replicate; one_stage: the point deltas resampled, FOCUS), BH within
    each (metric family, domain field).
    """
    from retinabench.stats.bootstrap import bootstrap_p_value, cluster_weights, make_rng, percentile_ci
    p, boot = settings.paired, settings.bootstrap
    n_boot, level, n_bins, boot_unit = boot.n_boot, boot.level, settings.n_bins, boot.unit
    edges = settings.ece_bin_edges
    fields = list(p.domain)
    preds = preds[(preds["split"] == "test") & (preds["regime"] == p.regime)]
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
                    "task": task, "setting": setting, "regime": p.regime, "bootstrap_unit": boot_unit}
            if ra.empty or rb.empty:
                rows.append({**base, "skipped": True, "reason": f"no {p.regime} test predictions for model "
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
            W = cluster_weights(units, n_boot, make_rng(boot.seed, "paired", train_task, task, len(common)))
            names = [reliability_name(m, len(classes)) for m in p.metrics]  # p.metrics: metric families
            values, reps = paired_metric_replicates(per_seed, common, y, pcols, names, W, n_bins=n_bins,
                                                    edges=edges)
            for base_name, m in zip(p.metrics, names):
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
    bh_within_families(comp)
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
        labels = pd.Series([f"{tt}<-{tr}" if tt != tr else tt for tt, tr in zip(grouped["task"], grouped["train_task"])],
                           index=grouped.index)
        for by_domain in (True, False):
            keys = [*mk, "metric_family"] + (["domain"] if by_domain else [])
            part = summarise_comparisons(grouped, reps_of, keys, boot.plain(), rng_key=("domain", field), labels=labels,
                                         label_name="tasks")
            if part.empty:
                continue
            if not by_domain:
                part["domain"] = "all"
            part.insert(len(mk) + 1, "domain_field", field)
            part.insert(len(mk) + 2, "domain", part.pop("domain"))
            part.insert(part.columns.get_loc("n_boot"), "bootstrap_unit", boot_unit)
            drows.extend(part.to_dict("records"))
    dom = pd.DataFrame(drows)
    if not dom.empty:
        bh_within_families(dom, ["metric_family", "domain_field"])
    return comp, dom


def paired_metric_replicates(per_seed: dict[str, dict], common: list, y: np.ndarray, pcols: list[str],
                             names: list[str], W: np.ndarray, *, n_bins: int = 10,
                             edges: str = "right_closed") -> tuple[dict, dict]:
    """Point values and bootstrap replicates of ``names`` for each side of a paired comparison, aligned on the
    ``common`` image ids. ``per_seed``: side -> seed -> predictions indexed by image id. A side's value is the mean
    over its seeds, its replicates likewise; one weight matrix ``W`` for both sides (the same draws). Hard
    decisions are each model's ``y_pred`` as written (a generated answer's invalid code, -1, is wrong)."""
    from retinabench.metrics.thresholds import point_metrics
    from retinabench.stats.bootstrap import weighted_metrics
    values, reps = {}, {}
    for side, seeds in per_seed.items():
        pv, rv = [], []
        for g in seeds.values():
            proba = g.loc[common, pcols].to_numpy(dtype=np.float64)
            pred = g.loc[common, "y_pred"].to_numpy(dtype=np.int64)
            pv.append(point_metrics(names, y, proba, pred, n_bins=n_bins, edges=edges))
            rv.append(weighted_metrics(names, y, proba, pred, W, n_bins=n_bins, edges=edges))
        values[side] = {m: float(np.mean([d[m] for d in pv])) for m in names}
        reps[side] = {m: np.mean([d[m] for d in rv], axis=0) for m in names}
    return values, reps


def bh_within_families(df: pd.DataFrame, family: str | list[str] = "metric_family") -> pd.DataFrame:
    """Benjamini–Hochberg q-values (``p_bh``, set in place) within each ``family`` group of the rows not
    skipped; skipped rows get NaN."""
    from retinabench.stats.bootstrap import benjamini_hochberg
    df["p_bh"] = np.nan
    rows = df[~df["skipped"].astype(bool)] if "skipped" in df else df
    for _, idx in rows.groupby(family).groups.items():
        df.loc[idx, "p_bh"] = benjamini_hochberg(df.loc[idx, "p_value"].to_numpy())
    return df


def summarise_comparisons(done: pd.DataFrame, reps_of: dict, group_cols: list[str], boot: dict, *,
                          rng_key: tuple = ("domain",), labels: pd.Series | None = None,
                          label_name: str = "comparisons") -> pd.DataFrame:
    """Summary rows over comparison rows (``done``, indexed like ``reps_of``): per group, the mean of the
    comparison deltas with a bootstrap CI and p-value, and the comparisons behind it (their count, and their
    ``labels`` joined, default the task). ``boot["summary"]`` (``reliability.bootstrap.summary``): ``two_stage``
    (the default: comparisons resampled, each with its own image-level replicate) or ``one_stage`` (FOCUS: the
    comparisons' point deltas resampled, :func:`~retinabench.stats.bootstrap.one_stage_mean_replicates`)."""
    from retinabench.stats.bootstrap import (bootstrap_p_value, hierarchical_mean_replicates, make_rng,
                                             one_stage_mean_replicates, percentile_ci)
    n_boot, level = int(boot["n_boot"]), float(boot["level"])
    summary = boot.get("summary", "two_stage")
    if summary not in ("two_stage", "one_stage"):
        raise ValueError(f"bootstrap summary must be two_stage or one_stage, got {summary!r}")
    labels = done["task"].astype(str) if labels is None else labels
    rows = []
    for key, grp in done.groupby(group_cols, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        rng = make_rng(boot["seed"], *rng_key, *key)
        r = (one_stage_mean_replicates(grp["delta"].to_numpy(dtype=np.float64), rng, n_boot)
             if summary == "one_stage" else hierarchical_mean_replicates([reps_of[i] for i in grp.index], rng, n_boot))
        lo, hi, n_valid = percentile_ci(r, level)
        rows.append({**dict(zip(group_cols, key)), "delta": float(grp["delta"].mean()), "ci_low": lo,
                     "ci_high": hi, "p_value": bootstrap_p_value(r), "n_comparisons": int(len(grp)),
                     label_name: ",".join(labels.loc[grp.index]), "n_boot": n_boot, "n_valid": n_valid})
    return pd.DataFrame(rows)
