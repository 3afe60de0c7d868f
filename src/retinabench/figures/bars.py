"""Bar panels: signed rank distances as in OcularBench (bars of the group mean per pretraining domain or model-size
class, each encoder overlaid as a point, groups ordered by size, Kruskal–Wallis p), leakage rank changes (coloured by
exposure likelihood), top-k rankings and learning-rate sensitivity (coloured by model size). Per-encoder panels put
the encoders on the y axis in one shared order."""
from __future__ import annotations

from retinabench.figures.style import (FONT, LIKELIHOOD_COLORS, SIZE_COLORS, color_ticklabels,  # noqa: I001
                                       domain_handles, encoder_colors, figsize, group_color, save, size_color,
                                       suptitle)

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch


def _fmt_p(p: float) -> str:
    if p != p:
        return "n/a"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _panel_grid(n_panels: int, n_enc: int, max_cols: int = 3):
    """Encoder-per-row panels at double-column width: up to ``max_cols`` panels side by side, ~3.5 mm per
    encoder row."""
    cols = min(n_panels, max_cols)
    rows = -(-n_panels // cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False, sharey=True, layout="constrained",
                             figsize=figsize(rows * (3.5 * n_enc + 28) + 22, "double"))
    for ax in axes.ravel()[n_panels:]:
        ax.set_visible(False)
    return fig, axes


GROUP_TITLES = {"domain": "pretraining domain", "size_class": "model size", "method": "pretraining method",
                "domain_group": "pretraining domain", "method_group": "pretraining method"}


def distance_bars(distances: pd.DataFrame, kruskal: pd.DataFrame, encoders: dict[str, dict], out_png, *,
                  group_by: str = "domain_group", title: str | None = None, label_points: int = 12) -> list[str]:
    """One panel per comparison, as the paper's figures: a bar per encoder group (``group_by``: the paper's
    pretraining-domain group, stats.groups, or ``size_class`` for the learning-rate figure) at the group's mean signed distance, every encoder overlaid as
    a point, groups ordered by size (largest first); the panel title gives the Kruskal–Wallis p across those
    groups. Distances follow stats.distance: (rank_reference − rank_comparison)/√2, positive = better under the
    comparison (the axis label names both sides). Points are labelled when a panel has ≤ ``label_points``."""
    from retinabench.stats.distance import group_means
    names = list(dict.fromkeys(distances["name"]))
    if not names:
        raise ValueError("distance_bars: empty distance table")
    if group_by not in distances.columns:
        raise KeyError(f"distance_bars: the distance table has no {group_by!r} column (add it with with_groups)")
    cols = min(len(names), 3)
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False, layout="constrained",
                             figsize=figsize(rows * 72 + 22, "double"))
    for ax in axes.ravel()[len(names):]:
        ax.set_visible(False)
    lim = max(0.5, float(np.nanmax(np.abs(distances["distance"])))) * 1.15
    for ax, name in zip(axes.ravel(), names):
        d = distances[distances["name"] == name].set_index("encoder")
        ref, cmp_ = d["reference"].iloc[0], d["comparison"].iloc[0]
        g = group_means(d["distance"], d[group_by])
        x = np.arange(len(g))
        ax.bar(x, g["mean"], width=0.7, color=[group_color(group_by, v) for v in g["group"]], alpha=0.85,
               edgecolor="0.25", lw=0.6, zorder=1)
        for xi, group in zip(x, g["group"]):
            members = d[d[group_by] == group].sort_values("distance")
            k = len(members)
            offsets = np.linspace(-0.22, 0.22, k) if k > 1 else np.zeros(1)
            ax.scatter(xi + offsets, members["distance"], s=22, c="white", edgecolors="black", linewidths=0.8,
                       zorder=3)
            if len(d) <= label_points:
                for off, (enc, v) in zip(offsets, members["distance"].items()):
                    ax.annotate(enc, (xi + off, v), xytext=(3, 0), textcoords="offset points",
                                fontsize=FONT["base"], va="center", zorder=4, annotation_clip=True)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_ylim(-lim, lim)
        ax.set_xticks(x, [f"{v} (n={n})" for v, n in zip(g["group"], g["n"])], rotation=30 if len(g) <= 3 else 90,
                      ha="right", rotation_mode="anchor")
        kw = kruskal[(kruskal["name"] == name) & (kruskal["group_by"] == group_by)]
        p = _fmt_p(float(kw["p"].iloc[0])) if len(kw) else "n/a"
        note = f" ({kw['note'].iloc[0]})" if len(kw) and isinstance(kw["note"].iloc[0], str) and kw["note"].iloc[0] \
            else ""
        from retinabench.figures.style import wrap
        width = 180 / cols - 8
        ax.set_title(wrap(f"{name}\nKruskal–Wallis across {GROUP_TITLES.get(group_by, group_by)}: p = {p}{note}",
                          width, FONT["base"]), fontsize=FONT["base"])
        ax.set_ylabel(f"(rank {ref} − rank {cmp_})/√2\n↑ better relative rank under {cmp_}")
        ax.grid(axis="y", alpha=0.3)
    if title:
        suptitle(fig, title + "; bars: group mean; points: encoders; groups ordered by size")
    paths = save(fig, out_png)
    plt.close(fig)
    return paths


