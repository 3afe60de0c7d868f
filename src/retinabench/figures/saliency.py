"""Saliency figure of one task (OcularBench Figs. A.7-A.9): rows = encoders, one column group per class (its test
image), each group = the input image beside the CLAHE-equalised attribution heatmap of every protocol (fine-tuned,
linear probe) side by side; under each heatmap the model's prediction (green: correct, red: wrong)."""
from __future__ import annotations

from retinabench.figures.style import (FONT, WIDTH_MM, domain_color, domain_legend, figsize, save,  # noqa: I001
                                       suptitle)  # (style sets the Agg backend)

import matplotlib.pyplot as plt
import pandas as pd

from retinabench.saliency.postprocess import heatmap

PROTOCOL_LABELS = {"finetune": "fine-tuned", "linear_aug": "linear probe"}


def saliency_figure(task: dict, results: dict[str, tuple[pd.DataFrame, dict]], encoders: dict[str, dict], out_png,
                    *, protocols: list[str], colormap: str = "inferno", title: str | None = None) -> list[str]:
    """``results``: encoder -> (saliency table, maps) in row order, as ``saliency.run_saliency`` returns them."""
    if not results:
        raise ValueError(f"saliency figure of {task['name']}: no encoder results")
    classes = list(task["classes"])
    # Column groups: every (class, image) any encoder has, in class order; classes without a test image get an
    # empty group that says so.
    groups: list[tuple[int, str | None]] = []
    for c in range(len(classes)):
        ids = list(dict.fromkeys(i for table, _ in results.values()
                                 for i in table.loc[table["class_index"] == c, "image_id"]))
        groups += [(c, i) for i in ids] or [(c, None)]
    per = 1 + len(protocols)
    n_rows, n_cols = len(results), len(groups) * per
    # Drawn at print size (figures/style.py): double-column width, square cells sized to fit it beside the
    # encoder names and the colour bar, a row per encoder (captions under the heatmaps), titles and legend.
    cell_mm = min(30.0, (WIDTH_MM["double"] - 45.0) / n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, squeeze=False, layout="constrained",
                             figsize=figsize(n_rows * (cell_mm + 9) + 45, "double"),
                             gridspec_kw={"wspace": 0.02, "hspace": 0.02})
    for r, (enc, (table, maps)) in enumerate(results.items()):
        map_protocols = list(maps["protocols"])
        image_ids = list(maps["image_ids"])
        for g, (c, image_id) in enumerate(groups):
            cell = axes[r, g * per:(g + 1) * per]
            for ax in cell:
                ax.set_xticks([])
                ax.set_yticks([])
                for s in ax.spines.values():
                    s.set_visible(False)
            if r == 0:
                head = classes[c] if image_id is None else f"{classes[c]}\n{image_id}"
                cell[0].set_title(head, fontsize=FONT["base"], loc="left")
            if image_id is None or image_id not in image_ids:
                cell[0].text(0.0, 0.5, "no test image\nof this class", fontsize=FONT["base"],
                             transform=cell[0].transAxes)
                continue
            k = image_ids.index(image_id)
            cell[0].imshow(maps["image"][k])
            if r == 0 and g == 0:
                cell[0].set_xlabel("input", fontsize=FONT["base"])
            for j, protocol in enumerate(protocols, start=1):
                ax = cell[j]
                if protocol not in map_protocols:
                    ax.text(0.1, 0.5, f"no {PROTOCOL_LABELS.get(protocol, protocol)}\nmodel",
                            fontsize=FONT["base"], transform=ax.transAxes)
                    continue
                ax.imshow(heatmap(maps["clahe"][map_protocols.index(protocol), k], colormap))
                row = table[(table["protocol"] == protocol) & (table["image_id"] == image_id)].iloc[0]
                ax.set_xlabel(f"{row['predicted']}\n({row['p_predicted']:.2f})", fontsize=FONT["base"],
                              color="#2a7a2a" if row["correct"] else "#b22222")
                if r == 0:
                    ax.set_title(PROTOCOL_LABELS.get(protocol, protocol).replace(" ", "\n"), fontsize=FONT["base"])
        axes[r, 0].set_ylabel(enc.replace("_", "_\n", 1) if len(enc) > 14 else enc, fontsize=FONT["base"], rotation=0, ha="right", va="center",
                              color=domain_color((encoders.get(enc) or {}).get("domain")))
    s = results[next(iter(results))][0]
    settings = (f"integrated gradients × NoiseTunnel ({s['nt_type'].iloc[0]}, {s['nt_samples'].iloc[0]} samples, "
                f"sd {s['stdev'].iloc[0]:g}, {s['n_steps'].iloc[0]} steps), predicted class; |Σ channels| → CLAHE")
    suptitle(fig, f"{title or 'Saliency: ' + task['name']}; {settings}")
    import matplotlib as mpl
    bar = fig.colorbar(mpl.cm.ScalarMappable(norm=mpl.colors.Normalize(0, 1), cmap=colormap), ax=axes,
                       fraction=0.015, pad=0.01)
    bar.set_label("attribution (CLAHE)", fontsize=FONT["base"])
    bar.ax.tick_params(labelsize=FONT["base"])
    domain_legend(fig, encoders, list(results))  # below the panels (outside the data)
    paths = save(fig, out_png)
    plt.close(fig)
    return paths
