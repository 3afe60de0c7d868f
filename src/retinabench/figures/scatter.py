"""Scatter and line plots: fine-tuning minus linear-probe gap against parameter count (one point per encoder),
subgroup performance (e.g. age < 60 vs ≥ 60, female vs male; one point per encoder and dataset), and the
learning-rate transfer check (validation metric over the lr grid on the sweep and the check task). Colours:
pretraining domain."""
from __future__ import annotations

from retinabench.figures.style import (domain_color, domain_legend, encoder_colors, encoder_domain,  # noqa: I001
                                       save)

import textwrap

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator
import pandas as pd


def _label_points(ax, xs, ys, names, max_labels: int = 40) -> None:
    if len(names) > max_labels:
        return
    for x, y, n in zip(xs, ys, names):
        ax.annotate(n, (x, y), xytext=(3, 3), textcoords="offset points", fontsize=6.5, alpha=0.85)


def ft_lp_gap_figure(table: pd.DataFrame, encoders: dict[str, dict], out_png, *, finetune: str, linear: str,
                     title: str | None = None) -> list[str]:
    """Gap (percentage points) of fine-tuning over the linear probe vs parameter count (log axis)."""
    if table.empty:
        raise ValueError("ft_lp_gap_figure: empty table")
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    x = table["params_m"].to_numpy(dtype=float)
    y = 100 * table["gap"].to_numpy(dtype=float)
    err = 100 * table["sd"].fillna(0).to_numpy(dtype=float)
    colors = encoder_colors(encoders, table["encoder"])
    ax.errorbar(x, y, yerr=err, fmt="none", ecolor="#999999", elinewidth=0.8, capsize=2, zorder=1)
    ax.scatter(x, y, c=colors, s=36, edgecolor="black", linewidth=0.4, zorder=2)
    _label_points(ax, x, y, table["encoder"])
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("parameters (millions, log scale)")
    ax.set_ylabel(f"{finetune} − {linear} test {table['metric'].iloc[0]} (pp)")
    ax.grid(alpha=0.3)
    domain_legend(ax, encoders, table["encoder"], loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or f"{finetune} vs {linear}: mean ± sd over tasks")
    fig.tight_layout()
    paths = save(fig, out_png)
    plt.close(fig)
    return paths


def subgroup_figure(table: pd.DataFrame, encoders: dict[str, dict], out_png, *, title: str | None = None) -> list[str]:
    """OcularBench Figs. 10–11: one panel per attribute, x = group A's value, y = group B's, one point per encoder
    and dataset (mean over seeds; marker = dataset, colour = pretraining domain; hollow: a group below the minimum
    size), the diagonal y = x. Attributes without data (a ``reason`` row) say why in their panel."""
    attributes = list(dict.fromkeys(table["attribute"]))
    if not attributes:
        raise ValueError("subgroup_figure: empty table")
    fig, axes = plt.subplots(1, len(attributes), squeeze=False, figsize=(4.2 * len(attributes) + 1.6, 4.6))
    metric = table["metric"].iloc[0]
    points = table[table["reason"].fillna("") == ""]
    datasets = sorted(points["dataset"].dropna().unique())
    markers = {ds: "osD^v<>p*hH8dP"[i % 14] for i, ds in enumerate(datasets)}  # markers repeat past 14 datasets
    for ax, attribute in zip(axes[0], attributes):
        d = points[points["attribute"] == attribute]
        rows = table[table["attribute"] == attribute]
        ga, gb = rows["group_a"].iloc[0], rows["group_b"].iloc[0]
        ax.set_title(f"{attribute}: {ga} vs {gb}")
        if d.empty:
            ax.axis("off")
            ax.text(0.5, 0.5, "\n".join(textwrap.wrap(str(rows["reason"].iloc[0]), 45)), ha="center", va="center",
                    fontsize=8, transform=ax.transAxes)
            continue
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
                       marker=markers[ds], s=40, linewidth=1.0, zorder=2)
        _label_points(ax, x, y, d["encoder"])
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal")
        ax.set_xlabel(f"{attribute} {ga}: test {metric} (%)")
        ax.set_ylabel(f"{attribute} {gb}: test {metric} (%)")
        ax.grid(alpha=0.3)
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], marker=markers[ds], ls="", color="0.3", label=ds) for ds in datasets]
    leg = axes[0, -1].legend(handles=handles, title="dataset", frameon=False, loc="lower left",
                             bbox_to_anchor=(1.02, 0.0)) if handles else None
    domain_legend(axes[0, -1], encoders, points["encoder"].unique(), loc="upper left", bbox_to_anchor=(1.02, 1.0))
    if leg is not None:
        axes[0, -1].add_artist(leg)
    if title:
        fig.suptitle(title + "\none point per encoder and dataset (mean over seeds); hollow: a group below the "
                             "minimum size", fontsize=9)
    fig.tight_layout()
    paths = save(fig, out_png)
    plt.close(fig)
    return paths