def leakage_bars(table: pd.DataFrame, encoders: dict[str, dict], out_png, *, order: list[str],
                 labels: dict[str, str], title: str | None = None) -> list[str]:
    """One panel per leakage subset: each encoder's signed position change (all tasks − subset: positive =
    improved rank on the restricted benchmark), coloured by exposure likelihood (known / likely / possible / unlikely, stats.leakage)."""
    subsets = list(dict.fromkeys(table["subset"]))
    if not subsets:
        raise ValueError("leakage_bars: empty leakage table")
    fig, axes = _panel_grid(len(subsets), len(order))
    y = np.arange(len(order))
    lim = max(1.0, float(np.abs(table["position_change"]).max())) * 1.15
    for ax, name in zip(axes.ravel(), subsets):
        d = table[table["subset"] == name].set_index("encoder").loc[order]
        colors = [LIKELIHOOD_COLORS[v] for v in d["likelihood"]]
        change = d["position_change"].to_numpy()
        ax.barh(y, change, color=colors, height=0.7)
        zero = change == 0  # unchanged encoders get a mark, so no row looks like missing data
        ax.scatter(np.zeros(int(zero.sum())), y[zero], marker="|", s=60, c=np.array(colors)[zero], zorder=3)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_xlim(-lim, lim)
        n, n_all = int(d["n_tasks"].iloc[0]), int(d["n_tasks_all"].iloc[0])
        ax.set_title(f"{labels.get(name, name)}\n{n} of {n_all} tasks kept")
        ax.set_xlabel("position change (all − subset)\n→ improved rank on the subset")
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].set_yticks(y, order)
    axes[0, 0].set_ylim(len(order) - 0.5, -0.5)
    for row in axes:
        color_ticklabels(row[0].get_yticklabels(), encoders)
    present = [k for k in LIKELIHOOD_COLORS if k in set(table["likelihood"])]
    fig.legend(handles=[Patch(facecolor=LIKELIHOOD_COLORS[k], label=k) for k in present],
               title="exposure likelihood", frameon=False, loc="outside lower center", ncol=len(present))
    if title:
        suptitle(fig, title)
    paths = save(fig, out_png)
    plt.close(fig)
    return paths


