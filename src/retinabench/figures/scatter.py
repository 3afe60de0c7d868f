"""Scatter and line plots: fine-tuning minus linear-probe gap against parameter count (one point per encoder),
subgroup performance (e.g. age < 60 vs ≥ 60, female vs male; one point per encoder and dataset), and the
learning-rate transfer check (validation metric over the lr grid on the sweep and the check task). Colours:
pretraining domain."""
from __future__ import annotations

from typing import Any

from retinabench.figures import LR_ENCODERS_PER_PAGE, lr_transfer_pages  # noqa: F401 (defined once, for the planner)

from retinabench.figures.style import (FONT, domain_color, domain_handles,  # noqa: I001
                                       domain_legend, encoder_colors, encoder_domain, figsize, save, suptitle,
                                       wrap)

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
import pandas as pd


def _label_points(ax, xs, ys, names, max_labels: int = 12) -> None:
    if len(names) > max_labels:
        return
    for x, y, n in zip(xs, ys, names):
        ax.annotate(n, (x, y), xytext=(3, 3), textcoords="offset points", fontsize=FONT["base"], alpha=0.85,
                    annotation_clip=True)


def ft_lp_gap_figure(table: pd.DataFrame, encoders: dict[str, dict], out_png, *, finetune: str, linear: str,
                     title: str | None = None) -> list[str]:
    """Gap (percentage points) of fine-tuning over the linear probe vs parameter count (log axis)."""
    if table.empty:
        raise ValueError("ft_lp_gap_figure: empty table")
    fig, ax = plt.subplots(figsize=figsize(100, "double"), layout="constrained")
    x = table["params_m"].to_numpy(dtype=float)
    y = 100 * table["gap"].to_numpy(dtype=float)
    err = 100 * table["sd"].fillna(0).to_numpy(dtype=float)
    colors = encoder_colors(encoders, table["encoder"])
    ax.errorbar(x, y, yerr=err, fmt="none", ecolor="#999999", elinewidth=0.8, capsize=2, zorder=1)
    ax.scatter(x, y, c=colors, s=24, edgecolor="black", linewidth=0.4, zorder=2)
    _label_points(ax, x, y, table["encoder"])
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("parameters (millions, log scale)")
    ax.set_ylabel(f"{finetune} − {linear} test {table['metric'].iloc[0]} (pp)")
    ax.grid(alpha=0.3)
    domain_legend(ax, encoders, table["encoder"], loc="upper left", bbox_to_anchor=(1.01, 1.0))
    suptitle(fig, title or f"{finetune} vs {linear}: mean ± sd over tasks")
    paths = save(fig, out_png)
    plt.close(fig)
    return paths


def subgroup_figure(table: pd.DataFrame, encoders: dict[str, dict], out_png, *, title: str | None = None) -> list[str]:
    """OcularBench Figs. 10–11: one panel per attribute with data, x = group A's value, y = group B's, one point per
    encoder and dataset (mean over seeds; marker = dataset, colour = pretraining domain; hollow: a group below the
    minimum size), the diagonal y = x. Attributes without data (a ``reason`` row) are left out (the skipped-analyses
    table lists them); when none has data the figure says so."""
    attributes = list(dict.fromkeys(table["attribute"]))
    if not attributes:
        raise ValueError("subgroup_figure: empty table")
    metric = table["metric"].iloc[0]
    points = table[table["reason"].fillna("") == ""]
    shown = [a for a in attributes if (points["attribute"] == a).any()]
    if not shown:
        fig = plt.figure(figsize=figsize(45, "single"), layout="constrained")
        reasons = "; ".join(f"{a}: {r}" for a, r in table.drop_duplicates("attribute")[["attribute", "reason"]]
                            .itertuples(index=False))
        fig.text(0.5, 0.5, wrap(f"No subgroup has data ({reasons}).", 80), ha="center", va="center")
        suptitle(fig, title or "Subgroup performance")
        paths = save(fig, out_png)
        plt.close(fig)
        return paths
    datasets = sorted(points["dataset"].dropna().unique())
    markers = {ds: "osD^v<>p*hH8dP"[i % 14] for i, ds in enumerate(datasets)}  # markers repeat past 14 datasets
    ncols = min(2, len(shown))
    nrows = -(-len(shown) // ncols)
    fig, axes = plt.subplots(nrows, ncols, squeeze=False, layout="constrained",
                             figsize=figsize(nrows * 80 + 35, "double" if ncols > 1 else "single"))
    for ax in axes.ravel()[len(shown):]:
        ax.set_visible(False)
    for ax, attribute in zip(axes.ravel(), shown):
        d = points[points["attribute"] == attribute]
        ga, gb = d["group_a"].iloc[0], d["group_b"].iloc[0]
        ax.set_title(f"{attribute}: {ga} vs {gb}")
        x, y = 100 * d["value_a"].to_numpy(float), 100 * d["value_b"].to_numpy(float)
        lo, hi = float(np.nanmin([x.min(), y.min()])) - 2, float(np.nanmax([x.max(), y.max()])) + 2
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, ls="--", zorder=1)
        for ds in datasets:
            m = (d["dataset"] == ds).to_numpy()
            if not m.any():
                continue
            colors = encoder_colors(encoders, d["encoder"][m])
            small = d["small_group"][m].fillna(False).astype(bool).to_numpy()
            ax.scatter(x[m], y[m], c=[("white" if s else c) for s, c in zip(small, colors)], edgecolors=colors,
                       marker=markers[ds], s=26, linewidth=0.9, zorder=2)
        _label_points(ax, x, y, d["encoder"])
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal")
        ax.set_xlabel(f"{attribute} {ga}: test {metric} (%)")
        ax.set_ylabel(f"{attribute} {gb}: test {metric} (%)")
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], marker=markers[ds], ls="", color="0.3", label=ds) for ds in datasets]
    handles += domain_handles(encoders, points["encoder"].unique())
    fig.legend(handles=handles, frameon=False, loc="outside lower center", ncol=min(len(handles), 4))
    suptitle(fig, (title or "Subgroup performance") + "; one point per encoder and dataset (mean over seeds); "
                  "hollow: a group below the minimum size")
    paths = save(fig, out_png)
    plt.close(fig)
    return paths


