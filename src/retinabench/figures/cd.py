"""Critical-difference diagrams (Demšar 2006) drawn by scikit-posthocs: encoders placed by mean rank, encoders
the Nemenyi test cannot tell apart (p >= alpha) joined by a bar, the CD drawn above the axis; one panel per
protocol, encoder labels coloured by pretraining domain."""
from __future__ import annotations

from dataclasses import dataclass

from retinabench.figures.style import (DOMAIN_COLORS, FONT, domain_legend, encoder_domain,  # noqa: I001
                                       figsize, save, suptitle, wrap)

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import pandas as pd
import scikit_posthocs as sp


@dataclass
class CDPanel:
    title: str
    mean_rank: pd.Series          # per encoder
    p_values: pd.DataFrame        # Nemenyi, encoders × encoders
    cd: float


def cd_figure(panels: list[CDPanel], encoders: dict[str, dict], out_png, *, alpha: float = 0.05,
              title: str | None = None) -> list[str]:
    if not panels:
        raise ValueError("cd_figure: no panels")
    names = sorted(set().union(*[set(p.mean_rank.index) for p in panels]))
    fig = plt.figure(figsize=figsize(40, "double"), layout="constrained")
    gs = fig.add_gridspec(len(panels), 1)
    spans = []
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(gs[i, 0])
        hue = pd.Series({e: encoder_domain(encoders, e) or "none" for e in panel.mean_rank.index})
        palette = {d: DOMAIN_COLORS.get(d, "#8C8C8C") for d in hue.unique()}
        sp.critical_difference_diagram(panel.mean_rank, panel.p_values, alpha=alpha, ax=ax,
                                       hue=hue, color_palette=palette,
                                       label_fmt_left="{label} ({rank:.2f})", label_fmt_right="({rank:.2f}) {label}",
                                       label_props={"fontsize": FONT["base"]}, crossbar_props={"color": "black"})
        k = len(panel.mean_rank)
        # The CD bar (drawn here, above the tick labels, rather than by scikit-posthocs on top of them).
        ax.plot([1, 1 + panel.cd], [2.0, 2.0], color="black", lw=2, clip_on=False)
        ax.plot([1, 1], [1.8, 2.2], color="black", lw=1, clip_on=False)
        ax.plot([1 + panel.cd, 1 + panel.cd], [1.8, 2.2], color="black", lw=1, clip_on=False)
        ax.text(1 + panel.cd + 0.15, 2.0, f"CD = {panel.cd:.2f} (α = {alpha:g})", va="center")
        y0, _ = ax.get_ylim()
        ax.set_ylim(y0 - 0.3, 2.6)
        ax.set_xlim(0.5, k + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=min(k, 18)))
        ax.set_title(wrap(panel.title, 170), pad=4)
        spans.append(2.9 - y0)
    gs.set_height_ratios(spans)
    # ~4.5 mm per label row (scikit-posthocs stacks half the encoders on each side), title and legend rows
    fig.set_size_inches(*figsize(4.8 * sum(spans) + 14 * len(panels) + 28, "double"))
    if title:
        suptitle(fig, title)
    domain_legend(fig, encoders, names)
    paths = save(fig, out_png)
    plt.close(fig)
    return paths
