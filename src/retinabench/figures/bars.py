"""Per-encoder bar panels: signed rank distances (with Kruskal–Wallis p-values), leakage rank changes (coloured by
exposure likelihood), top-k rankings and learning-rate sensitivity. Encoders on the y axis, one shared order."""
from __future__ import annotations

from retinabench.figures.style import (LIKELIHOOD_COLORS, color_ticklabels, domain_handles,  # noqa: I001
                                       encoder_colors, save)

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch


def _fmt_p(p: float) -> str:
    if p != p:
        return "n/a"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _panel_grid(n_panels: int, n_enc: int, width: float = 2.6, max_cols: int = 4):
    cols = min(n_panels, max_cols)
    rows = -(-n_panels // cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False, sharey=True, layout="constrained",
                             figsize=(1.8 + cols * width, rows * (0.22 * n_enc + 1.3) + 1.0))
    for ax in axes.ravel()[n_panels:]:
        ax.set_visible(False)
    return fig, axes


def distance_bars(distances: pd.DataFrame, kruskal: pd.DataFrame, encoders: dict[str, dict], out_png, *,
                  order: list[str], title: str | None = None) -> list[str]:
    """One panel per comparison: signed rank distance per encoder, coloured by pretraining domain; the panel
    title gives the Kruskal–Wallis p-values across domains and across methods."""
    comparisons = list(dict.fromkeys(distances["comparison"]))
    if not comparisons:
        raise ValueError("distance_bars: empty distance table")
    fig, axes = _panel_grid(len(comparisons), len(order))
    lim = max(0.5, float(np.nanmax(np.abs(distances["distance"])))) * 1.1
    y = np.arange(len(order))
    for ax, name in zip(axes.ravel(), comparisons):
        d = distances[distances["comparison"] == name].set_index("encoder")
        missing = [e for e in order if e not in d.index]
        if missing:
            raise ValueError(f"distance_bars: comparison {name!r} lacks encoders {missing}")
        vals = d.loc[order, "distance"].to_numpy()
        ax.barh(y, vals, color=encoder_colors(encoders, order), height=0.7)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_xlim(-lim, lim)
        kw = kruskal[kruskal["comparison"] == name].set_index("group_by")
        ps = ", ".join(f"{g} p={_fmt_p(kw.loc[g, 'p'])}" for g in kw.index)
        ax.set_title(f"{name}\nKW {ps}" if ps else name, fontsize=8.5)
        ax.set_xlabel("(rank A − rank B)/√2  →  worse under A")
        ax.grid(axis="x", alpha=0.3)
    ax0 = axes[0, 0]
    ax0.set_yticks(y, order)
    ax0.set_ylim(len(order) - 0.5, -0.5)
    for row in axes:
        color_ticklabels(row[0].get_yticklabels(), encoders)
    if title:
        fig.suptitle(title)
    fig.legend(handles=domain_handles(encoders, order), title="pretraining domain", frameon=False,
               loc="outside lower center", ncol=7)
    paths = save(fig, out_png)
    plt.close(fig)
    return paths


def leakage_bars(table: pd.DataFrame, encoders: dict[str, dict], out_png, *, order: list[str],
                 labels: dict[str, str], title: str | None = None) -> list[str]:
    """One panel per leakage subset: each encoder's signed position change (subset − all tasks), coloured by
    exposure likelihood (known / possible / unlikely)."""
    subsets = list(dict.fromkeys(table["subset"]))
    if not subsets:
        raise ValueError("leakage_bars: empty leakage table")
    fig, axes = _panel_grid(len(subsets), len(order), width=3.0)
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
        ax.set_title(f"{labels.get(name, name)}\n{n} of {n_all} tasks kept", fontsize=9)
        ax.set_xlabel("position change (subset − all)\n→ drops without exposed tasks")
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].set_yticks(y, order)
    axes[0, 0].set_ylim(len(order) - 0.5, -0.5)
    for row in axes:
        color_ticklabels(row[0].get_yticklabels(), encoders)
    present = [k for k in LIKELIHOOD_COLORS if k in set(table["likelihood"])]
    fig.legend(handles=[Patch(facecolor=LIKELIHOOD_COLORS[k], label=k) for k in present],
               title="exposure likelihood", frameon=False, loc="outside lower center", ncol=len(present))
    if title:
        fig.suptitle(title)
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
    fig, axes = plt.subplots(1, len(panels), squeeze=False, layout="constrained",
                             figsize=(1.0 + 3.6 * len(panels), 0.35 * k + 2.0))
    xmax = float((table["mean_rank"] + table["sd_rank"].fillna(0)).max()) * 1.1
    for ax, panel in zip(axes[0], panels):
        d = table[table["panel"] == panel].sort_values(["mean_rank", "encoder"])
        y = np.arange(len(d))
        ax.barh(y, d["mean_rank"], xerr=d["sd_rank"].fillna(0).to_numpy(), color=encoder_colors(encoders, d["encoder"]),
                height=0.7, error_kw={"lw": 0.8, "capsize": 2})
        ax.set_yticks(y, [f"{int(p) if float(p).is_integer() else p}. {e}" for p, e in zip(d["position"], d["encoder"])])
        for t, e in zip(ax.get_yticklabels(), d["encoder"]):
            t.set_color(encoder_colors(encoders, [e])[0])
        ax.set_ylim(len(d) - 0.5, -0.5)
        ax.set_xlim(0, xmax)
        ax.set_xlabel("mean rank ± sd (1 = best)")
        n = int(d["n_tasks"].iloc[0])
        ax.set_title(f"{titles.get(panel, panel)} ({n} task{'s' if n != 1 else ''})")
        ax.grid(axis="x", alpha=0.3)
    fig.legend(handles=domain_handles(encoders, table["encoder"].unique()), title="pretraining domain",
               frameon=False, loc="outside lower center", ncol=7)
    if title:
        fig.suptitle(title)
    paths = save(fig, out_png)
    plt.close(fig)
    return paths


def sensitivity_bars(table: pd.DataFrame, encoders: dict[str, dict], out_png, *, order: list[str], xlabel: str,
                     title: str | None = None) -> list[str]:
    """Per encoder: mean ± sd over tasks of the test-score drop from optimal to sub-optimal learning rate; one
    panel per protocol (column ``protocol``; a single panel without it)."""
    table = table if "protocol" in table.columns else table.assign(protocol="")
    protocols = list(dict.fromkeys(table["protocol"]))
    fig, axes = _panel_grid(len(protocols), len(order), width=3.2)
    y = np.arange(len(order))
    for ax, protocol in zip(axes.ravel(), protocols):
        d = table[table["protocol"] == protocol].set_index("encoder").reindex(order)
        ax.barh(y, d["mean_drop"].to_numpy(), xerr=d["sd_drop"].fillna(0).to_numpy(),
                color=encoder_colors(encoders, order), height=0.7, error_kw={"lw": 0.8, "capsize": 2})
        for yy in y[d["mean_drop"].isna().to_numpy()]:
            ax.text(0, yy, " not swept", va="center", fontsize=7, color="#666666")
        ax.axvline(0, color="black", lw=0.8)
        ax.set_xlabel(xlabel)
        ax.set_title(protocol, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].set_yticks(y, order)
    axes[0, 0].set_ylim(len(order) - 0.5, -0.5)
    for row in axes:
        color_ticklabels(row[0].get_yticklabels(), encoders)
    fig.legend(handles=domain_handles(encoders, order), title="pretraining domain", frameon=False,
               loc="outside lower center", ncol=7)
    if title:
        fig.suptitle(title)
    paths = save(fig, out_png)
    plt.close(fig)
    return paths
