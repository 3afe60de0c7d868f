"""FOCUS's paper tables from the collected reliability tables: Table 3 (model type x method, per task and overall,
with Fairness, Quality and Shift), Table 4 (per dataset: general vs ophthalmic models), Table 10 (post-SFT MLLMs
in-domain vs out-of-domain), and the data each FOCUS figure draws (retinabench.figures.focus draws them).

FOCUS's code (dsrestrepo/FOCUS-Retinal-Benchmark) works on one row per (dataset, task, model, method) of its
``aggregated_metrics.csv``: :func:`focus_rows` builds the same rows from ``reliability/metrics.parquet`` and
``gaps.parquet`` (models trained and tested on the same task, the protocols' own decisions, mean over seeds).
Group membership is :func:`model_groups`, one mapping from the encoder registry (``interfaces``,
``method_group``, ``domain``, ``params_m``). Formulas: docs/reliability.md, "FOCUS tables and figures".
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from retinabench.reliability.evaluation import AS_WRITTEN

FAMILIES = ("VM", "VLM", "MLLM")
# encoder registry `domain` -> FOCUS's general vs specialised split (its model types *_general vs *_ophthalmo /
# mllm_medical). medical (MedSigLIP, MedGemma), pathology and radiology are their own group: FOCUS files
# MedSigLIP under general VLMs and MedGemma under medical MLLMs.
DOMAIN_GROUPS = {"natural": "general", "cfp": "ophthalmic", "oct": "ophthalmic", "cfp+oct": "ophthalmic",
                 "medical": "medical", "pathology": "medical", "radiology": "medical", "none": "untrained"}
DOMAIN_ORDER = ("general", "ophthalmic", "medical", "untrained")
KEYS = ["source", "encoder", "protocol", "dataset", "task"]
# the columns of a FOCUS row and the metric names each takes, first found (multi-class: macro / top-label)
ROW_METRICS = {"accuracy": ("accuracy",), "auroc": ("auroc", "auroc_macro"), "auprc": ("auprc", "auprc_macro"),
               "ece": ("ece", "ece_top_label")}
FAIRNESS_GAPS = ("equalized_odds", "accuracy", "auroc")   # FOCUS: columns *_equalized_odds_gap, *_accuracy_gap, *_auc_gap
QUALITY_GAPS = ("accuracy", "auroc", "auprc", "f1", "ece")  # FOCUS: image_quality_{accuracy,auc,auprc,f1,ece}_gap
SUMMARY = ["accuracy", "auroc", "auprc", "ece", "fairness", "quality", "shift"]
FORMULAS = {
    "fairness": "1 - mean over gap columns (attribute x {equalized_odds, accuracy, auroc}, attributes = "
                "fairness_score_attributes) of the column's mean absolute gap over the group's rows; NaN without any",
    "quality": "1 - mean over gap columns (quality stratum attribute x {accuracy, auroc, auprc, f1, ece}) of the "
               "column's mean absolute gap over the group's rows; NaN without any",
    "shift": "1 - (max - min) over the group's datasets of the dataset's mean AUROC; NaN with fewer than 2 datasets",
}


def model_groups(encoders: dict[str, dict]) -> pd.DataFrame:
    """One row per encoder: ``family`` (MLLM: serves the ``mllm`` interface; VLM: an image-text dual encoder,
    ``method_group`` image_text or the ``zeroshot`` interface; VM otherwise), ``domain_group``
    (:data:`DOMAIN_GROUPS`), ``model_type`` and ``params_b`` (registry ``params_m`` / 1000)."""
    rows = []
    for name, e in encoders.items():
        interfaces = e.get("interfaces") or ["features"]
        family = ("MLLM" if "mllm" in interfaces else
                  "VLM" if e.get("method_group") == "image_text" or "zeroshot" in interfaces else "VM")
        if e.get("domain") not in DOMAIN_GROUPS:
            raise KeyError(f"encoder {name!r}: domain {e.get('domain')!r} has no FOCUS group ({sorted(DOMAIN_GROUPS)})")
        dom = DOMAIN_GROUPS[e["domain"]]
        params = e.get("params_m")
        rows.append({"encoder": name, "family": family, "domain_group": dom, "model_type": f"{dom} {family}",
                     "params_b": float(params) / 1000.0 if params is not None else np.nan})
    return pd.DataFrame(rows, columns=["encoder", "family", "domain_group", "model_type", "params_b"])


def _family_name(metric: str) -> str:
    from retinabench.metrics.table import metric_family
    try:
        return metric_family(metric)
    except (KeyError, ValueError):
        return metric


def focus_rows(metrics: pd.DataFrame, gaps: pd.DataFrame, tasks: dict[str, dict], *, regime: str,
               fairness_attributes: list[str]) -> pd.DataFrame:
    """FOCUS's aggregated rows: one per (source, encoder, protocol, dataset, task) of models trained and tested on
    the task (no transfer, no LoRA adapters), regime ``regime``: accuracy (the protocol's ``y_pred``), AUROC,
    AUPRC, ECE, ``task_group`` (the task's harmonised id, else its name) and one column per absolute gap
    (``fairness:<attribute>:<metric>``, ``quality:<attribute>:<metric>``), each the mean over seeds."""
    m = metrics[(metrics["train_task"] == metrics["task"]) & ~metrics["source"].isin(["transfer", "mllm_lora"])
                & (metrics["regime"] == regime) & metrics["threshold"].isin(["none", AS_WRITTEN])]
    if m.empty:
        raise ValueError(f"FOCUS tables: no own-task test metrics of regime {regime!r} in the reliability metrics")
    wide = m.pivot_table(index=KEYS, columns="metric", values="value", aggfunc="mean")
    out = pd.DataFrame(index=wide.index)
    for col, names in ROW_METRICS.items():
        out[col] = np.nan
        for name in reversed(names):
            if name in wide.columns:
                out[col] = wide[name].where(wide[name].notna(), out[col])
    g = gaps[(gaps["threshold"] == AS_WRITTEN) & (gaps["train_task"] == gaps["task"]) & (gaps["regime"] == regime)
             & ~gaps["skipped"].fillna(False).astype(bool)] if len(gaps) else gaps
    if len(g):
        g = g.assign(family=g["metric"].map(_family_name))
        fair = g[(g["kind"] == "fairness") & g["attribute"].isin(fairness_attributes) & g["family"].isin(FAIRNESS_GAPS)]
        qual = g[(g["kind"] == "quality") & g["family"].isin(QUALITY_GAPS)]
        for kind, part in (("fairness", fair), ("quality", qual)):
            if part.empty:
                continue
            part = part.assign(column=kind + ":" + part["attribute"].astype(str) + ":" + part["family"])
            out = out.join(part.pivot_table(index=KEYS, columns="column", values="abs_gap", aggfunc="mean"))
    out = out.reset_index()
    out["task_group"] = [tasks[t].get("harmonised") or t for t in out["task"]]
    return out


def _gap_score(rows: pd.DataFrame, kind: str) -> tuple[float, int]:
    cols = [c for c in rows.columns if c.startswith(f"{kind}:") and rows[c].notna().any()]
    if not cols:
        return np.nan, 0
    return float(1.0 - rows[cols].mean().mean()), len(cols)


def group_scores(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per group of ``keys``: mean accuracy / AUROC / AUPRC / ECE over the group's rows, Fairness, Quality and Shift
    (:data:`FORMULAS`, clipped to [0, 1]), and the counts behind them."""
    out = []
    for key, g in rows.groupby(keys, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        rec = dict(zip(keys, key))
        rec.update({c: float(g[c].mean()) for c in ("accuracy", "auroc", "auprc", "ece")})
        rec["fairness"], rec["n_fairness_gaps"] = _gap_score(g, "fairness")
        rec["quality"], rec["n_quality_gaps"] = _gap_score(g, "quality")
        per_dataset = g.groupby("dataset")["auroc"].mean().dropna()
        rec["shift"] = float(1.0 - (per_dataset.max() - per_dataset.min())) if len(per_dataset) >= 2 else np.nan
        rec["n_datasets"] = int(len(per_dataset))
        rec["n_models"], rec["n_rows"] = int(g["encoder"].nunique()), int(len(g))
        out.append(rec)
    df = pd.DataFrame(out)
    for c in ("fairness", "quality", "shift"):
        if c in df:
            df[c] = df[c].clip(0.0, 1.0)
    return df


def with_groups(rows: pd.DataFrame, groups: pd.DataFrame) -> pd.DataFrame:
    missing = sorted(set(rows["encoder"]) - set(groups["encoder"]))
    if missing:
        raise KeyError(f"FOCUS tables: encoders {missing} have no registry entry among those given")
    return rows.merge(groups, on="encoder", how="left")


def _order(df: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    rank = {"family": {f: i for i, f in enumerate(FAMILIES)}, "domain_group": {d: i for i, d in enumerate(DOMAIN_ORDER)}}
    return df.sort_values(cols, key=lambda s: s.map(rank[s.name]) if s.name in rank else s).reset_index(drop=True)


def table3(rows: pd.DataFrame) -> pd.DataFrame:
    """FOCUS Table 3 (make_method_table_figure.py: build_method_tables / add_reliability_scores): per task group and
    ``overall``, per model type (family x domain group) and method (protocol)."""
    keys = ["family", "domain_group", "protocol"]
    per_task = group_scores(rows, ["task_group", *keys])
    overall = group_scores(rows, keys).assign(task_group="overall")
    df = pd.concat([_order(per_task, ["task_group", *keys]), _order(overall, keys)], ignore_index=True)
    cols = ["task_group", *keys, *SUMMARY, "n_models", "n_rows", "n_datasets", "n_fairness_gaps", "n_quality_gaps"]
    return df[cols]


def table4(rows: pd.DataFrame, metrics=("auroc", "ece")) -> pd.DataFrame:
    """FOCUS Table 4: per (dataset, task group) and family, the mean of each metric over the general and the
    ophthalmic (and medical) models, and ophthalmic - general (deep_benchmark_analysis.py:
    write_additional_tables, ``medical_vs_general_summary`` by family x domain and ``dataset_family_metric_summary``
    by dataset x family)."""
    recs = []
    for (dataset, tg, family), g in rows.groupby(["dataset", "task_group", "family"], sort=True):
        for metric in metrics:
            rec = {"dataset": dataset, "task_group": tg, "family": family, "metric": metric}
            for dom in DOMAIN_ORDER[:3]:
                part = g[g["domain_group"] == dom]
                rec[dom] = float(part[metric].mean()) if len(part) else np.nan
                rec[f"n_{dom}"] = int(part["encoder"].nunique())
            rec["ophthalmic_minus_general"] = rec["ophthalmic"] - rec["general"]
            recs.append(rec)
    return _order(pd.DataFrame(recs), ["dataset", "task_group", "family", "metric"])


TABLE10_METRICS = ("auroc", "auprc", "accuracy", "f1", "ece")


def table10(comparisons: pd.DataFrame, *, variant: str = "invalid_wrong") -> pd.DataFrame:
    """FOCUS Table 10 (make_ft_paper_figures.py: write_tables, ``mean_summary`` by train model x domain): per MLLM
    (then ``all``) and domain (in-domain / out-of-domain), the mean over its adapter comparisons of the post-SFT
    value, the base value and the delta of each metric, from the LoRA deltas' comparisons table; per scoring
    protocol (``mllm``, ``mllm_renorm``)."""
    c = comparisons[(comparisons["variant"] == variant) & ~comparisons["skipped"].astype(bool)
                    & comparisons["metric_family"].isin(TABLE10_METRICS)]
    recs = []
    for (protocol, enc), part in [*c.groupby(["protocol", "encoder"], sort=True),
                                  *[((pr, "all"), cp) for pr, cp in c.groupby("protocol", sort=True)]]:
        for domain, g in part.groupby("domain", sort=True):
            rec = {"protocol": protocol, "model": enc, "domain": domain,
                   "n_comparisons": int(g.groupby(["train_dataset", "train_task", "dataset", "task"]).ngroups)}
            for m, gm in g.groupby("metric_family"):
                rec.update({f"{m}_sft": gm["value_adapter"].mean(), f"{m}_base": gm["value_base"].mean(),
                            f"{m}_delta": gm["delta"].mean()})
            recs.append(rec)
    cols = ["protocol", "model", "domain", *[f"{m}_{k}" for m in TABLE10_METRICS for k in ("sft", "base", "delta")], "n_comparisons"]
    return pd.DataFrame(recs).reindex(columns=cols)


def sft_deltas(comparisons: pd.DataFrame, *, variant: str = "invalid_wrong") -> pd.DataFrame:
    """Mean delta (adapter - base) per grouping (``domain``, ``model`` x domain, ``train_task`` x domain) and
    metric: the SFT delta panels (make_paper_figures.py: plot_ft_delta_summary, plot_ft_model_delta_heatmap,
    plot_ft_task_delta_summary); FOCUS's raw p_yes scoring (protocol ``mllm``) when present, as Table 5's figure."""
    c = comparisons[(comparisons["variant"] == variant) & ~comparisons["skipped"].astype(bool)]
    protocols = sorted(c["protocol"].unique())
    c = c[c["protocol"] == ("mllm" if "mllm" in protocols or not protocols else protocols[0])]
    parts = []
    c = c.assign(all="all")
    for by, level in (("domain", "all"), ("model", "encoder"), ("train_task", "train_task")):
        g = c.groupby([level, "domain", "metric_family"], sort=True)["delta"].agg(["mean", "size"]).reset_index()
        g = g.rename(columns={"mean": "delta", "size": "n_comparisons", level: "level"}).assign(by=by)
        parts.append(g[["by", "level", "domain", "metric_family", "delta", "n_comparisons"]])
    return pd.concat(parts, ignore_index=True)


# --- figure data (retinabench.figures.focus draws each) -------------------------------------------------------
MODEL_KEYS = ["family", "domain_group", "model_type", "encoder", "protocol"]


def pooled_bins(bins: pd.DataFrame, rows: pd.DataFrame, *, regime: str) -> pd.DataFrame:
    """Reliability curves per (encoder, protocol): the uncalibrated bins of its own-task test cells pooled over
    datasets, tasks and seeds (n-weighted mean probability and observed frequency per bin), with its groups."""
    b = bins[(bins["calibration"] == "before") & (bins["train_task"] == bins["task"]) & (bins["regime"] == regime)
             & ~bins["source"].isin(["transfer", "mllm_lora"]) & (bins["n"].fillna(0) > 0)]
    b = b.assign(wp=b["mean_prob"] * b["n"], wo=b["observed"] * b["n"])
    p = b.groupby(["encoder", "protocol", "bin"], as_index=False)[["wp", "wo", "n"]].sum()
    p = p.assign(mean_prob=p["wp"] / p["n"], observed=p["wo"] / p["n"]).drop(columns=["wp", "wo"])
    groups = rows[MODEL_KEYS].drop_duplicates()
    return p.merge(groups, on=["encoder", "protocol"], how="inner")


def figure_data(figure: str, rows: pd.DataFrame | None = None, *, bins: pd.DataFrame | None = None,
                comparisons: pd.DataFrame | None = None, regime: str = "u-u",
                variant: str = "invalid_wrong") -> pd.DataFrame:
    """The table a FOCUS figure draws (``rows``: :func:`focus_rows` with :func:`with_groups`)."""
    if figure == "sft_deltas":
        if comparisons is None:
            raise ValueError("FOCUS figure sft_deltas needs the LoRA deltas' comparisons table")
        return sft_deltas(comparisons, variant=variant)
    if rows is None:
        raise ValueError(f"FOCUS figure {figure}: needs the FOCUS rows")
    if figure == "calibration_curves":
        if bins is None:
            raise ValueError("FOCUS figure calibration_curves needs the reliability bins table")
        return pooled_bins(bins, rows, regime=regime)
    if figure in ("spiders", "auroc_ece"):
        return group_scores(rows, MODEL_KEYS)
    if figure == "mllm_size":
        return group_scores(rows[rows["family"] == "MLLM"], [*MODEL_KEYS, "params_b"])
    if figure == "probe_vs_zeroshot":
        return group_scores(rows[rows["family"] == "VLM"], ["task_group", *MODEL_KEYS])
    if figure == "dataset_heatmap":
        return group_scores(rows, [*MODEL_KEYS, "dataset"])
    raise KeyError(f"unknown FOCUS figure {figure!r}")


# --- LaTeX (booktabs, FOCUS's layout: make_method_table_figure.py build_latex_table) ---------------------------
def _cell(v: float, best: float) -> str:
    if not np.isfinite(v):
        return "--"
    text = f"{v:.3f}"
    return f"\\textbf{{{text}}}" if np.isfinite(best) and abs(v - best) < 1e-12 else text


def table3_latex(t3: pd.DataFrame) -> str:
    """Table 3 as FOCUS lays it out: one block per task group then ``Overall``; best of each column in a block in
    bold (ECE: lowest); ``--`` where a score is undefined."""
    from retinabench.stats.tables import latex_escape
    head = ["Accuracy", "AUROC", "AUPRC", "ECE", "Fairness", "Quality", "Shift"]
    lines = ["\\begin{table*}[t]", "\\centering", "\\scriptsize",
             "\\caption{Mean metrics by model type and method (FOCUS Table 3). Higher is better except ECE; "
             "Fairness, Quality, Shift: docs/reliability.md.}",
             "\\begin{tabular}{ll" + "c" * (1 + len(head)) + "}", "\\toprule",
             "Task & Model type & Method & " + " & ".join(head) + " \\\\", "\\midrule"]
    for tg, block in t3.groupby("task_group", sort=False):
        lines.append(f"\\multicolumn{{{3 + len(head)}}}{{l}}{{\\textbf{{{latex_escape(tg)}}}}} \\\\")
        best = {c: (block[c].min() if c == "ece" else block[c].max()) for c in SUMMARY}
        for r in block.to_dict("records"):
            cells = [_cell(r[c], best[c]) for c in SUMMARY]
            lines.append(f"\\quad & {latex_escape(r['domain_group'] + ' ' + r['family'])} & "
                         f"{latex_escape(r['protocol'])} & " + " & ".join(cells) + " \\\\")
        lines.append("\\midrule")
    lines[-1] = "\\bottomrule"
    return "\n".join([*lines, "\\end{tabular}", "\\end{table*}"]) + "\n"


def wide_latex(df: pd.DataFrame, caption: str, digits: int = 3) -> str:
    """A tidy table as booktabs LaTeX (numbers to ``digits``, NaN as ``--``)."""
    from retinabench.stats.tables import latex_escape

    def fmt(v) -> str:
        if isinstance(v, (float, np.floating)):
            return "--" if not np.isfinite(v) else f"{v:.{digits}f}"
        return latex_escape(v)
    lines = ["\\begin{table}[t]", "\\centering", "\\scriptsize", f"\\caption{{{latex_escape(caption)}}}",
             "\\begin{tabular}{" + "l" * len(df.columns) + "}", "\\toprule",
             " & ".join(latex_escape(c) for c in df.columns) + " \\\\", "\\midrule"]
    lines += [" & ".join(fmt(v) for v in r) + " \\\\" for r in df.itertuples(index=False)]
    return "\n".join([*lines, "\\bottomrule", "\\end{tabular}", "\\end{table}"]) + "\n"
