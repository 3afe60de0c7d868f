"""Forest plots of the protocol-sensitivity table (retinabench.reliability.sensitivity): per convention, one panel
per metric family (macro AUROC and top-label ECE of multi-class tasks join AUROC and ECE), one row per (model, task, overall or fairness gap) with delta = value b − value a and its paired
bootstrap CI; a red marker where a conclusion changes (docs/reliability.md, "Protocol sensitivity")."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from retinabench.figures import style  # noqa: F401  (sets the Agg backend and rcParams before pyplot)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from retinabench.metrics.table import metric_family  # noqa: E402
from retinabench.figures.style import FONT, MAX_HEIGHT_MM, figsize, page_slices, save, suptitle  # noqa: E402

ROW_MM, CHROME_MM = 3.4, 30.0
CHANGED, KEPT = "#c0392b", "0.25"


def file_stem(convention: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", convention.lower()).strip("_")


def panel(metric: str) -> str:
    """The panel of a metric: its family (auroc_macro -> auroc, ece_top_label -> ece), suffix kept ("auroc delta
    CI width")."""
    head, _, tail = metric.partition(" ")
    return f"{metric_family(head)} {tail}".strip()


def _label(r: pd.Series) -> str:
    what = f"{r['attribute']} gap" if r["attribute"] else "overall"
    return f"{r['encoder']} | {r['protocol']} | {r['task']} | {what}"


def forest_plots(table: pd.DataFrame, out_dir: str | Path) -> list[str]:
    """One PNG (and PDF) per convention with compared rows, pages of at most what fits the page height; a
    convention whose every row was skipped gets none (the table says why). Returns the written paths."""
    paths: list[str] = []
    done = table[~table["skipped"].astype(bool)]
    per_page = max(1, int((MAX_HEIGHT_MM - CHROME_MM) / ROW_MM))
    for convention, part in done.groupby("convention", sort=True):
        labels = list(dict.fromkeys(_label(r) for _, r in part.iterrows()))
        part = part.assign(panel=[panel(m) for m in part["metric"]])
        metrics = list(dict.fromkeys(part["panel"]))
        pages = page_slices(len(labels), per_page)
        for i, sl in enumerate(pages):
            rows = labels[sl]
            fig, axes = plt.subplots(1, len(metrics), figsize=figsize(CHROME_MM + ROW_MM * len(rows)), sharey=True,
                                     squeeze=False, layout="constrained")
            y_of = {lab: k for k, lab in enumerate(rows)}
            for ax, metric in zip(axes[0], metrics):
                m = part[part["panel"] == metric]
                m = m[[_label(r) in y_of for _, r in m.iterrows()]]
                for _, r in m.iterrows():
                    y = y_of[_label(r)]
                    color = CHANGED if r["conclusion_changes"] else KEPT
                    if np.isfinite(r["ci_low"]) and np.isfinite(r["ci_high"]):
                        ax.plot([r["ci_low"], r["ci_high"]], [y, y], color=color, lw=0.9)
                    ax.plot([r["delta"]], [y], marker="D" if r["conclusion_changes"] else "o", ms=3, color=color,
                            ls="")
                ax.axvline(0, color="0.6", lw=0.7, ls=":")
                ax.set_title(metric, fontsize=FONT["base"])
                ax.set_xlabel(f"{part['variant_b'].iloc[0]} − {part['variant_a'].iloc[0]}")
            axes[0][0].set_yticks(range(len(rows)), rows)
            axes[0][0].set_ylim(len(rows) - 0.5, -0.5)
            handles = [Line2D([], [], marker="o", color=KEPT, ls="", label="conclusion kept"),
                       Line2D([], [], marker="D", color=CHANGED, ls="", label="conclusion changes")]
            fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False)
            page = f" (page {i + 1} of {len(pages)})" if len(pages) > 1 else ""
            suptitle(fig, f"{convention}: {part['variant_b'].iloc[0]} vs {part['variant_a'].iloc[0]}, delta with "
                          f"its paired bootstrap CI{page}")
            name = file_stem(str(convention)) + (f"_{i + 1}" if len(pages) > 1 else "")
            paths += save(fig, Path(out_dir) / f"{name}.png")
            plt.close(fig)
    return paths
