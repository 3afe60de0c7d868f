"""Fine-tuned − base deltas of MLLM LoRA adapters, in-domain and out-of-domain (FOCUS Table 5).

Pairing (:func:`pair_results`): every adapter result (predictions tagged with ``train_dataset`` / ``train_task``
/ ``adapter`` by :func:`retinabench.protocols.mllm.adapter_predictions`) is paired with the base model's result
of the same model family (``encoder``), protocol, regime, test dataset and test task; the two must hold the
identical test image ids (else an error: they were not run on the same split), and the adapter's training task
must be the test task or share its harmonised id. In-domain = tested on its own source dataset; out-of-domain
= any other dataset supporting the task. An adapter result without its base result is recorded as unpaired
(printed with the reason), never silently dropped.

Comparison level (:func:`adapter_deltas`): deltas adapter − base for AUROC, AUPRC, accuracy, F1 and ECE (for ECE
lower is better: ``higher_is_better`` says so per row) with a paired bootstrap aligned by image id — the unit
resampled is the patient (default) or the image (FOCUS) — through the reliability layer's paired-comparison
code (:func:`retinabench.reliability.paired.paired_metric_replicates`; hard decisions from the parsed answers).
Two variants: ``invalid_wrong`` (primary: every test image, an invalid answer counts as wrong) and
``valid_both`` (only images both models answered validly; the same bootstrap draws restricted to them), with the
counts; the change of the invalid-answer rate is a row of its own (metric ``invalid_rate``). Benjamini–Hochberg
within each metric family (and variant).

Domain level: in-domain vs out-of-domain (per model, and ``all`` models) summaries are the mean of the
comparison-level deltas with a two-stage bootstrap over comparisons
(:func:`retinabench.reliability.paired.summarise_comparisons`), the number of comparisons behind each row, BH
within each metric family. :func:`table5` lays them out like FOCUS Table 5; :func:`table5_figure` draws it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from retinabench.metrics.table import display_name, higher_is_better

DELTA_METRICS = ("auroc", "auprc", "accuracy", "f1", "ece")   # metric families (binary yes/no tasks)
VARIANTS = ("invalid_wrong", "valid_both")
UNITS = ("patient", "image")
IN_DOMAIN, OUT_OF_DOMAIN = "in-domain", "out-of-domain"
PAIR_KEYS = ["encoder", "protocol", "regime", "dataset", "task"]
ADAPTER_KEYS = ["train_dataset", "train_task", "adapter"]


def _is_adapter(df: pd.DataFrame) -> np.ndarray:
    if "adapter" not in df:
        return np.zeros(len(df), dtype=bool)
    return df["adapter"].notna().to_numpy() & (df["adapter"].astype(str) != "").to_numpy()


def _compatible(train_task: str, task: str, tasks: dict[str, dict]) -> bool:
    if train_task == task:
        return True
    for t in (train_task, task):
        if t not in tasks:
            raise KeyError(f"adapter deltas: task {t!r} has no registry entry")
    h = tasks[train_task].get("harmonised")
    return h is not None and h == tasks[task].get("harmonised")


def _base_named(adapted: pd.DataFrame) -> pd.DataFrame:
    """Adapter rows under the base protocol names they pair with (``mllm_lora`` -> ``mllm``), the adapter's own
    name kept in ``adapter_protocol``."""
    from retinabench.protocols.mllm import base_protocol
    if "adapter_protocol" in adapted:
        return adapted
    return adapted.assign(adapter_protocol=adapted["protocol"],
                          protocol=adapted["protocol"].map(base_protocol))


def pair_results(base: pd.DataFrame, adapted: pd.DataFrame, tasks: dict[str, dict]
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pairs, unpaired): one row per adapter result (test split) with its base result's key and the domain;
    ``unpaired`` lists adapter results without a base result, with the reason."""
    adapted = _base_named(adapted)
    if _is_adapter(base).any():
        raise ValueError("adapter deltas: the base predictions contain adapter rows (column 'adapter' set)")
    missing = [c for c in ADAPTER_KEYS if c not in adapted]
    if missing or not _is_adapter(adapted).all():
        raise ValueError(f"adapter deltas: adapter predictions need {ADAPTER_KEYS} set on every row "
                         f"(missing columns {missing}); tag them with protocols.mllm.adapter_predictions")
    b = base[base["split"] == "test"]
    a = adapted[adapted["split"] == "test"]
    ids_of = {k: set(g["image_id"]) for k, g in b.groupby(PAIR_KEYS, sort=True)}
    rows, unpaired = [], []
    for key, g in a.groupby(PAIR_KEYS + ADAPTER_KEYS, sort=True):
        d = dict(zip(PAIR_KEYS + ADAPTER_KEYS, key))
        where = (f"adapter {d['adapter'][:12]} ({d['encoder']} on {d['train_dataset']}/{d['train_task']}) tested on "
                 f"{d['dataset']}/{d['task']} [{d['protocol']}, {d['regime']}]")
        if not _compatible(d["train_task"], d["task"], tasks):
            raise ValueError(f"{where}: trained on task {d['train_task']!r}, which is neither the test task nor "
                             "shares its harmonised id")
        bkey = tuple(d[k] for k in PAIR_KEYS)
        if bkey not in ids_of:
            unpaired.append({**d, "n_images": g["image_id"].nunique(), "reason": "no base-model result on this test "
                             "set (same encoder, protocol, regime, dataset, task)"})
            continue
        ia, ib = set(g["image_id"]), ids_of[bkey]
        if ia != ib:
            raise ValueError(f"{where}: the adapter and the base model were not run on the same test images "
                             f"({len(ia - ib)} only in the adapter's, {len(ib - ia)} only in the base model's)")
        rows.append({**d, "domain": IN_DOMAIN if d["dataset"] == d["train_dataset"] else OUT_OF_DOMAIN,
                     "n_images": len(ia)})
    up = pd.DataFrame(unpaired, columns=[*PAIR_KEYS, *ADAPTER_KEYS, "n_images", "reason"])
    for r in up.to_dict("records"):
        print(f"adapter deltas: unpaired {r['encoder']}/{r['protocol']} adapter {str(r['adapter'])[:12]} on "
              f"{r['dataset']}/{r['task']}: {r['reason']}")
    return pd.DataFrame(rows, columns=[*PAIR_KEYS, *ADAPTER_KEYS, "domain", "n_images"]), up