def top_k_panels(table: pd.DataFrame, encoders: dict[str, dict], out_png, *, titles: dict[str, str],
                 title: str | None = None) -> list[str]:
    """One panel per task subset (all / CFP / OCT): the top-k encoders by mean rank (± sd), best on top."""
    panels = list(dict.fromkeys(table["panel"]))
    if not panels:
        raise ValueError("top_k_panels: empty table")
    k = int(table.groupby("panel").size().max())
    cols = min(len(panels), 3)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False, layout="constrained",
                             figsize=figsize(rows * (4.0 * k + 25) + 25, "double"))
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    xmax = float((table["mean_rank"] + table["sd_rank"].fillna(0)).max()) * 1.1
    for ax, panel in zip(axes.ravel(), panels):
        d = table[table["panel"] == panel].sort_values(["mean_rank", "encoder"])
        y = np.arange(len(d))
        ax.barh(y, d["mean_rank"], xerr=d["sd_rank"].fillna(0).to_numpy(), color=encoder_colors(encoders, d["encoder"]),
                height=0.7, error_kw={"lw": 0.8, "capsize": 2})
        ax.set_yticks(y, [f"{int(p) if float(p).is_integer() else p}. {e}" for p, e in zip(d["position"], d["encoder"])])
        for t, e in zip(ax.get_yticklabels(), d["encoder"]):
            t.set_color(encoder_colors(encoders, [e])[0])
        ax.set_ylim(len(d) - 0.5, -0.5)
        ax.set_xlim(0, xmax)
        # two lines when panels share the width: one line is wider than a narrow panel (clipped at the right)
        ax.set_xlabel("mean rank ± sd (1 = best)" if cols == 1 else "mean rank ± sd\n(1 = best)")
        n = int(d["n_tasks"].iloc[0])
        ax.set_title(f"{titles.get(panel, panel)} ({n} task{'s' if n != 1 else ''})")
        ax.grid(axis="x", alpha=0.3)
    handles = domain_handles(encoders, table["encoder"].unique())
    fig.legend(handles=handles, title="pretraining domain", frameon=False, loc="outside lower center",
               ncol=min(len(handles), 7))
    if title:
        suptitle(fig, title)
    paths = save(fig, out_png)
    plt.close(fig)
    return paths


def sensitivity_bars(table: pd.DataFrame, encoders: dict[str, dict], out_png, *, order: list[str], xlabel: str,
                     title: str | None = None) -> list[str]:
    """Per encoder: mean ± sd over tasks of the test-score drop from optimal to sub-optimal learning rate, bars
    coloured by model-size class (registry ``size_class``; OcularBench Fig. 12); one panel per protocol (column
    ``protocol``; a single panel without it)."""
    table = table if "protocol" in table.columns else table.assign(protocol="")
    protocols = list(dict.fromkeys(table["protocol"]))
    fig, axes = _panel_grid(len(protocols), len(order))
    y = np.arange(len(order))
    for ax, protocol in zip(axes.ravel(), protocols):
        d = table[table["protocol"] == protocol].set_index("encoder").reindex(order)
        ax.barh(y, d["mean_drop"].to_numpy(), xerr=d["sd_drop"].fillna(0).to_numpy(),
                color=[size_color(encoders.get(e, {}).get("size_class")) for e in order], edgecolor="0.3",
                linewidth=0.5, height=0.7, error_kw={"lw": 0.8, "capsize": 2})
        for yy in y[d["mean_drop"].isna().to_numpy()]:
            ax.text(0, yy, " not swept", va="center", color="#666666")
        ax.axvline(0, color="black", lw=0.8)
        from retinabench.figures.style import wrap
        ax.set_xlabel(wrap(xlabel, 170 / len(axes.ravel()) - 10))
        ax.set_title(protocol)
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].set_yticks(y, order)
    axes[0, 0].set_ylim(len(order) - 0.5, -0.5)
    present = {encoders.get(e, {}).get("size_class") for e in order}
    fig.legend(handles=[Patch(facecolor=SIZE_COLORS[k], edgecolor="0.3", label=k) for k in SIZE_COLORS
                        if k in present], title="model size", frameon=False, loc="outside lower center", ncol=6)
    if title:
        suptitle(fig, title)
    paths = save(fig, out_png)
    plt.close(fig)
    return paths
