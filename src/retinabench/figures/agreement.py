"""Protocol agreement figures: mean-rank heatmaps (encoders × protocols, balanced / unbalanced data) and Spearman
correlation matrices between the encoder rankings of protocols or data regimes."""
from __future__ import annotations

from retinabench.figures.style import (FONT, color_ticklabels, domain_legend,  # noqa: I001
                                       figsize, save, suptitle)

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
import pandas as pd


def _text_color(cmap, norm, v: float) -> str:
    r, g, b, _ = cmap(norm(v))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def _annotate(ax, values: np.ndarray, fmt: str, cmap, norm, fontsize: float = FONT["base"]) -> None:
    for (i, j), v in np.ndenumerate(values):
        if v != v:
            ax.text(j, i, "n/a", ha="center", va="center", fontsize=fontsize, color="black")
            continue
        ax.text(j, i, format(v, fmt), ha="center", va="center", fontsize=fontsize, color=_text_color(cmap, norm, v))


def heatmap_panels(panels: dict[str, pd.DataFrame], encoders: dict[str, dict], out_png, *, order: list[str],
                   value_label: str, title: str | None = None, fmt: str = ".1f", cmap: str = "viridis_r",
                   vmin: float | None = None, vmax: float | None = None) -> list[str]:
    """Side-by-side heatmaps of encoders (rows, in ``order``) × columns; one panel per dict entry."""
    if not panels:
        raise ValueError("heatmap_panels: no panels")
    n_rows = len(order)
    n_cols = max(m.shape[1] for m in panels.values())
    all_values = np.concatenate([m.to_numpy(dtype=float).ravel() for m in panels.values()])
    vmin = np.nanmin(all_values) if vmin is None else vmin
    vmax = np.nanmax(all_values) if vmax is None else vmax
    cmap_obj = plt.get_cmap(cmap)
    norm = Normalize(vmin=vmin, vmax=vmax)
    # ~1.6 mm per label character at 7 pt, ~11 mm per heatmap column, at most double-column width
    width_mm = 1.6 * max(len(e) for e in order) + 8 + len(panels) * (11 * n_cols + 10) + 20
    fig, axes = plt.subplots(1, len(panels), squeeze=False, sharey=True, layout="constrained",
                             figsize=figsize(4.2 * n_rows + 60, min(180.0, max(88.0, width_mm))))
    for ax, (name, m) in zip(axes[0], panels.items()):
        missing = [e for e in order if e not in m.index]
        if missing:
            raise ValueError(f"heatmap panel {name!r}: no values for encoders {missing}")
        m = m.loc[order]
        ax.imshow(m.to_numpy(dtype=float), cmap=cmap_obj, norm=norm, aspect="auto")
        _annotate(ax, m.to_numpy(dtype=float), fmt, cmap_obj, norm)
        ax.set_xticks(range(m.shape[1]), list(m.columns), rotation=30, ha="right", rotation_mode="anchor")
        ax.set_title(name)
    axes[0, 0].set_yticks(range(n_rows), order)
    color_ticklabels(axes[0, 0].get_yticklabels(), encoders)
    cbar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap_obj), ax=axes[0].tolist(), shrink=0.9)
    cbar.set_label(value_label)
    if title:
        suptitle(fig, title)
    domain_legend(fig, encoders, order)
    paths = save(fig, out_png)
    plt.close(fig)
    return paths


def spearman_figure(matrices: dict[str, tuple[pd.DataFrame, pd.DataFrame]], out_png, *, alpha: float = 0.05,
                    title: str | None = None, n_encoders: int | None = None) -> list[str]:
    """One Spearman-rho matrix per panel (values annotated, * where p < alpha, diagonal blank)."""
    if not matrices:
        raise ValueError("spearman_figure: no matrices")
    n = max(r.shape[0] for r, _ in matrices.values())
    label_mm = 1.6 * max(len(str(c)) for r, _ in matrices.values() for c in r.columns)
    side = min(85.0, 10.0 * n + label_mm + 8)
    cols = min(len(matrices), max(1, int(170 // side)))
    rows = -(-len(matrices) // cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False, layout="constrained",
                             figsize=figsize(rows * (side + 6) + 22, min(180.0, max(88.0, cols * side + 20))))
    for ax in axes.ravel()[len(matrices):]:
        ax.set_visible(False)
    im = None
    for ax, (name, (rho, p)) in zip(axes.ravel(), matrices.items()):
        values = rho.to_numpy(dtype=float).copy()
        np.fill_diagonal(values, np.nan)
        im = ax.imshow(np.ma.masked_invalid(values), cmap="RdBu_r", vmin=-1, vmax=1)
        for (i, j), v in np.ndenumerate(values):
            if i == j:
                continue
            star = "*" if p.iat[i, j] < alpha else ""
            ax.text(j, i, "n/a" if v != v else f"{v:.2f}{star}", ha="center", va="center", fontsize=FONT["base"],
                    color="white" if v == v and abs(v) > 0.6 else "black")
        ax.set_xticks(range(rho.shape[1]), list(rho.columns), rotation=30, ha="right", rotation_mode="anchor")
        ax.set_yticks(range(rho.shape[0]), list(rho.index))
        ax.set_title(name)
    assert im is not None  # matrices is not empty (one panel each)
    cbar = fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.04, pad=0.03)
    cbar.set_label("Spearman ρ")
    sub = f"* p < {alpha:g} (two-sided)" + (f"; {n_encoders} encoders" if n_encoders else "")
    suptitle(fig, f"{title}; {sub}" if title else sub)
    paths = save(fig, out_png)
    plt.close(fig)
    return paths