def adapter_deltas(base: pd.DataFrame, adapted: pd.DataFrame, manifest: pd.DataFrame, tasks: dict[str, dict], *,
                   metrics: Sequence[str] = DELTA_METRICS, unit: str = "patient", n_boot: int = 1000, seed: int = 0,
                   level: float = 0.95, n_bins: int = 10, edges: str = "right_closed") -> dict[str, pd.DataFrame]:
    """``{"comparisons", "domains", "pairs", "unpaired"}`` tables (see the module docstring)."""
    from retinabench.reliability.paired import (bh_within_families, paired_metric_replicates,
                                                summarise_comparisons)
    from retinabench.stats.bootstrap import (bootstrap_p_value, cluster_weights, make_rng, percentile_ci,
                                             w_mean)
    if unit not in UNITS:
        raise ValueError(f"adapter deltas: unit must be one of {UNITS}, got {unit!r}")
    bad = sorted(set(metrics) - set(DELTA_METRICS))
    if bad:
        raise KeyError(f"adapter deltas: unknown metrics {bad}; known: {DELTA_METRICS}")
    if n_boot < 1000:
        raise ValueError(f"adapter deltas: n_boot must be >= 1000, got {n_boot}")
    boot = {"n_boot": int(n_boot), "seed": int(seed), "level": float(level)}
    adapted = _base_named(adapted)
    pairs, unpaired = pair_results(base, adapted, tasks)
    pid = manifest.drop_duplicates(["dataset", "image_id"]).set_index(["dataset", "image_id"])["patient_id"]
    b_test, a_test = base[base["split"] == "test"], adapted[adapted["split"] == "test"]
    rows, reps_of = [], {}
    for pr in pairs.to_dict("records"):
        task = tasks[pr["task"]]
        classes = list(task["classes"])
        if len(classes) != 2:
            raise ValueError(f"adapter deltas: task {pr['task']!r} is not binary (yes/no prompting)")
        pcols = [f"p_{c}" for c in classes]
        sel_b = np.ones(len(b_test), dtype=bool)
        sel_a = np.ones(len(a_test), dtype=bool)
        for k in PAIR_KEYS:
            sel_b &= (b_test[k] == pr[k]).to_numpy()
            sel_a &= (a_test[k] == pr[k]).to_numpy()
        for k in ADAPTER_KEYS:
            sel_a &= (a_test[k] == pr[k]).to_numpy()
        per_seed = {"a": {s: g.set_index("image_id") for s, g in b_test[sel_b].groupby("seed")},
                    "b": {s: g.set_index("image_id") for s, g in a_test[sel_a].groupby("seed")}}
        for side in per_seed.values():
            for s, g in side.items():
                if g.index.duplicated().any():
                    raise ValueError(f"adapter deltas: duplicate image ids in {pr['dataset']}/{pr['task']} (seed {s})")
        common = sorted(next(iter(per_seed["a"].values())).index)
        first = next(iter(per_seed["a"].values())).loc[common]
        y = first["y_true"].to_numpy(dtype=np.int64)
        for side in per_seed.values():
            for g in side.values():
                if not np.array_equal(g.loc[common, "y_true"].to_numpy(), y):
                    raise ValueError(f"adapter deltas on {pr['dataset']}/{pr['task']}: base and adapter y_true "
                                     "disagree on aligned images")
        if unit == "patient":
            patients = pid.reindex(pd.MultiIndex.from_arrays([np.full(len(common), pr["dataset"]), common]))
            if patients.isna().any():
                raise KeyError(f"adapter deltas on {pr['dataset']}/{pr['task']}: {int(patients.isna().sum())} "
                               "test images are not in the manifest")
            clusters = patients.astype(str).to_numpy()
        else:
            clusters = np.asarray(common, dtype=object)
        # draws keyed by what the comparison is, not by the adapter's digest: the same config gives the same CIs
        key = [pr[k] for k in PAIR_KEYS + ["train_dataset", "train_task"]]
        W = cluster_weights(clusters, n_boot, make_rng(seed, "adapter", *key, unit))
        invalid = {side: np.mean([(g.loc[common, "y_pred"].to_numpy() == -1) for g in seeds.values()], axis=0)
                   for side, seeds in per_seed.items()}
        valid_both = (invalid["a"] == 0) & (invalid["b"] == 0)
        base_row = {**pr, "unit": unit, "n_images": len(common), "n_clusters": int(pd.unique(clusters).size),
                    "n_invalid_base": int(round(invalid["a"].sum())),
                    "n_invalid_adapter": int(round(invalid["b"].sum())), "n_valid_both": int(valid_both.sum()),
                    "n_boot": n_boot}
        for variant in VARIANTS:
            keep = np.ones(len(common), dtype=bool) if variant == "invalid_wrong" else valid_both
            ids = [i for i, k in zip(common, keep) if k]
            if not ids:
                for m in metrics:
                    rows.append({**base_row, "variant": variant, "metric": m, "metric_family": m,
                                 "n_rows": 0, "skipped": True, "reason": "no image answered validly by both"})
                continue
            values, reps = paired_metric_replicates(per_seed, ids, y[keep], pcols, list(metrics), W[:, keep],
                                                    n_bins=n_bins, edges=edges)
            for m in metrics:
                d = reps["b"][m] - reps["a"][m]
                lo, hi, n_valid = percentile_ci(d, level)
                reps_of[len(rows)] = d
                rows.append({**base_row, "variant": variant, "metric": m, "metric_family": m, "n_rows": len(ids),
                             "value_base": values["a"][m], "value_adapter": values["b"][m],
                             "delta": values["b"][m] - values["a"][m], "ci_low": lo, "ci_high": hi,
                             "p_value": bootstrap_p_value(d), "n_valid": n_valid, "skipped": False, "reason": ""})
        d = w_mean(invalid["b"], W) - w_mean(invalid["a"], W)
        lo, hi, n_valid = percentile_ci(d, level)
        reps_of[len(rows)] = d
        rows.append({**base_row, "variant": "all_rows", "metric": "invalid_rate", "metric_family": "invalid_rate",
                     "n_rows": len(common), "value_base": float(invalid["a"].mean()),
                     "value_adapter": float(invalid["b"].mean()), "delta": float(invalid["b"].mean()
                                                                                 - invalid["a"].mean()),
                     "ci_low": lo, "ci_high": hi, "p_value": bootstrap_p_value(d), "n_valid": n_valid,
                     "skipped": False, "reason": ""})
    comp_cols = [*PAIR_KEYS, *ADAPTER_KEYS, "domain", "variant", "metric", "metric_family", "higher_is_better",
                 "value_base", "value_adapter", "delta", "ci_low", "ci_high", "p_value", "p_bh", "unit", "n_images",
                 "n_clusters", "n_rows", "n_valid_both", "n_invalid_base", "n_invalid_adapter", "n_boot", "n_valid",
                 "skipped", "reason"]
    comp = pd.DataFrame(rows)
    if comp.empty:
        comp = pd.DataFrame(columns=comp_cols)
    comp["higher_is_better"] = comp["metric"].map(higher_is_better).astype(bool)
    comp["bh_family"] = comp["variant"].astype(str) + ":" + comp["metric_family"].astype(str)
    bh_within_families(comp, family="bh_family")
    comp = comp.drop(columns="bh_family").reindex(columns=comp_cols)
    done = comp[~comp["skipped"].astype(bool)]
    dom_cols = ["encoder", "protocol", "regime", "variant", "metric_family", "domain", "higher_is_better", "delta",
                "ci_low", "ci_high", "p_value", "p_bh", "n_comparisons", "comparisons", "n_boot", "n_valid"]
    parts = []
    if len(done):
        labelled = done.assign(task=[f"{r['train_dataset']}->{r['dataset']}/{r['task']}"
                                     for r in done.to_dict("records")])
        keys = ["protocol", "regime", "variant", "metric_family", "domain"]
        parts.append(summarise_comparisons(labelled, reps_of, ["encoder", *keys], boot))
        overall = summarise_comparisons(labelled, reps_of, keys, boot)
        overall.insert(0, "encoder", "all")
        parts.append(overall)
    dom = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=dom_cols)
    if len(dom):
        dom["higher_is_better"] = dom["metric_family"].map(higher_is_better).astype(bool)
        dom["bh_family"] = dom["variant"].astype(str) + ":" + dom["metric_family"].astype(str)
        bh_within_families(dom, family="bh_family")
    dom = dom.reindex(columns=dom_cols)
    return {"comparisons": comp, "domains": dom, "pairs": pairs, "unpaired": unpaired}


