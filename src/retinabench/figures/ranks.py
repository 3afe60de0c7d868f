"""Rank distribution per encoder: violins over tasks, one point per task, the mean rank marked; encoders
ordered by mean rank; one panel per protocol. Tick labels and violins coloured by pretraining domain. A panel in
which an encoder has fewer than :data:`MIN_VIOLIN_RANKS` ranks draws points only: a kernel density over two or
three ranks is not a distribution."""
from __future__ import annotations

import numpy as np
import pandas as pd
import matplotlib.pyplot as plt

from retinabench.figures.style import color_ticklabels, domain_color, domain_legend, figsize, save, suptitle

MIN_VIOLIN_RANKS = 5


def draws_violins(values: list[np.ndarray]) -> bool:
    """Whether a panel draws violins: every encoder has at least MIN_VIOLIN_RANKS ranks (else points only)."""
    return bool(values) and all(len(v) >= MIN_VIOLIN_RANKS for v in values)


def rank_distribution_figure(ranks: pd.DataFrame, encoders: dict[str, dict], out_png, *, regime: str = "u-u",
                             title: str | None = None, metric: str | None = None,
                             protocols: list[str] | None = None) -> list[str]:
    """``metric`` selects one ranking metric of a multi-metric rank table (column ``metric``); ``protocols``
    orders the panels (default: sorted)."""
    if metric is not None:
        if "metric" not in ranks.columns:
            raise KeyError("rank distribution: metric given but the rank table has no 'metric' column")
        ranks = ranks[ranks["metric"] == metric]
        if ranks.empty:
            raise ValueError(f"rank distribution: no ranks for metric {metric!r}")
    elif "metric" in ranks.columns and ranks["metric"].nunique() > 1:
        raise ValueError(f"rank distribution: the rank table holds metrics {sorted(ranks['metric'].unique())}; "
                         "pass metric=")
    data = ranks[ranks["regime"] == regime]
    if data.empty:
        raise ValueError(f"rank distribution: no ranks for regime {regime!r}")
    present = set(data["protocol"])
    protocols = [p for p in (protocols or sorted(present)) if p in present]
    n_enc = data["encoder"].nunique()
    # double column; per protocol a panel of ~55 mm plus room for the (rotated) encoder names
    label_mm = 2.0 * max(len(str(e)) for e in data["encoder"].unique()) * (0.75 if n_enc <= 12 else 1.0)
    fig, axes = plt.subplots(len(protocols), 1, squeeze=False, layout="constrained",
                             figsize=figsize(len(protocols) * (55 + label_mm) + 25, "double"))
    rng = np.random.default_rng(0)  # jitter only; fixed so the figure is reproducible
    for ax, protocol in zip(axes[:, 0], protocols):
        d = data[data["protocol"] == protocol]
        order = d.groupby("encoder")["rank"].mean().sort_values(kind="stable").index.tolist()
        values = [d.loc[d["encoder"] == e, "rank"].to_numpy() for e in order]
        pos = np.arange(1, len(order) + 1)
        violins = draws_violins(values)
        if violins:
            parts = ax.violinplot(values, positions=pos, showextrema=False, widths=0.8)
            for body, enc in zip(parts["bodies"], order):
                body.set_facecolor(domain_color(encoders.get(enc, {}).get("domain")))
                body.set_alpha(0.35)
        # one collection per panel (not per encoder): same picture, a fraction of the drawing time
        xs = np.concatenate([p + rng.uniform(-0.12, 0.12, len(v)) for p, v in zip(pos, values)])
        colors = np.repeat([domain_color(encoders.get(e, {}).get("domain")) for e in order],
                           [len(v) for v in values])
        ax.scatter(xs, np.concatenate(values), s=12, c=list(colors), zorder=3)
        means = np.array([v.mean() for v in values])
        ax.hlines(means, pos - 0.3, pos + 0.3, color="black", lw=2, zorder=4)
        ax.set_xticks(pos, order, rotation=35 if n_enc <= 12 else 90, ha="right", rotation_mode="anchor")
        color_ticklabels(ax.get_xticklabels(), encoders)
        ax.set_ylabel("rank (1 = best)")
        ax.set_ylim(data["n_encoders"].max() + 0.5, 0.5)
        n_tasks = d["task"].nunique()
        ax.set_title(f"{protocol} — regime {regime}, {n_tasks} task{'s' if n_tasks != 1 else ''}"
                     + ("" if violins else f" (points: under {MIN_VIOLIN_RANKS} ranks per encoder)"))
        ax.grid(axis="y", alpha=0.3)
    if title:
        suptitle(fig, title)
    domain_legend(fig, encoders, sorted(data["encoder"].unique()))
    paths = save(fig, out_png)
    plt.close(fig)
    return paths