def lr_transfer_figure(table: pd.DataFrame, encoders: dict[str, dict], out_png, *, title: str | None = None
                       ) -> list[str]:
    """OcularBench Figs. A.14/A.15: per swept encoder (rows) and sweep stage (columns), the validation metric over
    the learning-rate grid on the sweep task and on the transfer-check task side by side; the dotted line marks the
    lr chosen on the sweep task, stars each task's own optimum (lowest validation loss)."""
    if table.empty:
        raise ValueError("lr_transfer_figure: empty table")
    encs = [e for e in encoders if e in set(table["encoder"])] + sorted(set(table["encoder"]) - set(encoders))
    stages = sorted(table["stage"].unique())
    # Encoders wrap into `per_row` blocks of stage columns; a fixed grid (no layout engine): the paper's grid of
    # 34 swept encoders is ~70 panels, which constrained layout would take seconds per figure to solve.
    per_row = 1 if len(encs) <= 6 else 3
    n_rows = -(-len(encs) // per_row)
    grid_axes = plt.subplots(n_rows, per_row * len(stages), squeeze=False,
                             figsize=(3.4 * per_row * len(stages) + 0.6, 2.7 * n_rows + 1.0))
    fig, grid = grid_axes
    fig.subplots_adjust(left=0.06 / per_row ** 0.5, right=0.98, bottom=0.8 / (2.7 * n_rows + 1.0),
                        top=1 - 0.9 / (2.7 * n_rows + 1.0), hspace=0.75, wspace=0.35)
    axes = np.empty((len(encs), len(stages)), dtype=object)
    for k in range(len(encs)):
        for j in range(len(stages)):
            axes[k, j] = grid[k // per_row, (k % per_row) * len(stages) + j]
    for k in range(len(encs), n_rows * per_row):
        for j in range(len(stages)):
            grid[k // per_row, (k % per_row) * len(stages) + j].set_visible(False)
    metric = table["metric"].iloc[0]
    styles = {"sweep task": dict(ls="-", color="#1f4e79"), "transfer check": dict(ls="--", color="#C44E52")}
    for i, enc in enumerate(encs):
        for j, stage in enumerate(stages):
            ax = axes[i, j]
            d = table[(table["encoder"] == enc) & (table["stage"] == stage)]
            if d.empty:
                ax.axis("off")
                ax.text(0.5, 0.5, "not swept", ha="center", va="center", transform=ax.transAxes)
                continue
            for role, g in d.groupby("role", sort=True):
                g = g.sort_values("lr")
                ax.plot(g["lr"], 100 * g["value"], marker="o", ms=4, label=f"{g['task'].iloc[0]} ({role})",
                        **styles.get(role, {}))
                best = g[np.isclose(g["lr"], g["lr_optimal_here"], rtol=1e-12, atol=0)]
                ax.scatter(best["lr"], 100 * best["value"], marker="*", s=110, zorder=4,
                           color=styles.get(role, {}).get("color", "black"))
            ax.axvline(float(d["lr_chosen"].iloc[0]), color="0.3", lw=0.9, ls=":")
            ax.set_xscale("log")
            lrs = sorted(d["lr"].unique())  # ticks: the grid itself, plain labels (no minor log ticks, no mathtext)
            ax.set_xticks(lrs, [f"{v:.0e}" for v in lrs])
            ax.minorticks_off()
            ax.yaxis.set_major_locator(MaxNLocator(4))
            verdict = "transfers" if bool(d["transfers"].iloc[0]) else "does not transfer"
            ax.set_title(f"{enc}: {d['protocol'].iloc[0]} ({d['lr_name'].iloc[0]})\nchosen lr {verdict}",
                         fontsize=8.5, color=domain_color(encoder_domain(encoders, enc)))
            ax.set_xlabel(d["lr_name"].iloc[0])
            ax.set_ylabel(f"validation {metric} (%)")
            ax.grid(alpha=0.3)
            if i == 0 and j == len(stages) - 1:
                ax.legend(fontsize=7, frameon=False, loc="lower right")
    if title:
        fig.suptitle(title)
    paths = save(fig, out_png)
    plt.close(fig)
    return paths
