"""Per-encoder scatter plots: fine-tuning minus linear-probe gap against parameter count, and subgroup
performance (e.g. age < 60 vs ≥ 60, female vs male). One point per encoder, coloured by pretraining domain."""
from __future__ import annotations

from retinabench.figures.style import domain_legend, encoder_colors, save  # noqa: I001 (Agg first)

import matplotlib.pyplot as plt
import numpy as np
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
    """One panel per attribute: x = group A's value, y = group B's, one point per encoder, the diagonal y = x."""
    attributes = list(dict.fromkeys(table["attribute"]))
    if not attributes:
        raise ValueError("subgroup_figure: empty table")
    fig, axes = plt.subplots(1, len(attributes), squeeze=False, figsize=(4.2 * len(attributes) + 1.6, 4.4))
    metric = table["metric"].iloc[0]
    for ax, attribute in zip(axes[0], attributes):
        d = table[table["attribute"] == attribute]
        x, y = 100 * d["value_a"].to_numpy(float), 100 * d["value_b"].to_numpy(float)
        lo, hi = float(np.nanmin([x.min(), y.min()])) - 2, float(np.nanmax([x.max(), y.max()])) + 2
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, ls="--", zorder=1)
        ax.scatter(x, y, c=encoder_colors(encoders, d["encoder"]), s=36, edgecolor="black", linewidth=0.4, zorder=2)
        _label_points(ax, x, y, d["encoder"])
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal")
        ax.set_xlabel(f"{attribute} {d['group_a'].iloc[0]}: test {metric} (%)")
        ax.set_ylabel(f"{attribute} {d['group_b'].iloc[0]}: test {metric} (%)")
        ax.set_title(f"{attribute}: {d['group_a'].iloc[0]} vs {d['group_b'].iloc[0]}")
        ax.grid(alpha=0.3)
    domain_legend(axes[0, -1], encoders, table["encoder"].unique(), loc="upper left", bbox_to_anchor=(1.02, 1.0))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    paths = save(fig, out_png)
    plt.close(fig)
    return paths