def lr_transfer_figure(table: pd.DataFrame, encoders: dict[str, dict], out_png, *, title: str | None = None,
                       baselines: pd.DataFrame | None = None) -> list[str]:
    """OcularBench Figs. A.14/A.15: per swept encoder and sweep stage, the validation metric over the learning-rate
    grid on the sweep task and on the transfer-check task side by side; the dotted line marks the lr chosen on the
    sweep task, stars each task's own optimum (lowest validation loss), thin dashed lines the majority-class level
    of each task's validation rows (``baselines``: stats.baselines rows of the metric). ``out_png``: one path, or
    a list of paths: the encoders are split evenly over them (:func:`lr_transfer_pages`)."""
    if table.empty:
        raise ValueError("lr_transfer_figure: empty table")
    outs = [out_png] if isinstance(out_png, (str, bytes)) or not isinstance(out_png, (list, tuple)) else list(out_png)
    encs = [e for e in encoders if e in set(table["encoder"])] + sorted(set(table["encoder"]) - set(encoders))
    stages = sorted(table["stage"].unique())
    metric = table["metric"].iloc[0]
    styles: dict[str, dict[str, Any]] = {"sweep task": dict(ls="-", color="#1f4e79"),
                                         "transfer check": dict(ls="--", color="#C44E52")}
    level = {}
    if baselines is not None and len(baselines):
        level = baselines.drop_duplicates("task").set_index("task")["majority"].to_dict()
    n_pages = len(outs)
    size = -(-len(encs) // n_pages)
    paths = []
    for page, out in enumerate(outs):
        page_encs = encs[page * size:(page + 1) * size]
        if not page_encs:
            raise ValueError(f"lr_transfer_figure: {len(outs)} files for {len(encs)} encoders")
        per_row = 2 if len(stages) <= 2 else 1
        n_rows = -(-len(page_encs) // per_row)
        fig, grid = plt.subplots(n_rows, per_row * len(stages), squeeze=False, layout="constrained",
                                 figsize=figsize(n_rows * 44 + 30, "double"))
        for k in range(len(page_encs), n_rows * per_row):
            for j in range(len(stages)):
                grid[k // per_row, (k % per_row) * len(stages) + j].set_visible(False)
        for i, enc in enumerate(page_encs):
            for j, stage in enumerate(stages):
                ax = grid[i // per_row, (i % per_row) * len(stages) + j]
                d = table[(table["encoder"] == enc) & (table["stage"] == stage)]
                if d.empty:
                    ax.set_visible(False)
                    continue
                for role, g in d.groupby("role", sort=True):
                    g = g.sort_values("lr")
                    st = styles.get(role, {})
                    ax.plot(g["lr"], 100 * g["value"], marker="o", ms=3, **st)
                    best = g[np.isclose(g["lr"], g["lr_optimal_here"], rtol=1e-12, atol=0)]
                    ax.scatter(best["lr"], 100 * best["value"], marker="*", s=60, zorder=4,
                               color=st.get("color", "black"))
                    task = g["task"].iloc[0]
                    if task in level and level[task] == level[task]:
                        ax.axhline(100 * level[task], color=st.get("color", "0.4"), lw=0.7, ls=(0, (1, 2)),
                                   alpha=0.8, zorder=0.5)
                ax.axvline(float(d["lr_chosen"].iloc[0]), color="0.3", lw=0.9, ls=":")
                ax.set_xscale("log")
                lrs = sorted(d["lr"].unique())  # ticks: the grid itself, plain labels (no minor ticks, no mathtext)
                ax.set_xticks(lrs, [f"{v:.0e}" for v in lrs], rotation=45, ha="right", rotation_mode="anchor")
                ax.minorticks_off()
                ax.yaxis.set_major_locator(MaxNLocator(4))
                verdict = "transfers" if bool(d["transfers"].iloc[0]) else "does not transfer"
                ax.set_title(wrap(f"{enc}\n{d['protocol'].iloc[0]}: chosen lr {verdict}", 40),
                             fontsize=FONT["base"], color=domain_color(encoder_domain(encoders, enc)))
                ax.set_xlabel(d["lr_name"].iloc[0])
                if j == 0:
                    ax.set_ylabel(f"val. {metric} (%)")
                ax.grid(alpha=0.3)
        tasks = table.drop_duplicates("role").set_index("role")["task"].to_dict()
        handles = [Line2D([], [], marker="o", ms=3, label=f"{tasks[r]} ({r})", **styles[r]) for r in styles
                   if r in tasks]
        handles += [Line2D([], [], color="0.3", lw=0.9, ls=":", label="lr chosen on the sweep task"),
                    Line2D([], [], marker="*", ls="", ms=7, color="0.3", label="each task's own optimum")]
        if level:
            handles.append(Line2D([], [], color="0.4", lw=0.7, ls=(0, (1, 2)), label="majority class (validation)"))
        fig.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False)
        if title:
            suptitle(fig, title + (f" (part {page + 1} of {n_pages})" if n_pages > 1 else ""))
        paths += save(fig, out)
        plt.close(fig)
    return paths
