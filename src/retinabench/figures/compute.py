"""Compute-benchmark figures (OcularBench Figs. A.16-A.19): inference memory, inference latency, training memory and
training time per step, one bar per encoder (training: fine-tuning and linear probing side by side), sorted by
value, coloured by pretraining domain."""
from __future__ import annotations

from retinabench.figures.style import color_ticklabels, domain_legend, encoder_colors, save  # noqa: I001

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch

FIGURES = ("inference_memory", "inference_latency", "train_memory", "train_time")
TRAIN_LABELS = {"finetune": "full fine-tuning", "linear_aug": "linear probing (encoder frozen)"}
_MEM_KIND = {"cuda_max_memory_allocated": "torch.cuda.max_memory_allocated",
             "rss_hwm_delta": "resident-set peak above the pre-model baseline",
             "rss_maxrss_delta": "max RSS above the pre-model baseline"}


def _setting(t: pd.DataFrame) -> str:
    """'cpu (Intel ...), fp32, batch 1, 2 threads' — what the numbers were measured under (one line per distinct
    setting when encoders differ)."""
    keys = ["device", "device_name", "dtype", "batch_size", "threads"]
    return "; ".join(f"{d} ({n}), {p}, batch {b}, {th} threads"
                     for d, n, p, b, th in t[keys].drop_duplicates().itertuples(index=False))


def _bars(ax, values: pd.DataFrame, encoders: dict, *, order: list[str], columns: list[str], labels: list[str],
          err_to: str | None = None):
    y = np.arange(len(order))
    h = 0.8 / len(columns)
    for j, (col, label) in enumerate(zip(columns, labels)):
        v = values.loc[order, col].to_numpy(dtype=float)
        off = (j - (len(columns) - 1) / 2) * h
        kw = {"hatch": "////", "edgecolor": "white", "linewidth": 0} if j else {}
        ax.barh(y + off, v, height=h, color=encoder_colors(encoders, order), label=label, **kw)
        if err_to:
            top = values.loc[order, err_to].to_numpy(dtype=float)
            ax.errorbar(v, y + off, xerr=[np.zeros_like(v), np.clip(top - v, 0, None)], fmt="none", ecolor="black",
                        elinewidth=0.8, capsize=2)
    ax.set_yticks(y, order)
    ax.set_ylim(len(order) - 0.5, -0.5)
    color_ticklabels(ax.get_yticklabels(), encoders)
    ax.grid(axis="x", alpha=0.3)


def _figure(n_enc: int):
    return plt.subplots(figsize=(6.0, 1.3 + 0.28 * n_enc), layout="constrained")


def compute_figures(table: pd.DataFrame, encoders: dict[str, dict], out_pngs: dict[str, str]) -> list[str]:
    """The four figures from the collected compute table; ``out_pngs``: figure name -> PNG path. Returns every
    written file (PNG + PDF)."""
    missing = sorted(set(FIGURES) - set(out_pngs))
    if missing:
        raise KeyError(f"compute_figures: no output path for {missing}")
    if table.empty:
        raise ValueError("compute_figures: empty compute table")
    inf = table[table["phase"] == "inference"].set_index("encoder")
    train = table[table["phase"].isin(list(TRAIN_LABELS))]
    protocols = [p for p in TRAIN_LABELS if p in set(train["phase"])]
    paths = []

    # Inference: memory and latency (median, whisker to p90), ascending from the top.
    for name, col, xlabel, err in (("inference_memory", "peak_mem_mb", "peak memory (MiB)", None),
                                   ("inference_latency", "ms_median", "latency per image (ms): median, whisker to p90",
                                    "ms_p90")):
        v = inf.assign(ms_median=inf["seconds_median"] * 1e3, ms_p90=inf["seconds_p90"] * 1e3)
        order = list(v[col].sort_values(kind="stable").index)
        fig, ax = _figure(len(order))
        _bars(ax, v, encoders, order=order, columns=[col], labels=[name], err_to=err)
        ax.set_xlabel(xlabel)
        kind = ", ".join(sorted(_MEM_KIND.get(k, k) for k in set(inf["peak_mem_kind"])))
        ax.set_title(f"Inference {'memory' if 'memory' in name else 'latency'} — {_setting(inf)}"
                     + (f"\n{kind}" if "memory" in name else ""), fontsize=8)
        domain_legend(fig, encoders, order, loc="outside lower center", ncol=7)
        paths += save(fig, out_pngs[name])
        plt.close(fig)

    # Training: memory and time per step, fine-tuning and linear probing side by side, sorted by fine-tuning.
    if not protocols:
        raise ValueError("compute_figures: the table has no training rows (compute.training.protocols is empty)")
    for name, col, xlabel in (("train_memory", "peak_mem_mb", "peak memory (MiB)"),
                              ("train_time", "seconds_median", "time per optimisation step (s), median")):
        wide = train.pivot(index="encoder", columns="phase", values=col)[protocols]
        order = list(wide[protocols[0]].sort_values(kind="stable").index)
        fig, ax = _figure(len(order))
        _bars(ax, wide, encoders, order=order, columns=protocols, labels=[TRAIN_LABELS[p] for p in protocols])
        ax.set_xlabel(xlabel)
        setting = _setting(train.drop_duplicates("encoder"))
        ax.set_title(f"Training {'memory' if 'memory' in name else 'time per step'} — {setting}", fontsize=8)
        ax.legend(handles=[Patch(facecolor="#8C8C8C", label=TRAIN_LABELS[p], hatch="////" if j else None,
                                 edgecolor="white", linewidth=0) for j, p in enumerate(protocols)],
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
        domain_legend(fig, encoders, order, loc="outside lower center", ncol=7)
        paths += save(fig, out_pngs[name])
        plt.close(fig)
    return paths
