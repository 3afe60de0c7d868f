"""FOCUS's paper figures, drawn from the tables retinabench.reliability.focus_tables.figure_data prepares: per-model
spider plots, AUROC vs ECE, MLLM size vs AUROC, probe vs zero-shot, dataset x model heatmaps, calibration curves and
the SFT delta panels (FOCUS: scripts/make_paper_figures.py and deep_benchmark_analysis.py).

Every function takes the figure's table and the PNG path, writes PNG + PDF (:func:`retinabench.figures.style.save`)
and returns the paths. Colours: one per model type (family x domain group), the mapping of
:func:`retinabench.reliability.focus_tables.model_groups`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from retinabench.figures import style  # noqa: F401  (sets the Agg backend and rcParams before pyplot)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.projections.polar import PolarAxes  # noqa: E402

from retinabench.figures.style import FONT, figsize, save, suptitle  # noqa: E402

FAMILIES = ("VM", "VLM", "MLLM")
TYPE_COLORS = {"general VM": "#4477AA", "ophthalmic VM": "#66CCEE", "general VLM": "#88CCAA",
               "ophthalmic VLM": "#117733", "general MLLM": "#DD8899", "medical MLLM": "#AA3377",
               "medical VM": "#BBBBBB", "medical VLM": "#999933", "untrained VM": "#777777"}
SPIDER_AXES = [("auroc", "AUROC"), ("auprc", "AUPRC"), ("accuracy", "Accuracy"), ("calibration", "1-ECE"),
               ("fairness", "Fairness"), ("quality", "Quality")]
DOMAIN_COLORS = {"in-domain": "#2C7FB8", "out-of-domain": "#F03B20"}


def type_color(model_type: str) -> str:
    return TYPE_COLORS.get(model_type, "#8C8C8C")


def _label(r) -> str:
    return f"{r['encoder']} ({r['protocol']})"


def _families(df: pd.DataFrame) -> list[str]:
    return [f for f in FAMILIES if (df["family"] == f).any()]


def _type_handles(types) -> list:
    return [Line2D([], [], marker="o", ls="", color=type_color(t), label=t) for t in sorted(set(types))]


def spiders(df: pd.DataFrame, png, *, top: int = 5) -> list[str]:
    """One polar panel per family: its ``top`` configurations (encoder x method) by mean AUROC on six axes (FOCUS
    make_paper_figures.py: plot_reliability_spiders / reliability_scores). An undefined axis breaks the outline."""
    df = df.assign(calibration=1.0 - df["ece"])
    fams = _families(df)
    fig = plt.figure(figsize=figsize(95), layout="constrained")
    angles = np.linspace(0, 2 * np.pi, len(SPIDER_AXES), endpoint=False)
    for k, fam in enumerate(fams):
        ax: PolarAxes = fig.add_subplot(1, len(fams), k + 1, projection="polar")  # type: ignore[assignment]
        rows = df[df["family"] == fam].sort_values("auroc", ascending=False).head(top)
        ax.set_theta_offset(np.pi / 2)
        ax.set_theta_direction(-1)
        ax.set_xticks(angles, [lab for _, lab in SPIDER_AXES])
        ax.set_ylim(0.35, 1.0)
        ax.set_yticks([0.5, 0.75, 1.0], ["0.50", "0.75", "1.00"])
        for j, r in enumerate(rows.to_dict("records")):
            vals = np.array([r[c] for c, _ in SPIDER_AXES], dtype=float)
            ax.plot(np.append(angles, angles[0]), np.append(vals, vals[0]), lw=1.0,
                    color=plt.get_cmap("tab10")(j), label=_label(r))
        ax.set_title(fam, fontsize=FONT["title"])
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False, fontsize=FONT["base"])
    suptitle(fig, f"Top {top} configurations per family by mean AUROC (Fairness, Quality: docs/reliability.md)")
    out = save(fig, png)
    plt.close(fig)
    return out


def auroc_ece(df: pd.DataFrame, png) -> list[str]:
    """Mean ECE (x) vs mean AUROC (y) per configuration, coloured by model type (FOCUS: plot_auc_ece_tradeoff)."""
    fig, ax = plt.subplots(figsize=figsize(110), layout="constrained")
    for t, g in df.groupby("model_type"):
        ax.scatter(g["ece"], g["auroc"], s=22, color=type_color(str(t)), edgecolor="white", lw=0.5, label=t)
    for r in df.sort_values("auroc", ascending=False).head(8).to_dict("records"):
        ax.annotate(_label(r), (r["ece"], r["auroc"]), xytext=(3, 2), textcoords="offset points",
                    fontsize=FONT["base"])
    ax.set_xlabel("mean ECE (lower is better)")
    ax.set_ylabel("mean AUROC")
    ax.grid(color="#E8E8E8", lw=0.5)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", frameon=False, ncol=4)
    suptitle(fig, "Discrimination vs calibration per configuration (mean over datasets and tasks)")
    out = save(fig, png)
    plt.close(fig)
    return out


def mllm_size(df: pd.DataFrame, png) -> list[str]:
    """MLLM parameters (billions, log scale) vs mean AUROC, marker area by ECE (FOCUS: plot_mllm_size_tradeoff)."""
    fig, ax = plt.subplots(figsize=figsize(90), layout="constrained")
    for r in df.to_dict("records"):
        ax.scatter([r["params_b"]], [r["auroc"]], s=30 + 300 * float(np.nan_to_num(r["ece"])),
                   color=type_color(r["model_type"]), edgecolor="white", lw=0.5)
        ax.annotate(f"{_label(r)}\nECE {r['ece']:.2f}", (r["params_b"], r["auroc"]), xytext=(4, 2),
                    textcoords="offset points", fontsize=FONT["base"])
    ax.set_xscale("log")
    ax.set_xlabel("parameters (billions; registry params_m)")
    ax.set_ylabel("mean AUROC")
    ax.grid(color="#E8E8E8", lw=0.5)
    ax.legend(handles=_type_handles(df["model_type"]), loc="lower right", frameon=False)
    suptitle(fig, "MLLM size vs mean AUROC (marker area: mean ECE)")
    out = save(fig, png)
    plt.close(fig)
    return out


def probe_vs_zeroshot(df: pd.DataFrame, png) -> list[str]:
    """VLMs: mean AUROC per model and method (linear probe vs zero-shot), one panel per task group (FOCUS:
    plot_vlm_adaptation)."""
    groups = sorted(df["task_group"].unique())
    methods = sorted(df["protocol"].unique())
    encs = sorted(df["encoder"].unique())
    fig, axes = plt.subplots(1, len(groups), figsize=figsize(20 + 6 * len(encs) * max(1, len(methods)) / 2),
                             squeeze=False, sharex=True, layout="constrained")
    h = 0.8 / len(methods)
    for ax, tg in zip(axes[0], groups):
        part = df[df["task_group"] == tg].set_index(["encoder", "protocol"])["auroc"]
        for j, m in enumerate(methods):
            ys = np.arange(len(encs)) + (j - (len(methods) - 1) / 2) * h
            vals = [part.get((e, m), np.nan) for e in encs]
            ax.barh(ys, vals, height=h * 0.95, color=plt.get_cmap("Set2")(j), label=m)
        ax.set_yticks(range(len(encs)), encs)
        ax.set_xlim(0.35, 1.0)
        ax.set_xlabel("mean AUROC")
        ax.set_title(tg, fontsize=FONT["title"])
    axes[0][-1].legend(loc="lower right", frameon=False)
    suptitle(fig, "Dual-encoder VLMs: probe vs zero-shot (mean AUROC over datasets)")
    out = save(fig, png)
    plt.close(fig)
    return out


def dataset_heatmap(df: pd.DataFrame, png, *, top: int = 10) -> list[str]:
    """Mean AUROC per configuration (rows, the family's ``top`` by mean AUROC) x dataset (columns), one panel per
    family (FOCUS: plot_model_dataset_auc)."""
    fams = _families(df)
    sizes = [min(top, df[df["family"] == f][["encoder", "protocol"]].drop_duplicates().shape[0]) for f in fams]
    fig, axes = plt.subplots(len(fams), 1, figsize=figsize(30 + 5 * sum(sizes) + 12 * len(fams)), squeeze=False,
                             height_ratios=[max(1, s) for s in sizes], layout="constrained")
    datasets = sorted(df["dataset"].unique())
    im = None
    for ax, fam in zip(axes[:, 0], fams):
        part = df[df["family"] == fam].assign(config=lambda d: d["encoder"] + " (" + d["protocol"] + ")")
        order = part.groupby("config")["auroc"].mean().sort_values(ascending=False).index[:top]
        mat = part.pivot_table(index="config", columns="dataset", values="auroc").reindex(order).reindex(
            columns=datasets)
        im = ax.imshow(mat.to_numpy(dtype=float), cmap="viridis", vmin=0.35, vmax=0.95, aspect="auto")
        for (i, j), v in np.ndenumerate(mat.to_numpy(dtype=float)):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=FONT["base"],
                        color="white" if v < 0.7 else "black")
        ax.set_yticks(range(len(order)), list(order))
        ax.set_xticks(range(len(datasets)), datasets, rotation=30, ha="right", rotation_mode="anchor")
        ax.set_title(fam, fontsize=FONT["title"])
    if im is not None:
        fig.colorbar(im, ax=axes[:, 0].tolist(), label="mean AUROC", shrink=0.6)
    suptitle(fig, "Configuration x dataset mean AUROC (mean over the dataset's tasks)")
    out = save(fig, png)
    plt.close(fig)
    return out


def calibration_curves(df: pd.DataFrame, png, *, top: int = 5) -> list[str]:
    """One panel per model type: reliability curves (mean probability vs observed frequency, bins pooled over
    datasets, tasks and seeds) of its ``top`` configurations by pooled n (FOCUS: plot_calibration_curve_sheets)."""
    types = sorted(df["model_type"].unique())
    ncols = min(3, len(types))
    nrows = -(-len(types) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=figsize(20 + 80 * nrows), squeeze=False, layout="constrained")
    for ax in axes.ravel()[len(types):]:
        ax.set_visible(False)
    for ax, t in zip(axes.ravel(), types):
        part = df[df["model_type"] == t]
        configs = part.groupby(["encoder", "protocol"])["n"].sum().sort_values(ascending=False).index[:top]
        ax.plot([0, 1], [0, 1], color="#AAAAAA", ls="--", lw=0.7)
        for j, (e, p) in enumerate(configs):
            c = part[(part["encoder"] == e) & (part["protocol"] == p)].sort_values("bin")
            ax.plot(c["mean_prob"], c["observed"], marker="o", ms=2, lw=0.9, color=plt.get_cmap("tab10")(j),
                    label=f"{e} ({p})")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("mean predicted probability")
        ax.set_ylabel("observed frequency")
        ax.set_title(t, fontsize=FONT["title"])
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), frameon=False, fontsize=FONT["base"])
    suptitle(fig, "Calibration curves (uncalibrated; bins pooled over datasets, tasks and seeds)")
    out = save(fig, png)
    plt.close(fig)
    return out


def sft_deltas(df: pd.DataFrame, png) -> list[str]:
    """SFT delta panels (adapter - base, mean over comparisons): by domain (AUROC, accuracy, ECE), per MLLM x
    domain, per training task x domain (AUROC) (FOCUS: plot_ft_delta_summary, plot_ft_model_delta_heatmap,
    plot_ft_task_delta_summary)."""
    panels = [("domain", ["auroc", "accuracy", "ece"]), ("model", ["auroc", "ece"]), ("train_task", ["auroc"])]
    fig, axes = plt.subplots(1, 3, figsize=figsize(90), layout="constrained")
    for ax, (by, metrics) in zip(axes, panels):
        part = df[(df["by"] == by) & df["metric_family"].isin(metrics)]
        row = (part["metric_family"] if by == "domain" else
               part["level"] + " · " + part["metric_family"] if len(metrics) > 1 else part["level"])
        part = part.assign(row=row)
        rows = list(dict.fromkeys(part.sort_values(["level", "metric_family"])["row"]))
        doms = [d for d in DOMAIN_COLORS if (part["domain"] == d).any()]
        h = 0.8 / max(1, len(doms))
        for j, d in enumerate(doms):
            s = part[part["domain"] == d].set_index("row")["delta"]
            ax.barh(np.arange(len(rows)) + (j - (len(doms) - 1) / 2) * h, [s.get(r, np.nan) for r in rows],
                    height=h * 0.95, color=DOMAIN_COLORS[d], label=d)
        ax.axvline(0, color="#333333", lw=0.6)
        ax.set_yticks(range(len(rows)), rows)
        ax.set_xlabel("adapter - base")
        ax.set_title({"domain": "all adapters", "model": "per MLLM", "train_task": "per training task (AUROC)"}[by],
                     fontsize=FONT["title"])
    axes[0].legend(loc="lower right", frameon=False)
    suptitle(fig, "LoRA SFT deltas (mean over adapter comparisons; CIs: Table 5)")
    out = save(fig, png)
    plt.close(fig)
    return out


FIGURES = {"spiders": spiders, "auroc_ece": auroc_ece, "mllm_size": mllm_size, "probe_vs_zeroshot": probe_vs_zeroshot,
           "dataset_heatmap": dataset_heatmap, "calibration_curves": calibration_curves, "sft_deltas": sft_deltas}