# --- Table 5 --------------------------------------------------------------------------------------------------
TABLE5_METRICS = ("auroc", "auprc", "accuracy", "f1", "ece", "invalid_rate")
# FOCUS Table 5's column headers: Δ and the metric's display name; the ECE header says its direction.
_LABELS = {m: f"Δ{display_name(m)}" for m in TABLE5_METRICS} | {"ece": "ΔECE (lower better)"}


def _stars(q: float) -> str:
    if not np.isfinite(q):
        return ""
    return "***" if q < 0.001 else "**" if q < 0.01 else "*" if q < 0.05 else ""


def table5(domains: pd.DataFrame, *, variant: str = "invalid_wrong", protocol: str | None = None,
           metrics: Sequence[str] = TABLE5_METRICS, digits: int = 3) -> pd.DataFrame:
    """FOCUS Table 5's shape: one row per model (then ``all``) × domain (in-domain, out-of-domain), one column
    per metric ``Δ [lo, hi]`` with BH stars (q < 0.05 *, 0.01 **, 0.001 ***), and the number of comparisons
    behind the row (``n``). ``variant`` picks the invalid-answer handling of the hard-decision metrics (the
    invalid-rate change is the same rows either way)."""
    d = domains[(domains["variant"].isin([variant, "all_rows"]))]
    if protocol is not None:
        d = d[d["protocol"] == protocol]
    protocols = sorted(d["protocol"].unique())
    if len(protocols) > 1:
        raise ValueError(f"table5: several protocols {protocols}; pick one with protocol=")
    rows = []
    encs = [e for e in dict.fromkeys(d["encoder"]) if e != "all"] + (["all"] if (d["encoder"] == "all").any() else [])
    for enc in encs:
        for domain in (IN_DOMAIN, OUT_OF_DOMAIN):
            g = d[(d["encoder"] == enc) & (d["domain"] == domain)].set_index("metric_family")
            if g.empty:
                continue
            row = {"model": enc, "domain": domain}
            ns = set()
            for m in metrics:
                if m not in g.index:
                    row[_LABELS[m]] = ""
                    continue
                r = g.loc[m]
                ns.add(int(r["n_comparisons"]))
                row[_LABELS[m]] = (f"{r['delta']:+.{digits}f} [{r['ci_low']:+.{digits}f}, {r['ci_high']:+.{digits}f}]"
                                   f"{_stars(r['p_bh'])}")
            if len(ns) > 1:
                raise ValueError(f"table5: {enc}/{domain} rows rest on different numbers of comparisons {sorted(ns)}")
            row["n"] = ns.pop() if ns else 0
            rows.append(row)
    return pd.DataFrame(rows, columns=["model", "domain", *[_LABELS[m] for m in metrics], "n"])


