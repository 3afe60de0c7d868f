"""Rank distribution per encoder: violins over tasks, one point per task, the mean rank marked; encoders
ordered by mean rank; one panel per protocol."""
from __future__ import annotations

import numpy as np
import pandas as pd
import matplotlib.pyplot as plt

from retinabench.figures.style import domain_color, save


def rank_distribution_figure(ranks: pd.DataFrame, encoders: dict[str, dict], out_png, *, regime: str = "u-u",
                             title: str | None = None) -> list[str]:
    data = ranks[ranks["regime"] == regime]
    if data.empty:
        raise ValueError(f"rank distribution: no ranks for regime {regime!r}")
    protocols = sorted(data["protocol"].unique())
    n_enc = data["encoder"].nunique()
    fig, axes = plt.subplots(len(protocols), 1, figsize=(max(4.0, 0.6 * n_enc + 2), 2.8 * len(protocols)),
                             squeeze=False)
    rng = np.random.default_rng(0)  # jitter only; fixed so the figure is reproducible
    for ax, protocol in zip(axes[:, 0], protocols):
        d = data[data["protocol"] == protocol]
        order = d.groupby("encoder")["rank"].mean().sort_values(kind="stable").index.tolist()
        values = [d.loc[d["encoder"] == e, "rank"].to_numpy() for e in order]
        pos = np.arange(1, len(order) + 1)
        if all(len(v) > 1 for v in values):
            parts = ax.violinplot(values, positions=pos, showextrema=False, widths=0.8)
            for body, enc in zip(parts["bodies"], order):
                body.set_facecolor(domain_color(encoders.get(enc, {}).get("domain")))
                body.set_alpha(0.35)
        for p, v, enc in zip(pos, values, order):
            c = domain_color(encoders.get(enc, {}).get("domain"))
            ax.scatter(p + rng.uniform(-0.12, 0.12, len(v)), v, s=12, color=c, zorder=3)
            ax.hlines(v.mean(), p - 0.3, p + 0.3, color="black", lw=2, zorder=4)
        ax.set_xticks(pos, order, rotation=30, ha="right")
        ax.set_ylabel("rank (1 = best)")
        ax.set_ylim(data["n_encoders"].max() + 0.5, 0.5)
        ax.set_title(f"{protocol} — regime {regime}, {d['task'].nunique()} tasks", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    paths = save(fig, out_png)
    plt.close(fig)
    return paths