def table5_figure(domains: pd.DataFrame, png, *, variant: str = "invalid_wrong", protocol: str | None = None,
                  metrics: Sequence[str] = TABLE5_METRICS) -> list[str]:
    """Table 5 as a figure: one panel per metric, one row per model × domain (Table 5's rows, top to bottom),
    the delta with its CI (filled marker: BH q < 0.05), a zero line, and ``n=`` comparisons at each row."""
    import matplotlib.pyplot as plt

    from retinabench.figures.style import FONT, figsize, save, suptitle
    tab = table5(domains, variant=variant, protocol=protocol, metrics=metrics)
    d = domains[domains["variant"].isin([variant, "all_rows"])]
    if protocol is not None:
        d = d[d["protocol"] == protocol]
    labels = [f"{r['model']} · {'ID' if r['domain'] == IN_DOMAIN else 'OOD'}" for r in tab.to_dict("records")]
    n_rows = max(1, len(tab))
    # double column (180 mm), 7 mm per Table-5 row; three panels per line so tick labels stay legible at 7 pt
    per_line = 3
    lines = -(-len(metrics) // per_line)
    fig, axes = plt.subplots(lines, per_line, figsize=figsize(lines * (14 + 6 * n_rows) + 12), sharey=True,
                             squeeze=False)
    ys = np.arange(len(tab))[::-1]
    colors = {IN_DOMAIN: "#4C72B0", OUT_OF_DOMAIN: "#DD8452"}
    for k, ax in enumerate(axes.flat):
        if k >= len(metrics):
            ax.set_visible(False)
            continue
        m = metrics[k]
        for y, r in zip(ys, tab.to_dict("records")):
            g = d[(d["encoder"] == r["model"]) & (d["domain"] == r["domain"]) & (d["metric_family"] == m)]
            if g.empty:
                continue
            g = g.iloc[0]
            sig = np.isfinite(g["p_bh"]) and g["p_bh"] < 0.05
            ax.errorbar([g["delta"]], [y], xerr=[[g["delta"] - g["ci_low"]], [g["ci_high"] - g["delta"]]],
                        fmt="o", ms=3, color=colors[r["domain"]], mfc=colors[r["domain"]] if sig else "white",
                        capsize=2, lw=0.8)
        ax.axvline(0.0, color="#888888", lw=0.6, ls="--")
        ax.set_title(_LABELS[m], fontsize=FONT["title"])
        ax.set_yticks(ys)
        if k % per_line == 0:
            ax.set_yticklabels([f"{lab} (n={n})" for lab, n in zip(labels, tab["n"])] if len(tab) else [])
        ax.set_ylim(-0.7, len(tab) - 0.3)
        ax.locator_params(axis="x", nbins=4)
    fig.supxlabel("adapter − base (95% CI; n = comparisons behind the row)", fontsize=FONT["base"])
    suptitle(fig, f"LoRA fine-tuned − base MLLM ({variant.replace('_', ' ')}); filled marker: BH q < 0.05")
    fig.set_layout_engine("constrained")
    out = save(fig, png)
    plt.close(fig)
    return out
