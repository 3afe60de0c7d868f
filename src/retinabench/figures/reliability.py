"""Reliability figures: reliability diagrams (before/after temperature scaling), fairness/quality gaps with CIs,
the OcularBench subgroup scatter (metric in group a vs group b), and in- vs out-of-distribution transfer bars.

Each figure is a *panel group* written as one file per group into its folder, so that a paper-sized grid never
becomes one giant sheet: reliability diagrams one file per dataset, gaps and the subgroup scatter one file per
attribute, transfer one file per harmonised task. A group too tall for a page is split into parts. Rows and panels
without data are left out, and each function returns them as skipped records (``part``, ``reason``, ``n``) that
the stage writes beside the figures and the skipped-analyses table collects.

Each function takes the collected reliability tables, the encoder registry entries (colours by pretraining
domain), the output folder and the selection (protocol, regime, seed, threshold, metric, source), and returns
``(paths written, skipped records)``.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from retinabench.figures import style  # noqa: F401  (sets the Agg backend and rcParams before pyplot)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from retinabench.metrics.table import metric_family, metric_family_names  # noqa: E402
from retinabench.figures.style import (BASELINE_STYLE, FONT, MAX_HEIGHT_MM, domain_color,  # noqa: E402
                                       encoder_domain, figsize, save, suptitle)

from retinabench.figures.reliability_layout import (_CHROME_MM, _encoder_order, _err, _pack,  # noqa: E402,F401
                                                    _page_names, _sel_text, _select, _skip, _unit, file_stem)


# --------------------------------------------------------------------------------------------------------------
# reliability diagrams: one file per dataset; per task a row block of encoder panels
# --------------------------------------------------------------------------------------------------------------
_DIAGRAM_COLS = 5
_DIAGRAM_ROW_MM = 40.0


def reliability_diagrams(tables: dict, encoders: dict, out_dir, sel: dict, **_) -> tuple[list[str], list[dict]]:
    bins = _select(tables["bins"], sel)
    cal = _select(tables["calibration"], sel)
    if bins.empty:
        return [], [_skip("all", f"no calibration bins for {_sel_text(sel)}")]
    paths: list[str] = []
    skipped: list[dict] = []
    encs_all = _encoder_order(encoders, bins["encoder"].unique())
    for dataset in sorted(bins["dataset"].unique()):
        db = bins[bins["dataset"] == dataset]
        tasks = sorted(db["task"].unique())
        ncols = min(_DIAGRAM_COLS, len(encs_all))
        blocks = []
        for task in tasks:
            encs = [e for e in encs_all if e in set(db.loc[db["task"] == task, "encoder"])]
            blocks.append(((task, encs), -(-len(encs) // ncols) * _DIAGRAM_ROW_MM + 6))
        pages = _pack(blocks, MAX_HEIGHT_MM - _CHROME_MM)
        for name, page in zip(_page_names(file_stem(dataset), len(pages)), pages):
            rows = [-(-len(encs) // ncols) for _, encs in page]
            fig = plt.figure(figsize=figsize(sum(rows) * _DIAGRAM_ROW_MM + 6 * len(page) + _CHROME_MM, "double"),
                             layout="constrained")
            subs = fig.subfigures(len(page), 1, squeeze=False, height_ratios=[r + 0.15 for r in rows]).ravel()
            for sub, (task, encs), nrow in zip(subs, page, rows):
                axes = sub.subplots(nrow, ncols, squeeze=False, sharex=True, sharey=True)
                sub.suptitle(task, fontsize=FONT["title"], fontweight="bold")
                for k, ax in enumerate(axes.ravel()):
                    if k >= len(encs):
                        ax.set_visible(False)
                        continue
                    enc = encs[k]
                    _diagram_panel(ax, db[(db["task"] == task) & (db["encoder"] == enc)],
                                   cal[(cal["dataset"] == dataset) & (cal["task"] == task) & (cal["encoder"] == enc)],
                                   enc, encoders)
                    if k % ncols == 0:
                        ax.set_ylabel("observed frequency")
                    if k // ncols == nrow - 1 or k + ncols >= len(encs):
                        ax.set_xlabel("mean predicted probability")
            handles = [Line2D([], [], color="0.35", ls="-", marker="o", ms=3, label="before (colour: domain)"),
                       Line2D([], [], color="0.2", ls="--", marker="o", ms=3, label="after temperature scaling"),
                       Line2D([], [], color="0.6", ls=":", label="perfect calibration")]
            fig.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False)
            suptitle(fig, f"Reliability diagrams, {dataset} ({_sel_text(sel)}; temperature T fitted on validation). "
                          "Binary tasks: positive-class probability (ece); multi-class: top-label confidence "
                          "(ece_top_label). Panel titles: ECE before → after scaling.")
            paths += save(fig, Path(out_dir) / f"{name}.png")
            plt.close(fig)
    return paths, skipped


def _diagram_panel(ax, cell: pd.DataFrame, cal: pd.DataFrame, enc: str, encoders: dict) -> None:
    ax.plot([0, 1], [0, 1], color="0.6", lw=0.8, ls=":")
    for stage, style_ in (("before", dict(color=domain_color(encoder_domain(encoders, enc)), ls="-")),
                          ("after", dict(color="0.2", ls="--"))):
        b = cell[(cell["calibration"] == stage) & (cell["n"] > 0)].sort_values("bin")
        if len(b):
            ax.plot(b["mean_prob"], b["observed"], marker="o", ms=2.5, lw=1.0, **style_)
    title = enc
    if len(cal):
        r = cal.iloc[0]
        # one ECE vocabulary: binary `ece` (positive class), multi-class `ece_top_label`; in the title, not over
        # the curve
        key = "ece" if pd.notna(r["ece_before"]) else "ece_top_label"
        after = (f"→{r[f'{key}_after']:.3f}, T {r['temperature']:.2f}" if pd.notna(r["temperature"])
                 else ", T not fitted")  # too few validation rows of a class (calibration.parquet `note`)
        title += f"\n{key} {r[f'{key}_before']:.3f}{after}, n {r['n']}"
    ax.set_title(title, fontsize=FONT["base"])
    ax.set_xlim(-0.03, 1.03)  # markers on the edge bins stay whole
    ax.set_ylim(-0.03, 1.03)
    ax.set_xticks([0, 0.5, 1], ["0", "0.5", "1"])
    ax.set_yticks([0, 0.5, 1], ["0", "0.5", "1"])
    ax.set_aspect("equal", adjustable="box")


# --------------------------------------------------------------------------------------------------------------
# gaps: one file per attribute; rows = (task, encoder) cells with data, grouped by task
# --------------------------------------------------------------------------------------------------------------
_GAP_ROW_MM = 3.4


def _metric_rows(df: pd.DataFrame, metric: str) -> pd.Series:
    """Rows of ``metric``'s family: its binary and its multi-class name (auroc: auroc, auroc_macro)."""
    return df["metric"].isin(metric_family_names(metric_family(metric)))


def _reason_counts(rows: pd.DataFrame) -> dict[tuple[str, str], int]:
    """(dataset, reason) -> (task, encoder) cells, group sizes in reasons folded into a range ("has 5-9 rows")."""
    folded: dict[tuple[str, str], dict] = {}
    for r in rows[["dataset", "task", "encoder", "reason"]].drop_duplicates().itertuples(index=False):
        sizes = [int(v) for v in re.findall(r"has (\d+) rows", str(r.reason))]
        key = (r.dataset, re.sub(r"has \d+ rows", "has {n} rows", str(r.reason)))
        entry = folded.setdefault(key, {"cells": set(), "sizes": []})
        entry["cells"].add((r.task, r.encoder))
        entry["sizes"] += sizes
    out = {}
    for (dataset, reason), e in sorted(folded.items()):
        if e["sizes"]:
            lo, hi = min(e["sizes"]), max(e["sizes"])
            reason = reason.replace("{n}", str(lo) if lo == hi else f"{lo}-{hi}")
        out[(dataset, reason)] = len(e["cells"])
    return out


def gap_plot(tables: dict, encoders: dict, out_dir, sel: dict, **_) -> tuple[list[str], list[dict]]:
    gaps = _select(tables["gaps"], sel, threshold=sel["threshold"])
    if gaps.empty:
        return [], [_skip("all", f"no gap rows for {_sel_text(sel)}, threshold {sel['threshold']}")]
    metric = sel["metric"]
    paths, skipped = [], []
    for attr in dict.fromkeys(gaps["attribute"]):
        ga = gaps[gaps["attribute"] == attr]
        quality = (ga["kind"] == "quality").all()
        # fairness attributes: equalized odds beside the metric; quality strata (FOCUS): their ECE gap
        second = "ece" if quality else "equalized_odds"
        main = ga[_metric_rows(ga, metric)]
        ok = main[~main["skipped"].fillna(False).astype(bool)]
        bad = main[main["skipped"].fillna(False).astype(bool)]
        for (dataset, reason), n in _reason_counts(bad).items():
            skipped.append(_skip(f"{attr} / {dataset}", f"{metric} gap not computed: {reason}", n))
        if ok.empty:
            skipped.append(_skip(attr, "no panel: no (task, encoder) cell has this gap (reasons above)"))
            continue
        sec = ga[_metric_rows(ga, second)]
        sec_bad = sec[sec["skipped"].fillna(False).astype(bool)
                      & sec.set_index(["task", "encoder"]).index.isin(ok.set_index(["task", "encoder"]).index)]
        for reason, g in sec_bad.groupby("reason", sort=True):
            skipped.append(_skip(f"{attr} / {second}", f"{second} gap not computed (row shown as –): {reason}",
                                 int(len(g))))
        cells = ok[["dataset", "task", "encoder"]].drop_duplicates()
        order = {e: i for i, e in enumerate(_encoder_order(encoders, cells["encoder"]))}
        cells = cells.assign(_o=cells["encoder"].map(order)).sort_values(["dataset", "task", "_o"])
        blocks = [((dt, list(g["encoder"])), (len(g) + 1) * _GAP_ROW_MM)
                  for dt, g in cells.groupby(["dataset", "task"], sort=True)]
        pages = _pack(blocks, MAX_HEIGHT_MM - _CHROME_MM)
        g0 = ga.iloc[0]
        for name, page in zip(_page_names(file_stem(attr), len(pages)), pages):
            n_rows = sum(len(encs) + 1 for _, encs in page)
            fig, axes = plt.subplots(1, 2, sharey=True, layout="constrained", gridspec_kw={"width_ratios": [1, 1]},
                                     figsize=figsize(n_rows * _GAP_ROW_MM + _CHROME_MM, "double"))
            labels, ypos, y, headers = [], [], 0, []
            rows = []
            for (_dataset, task), encs in page:
                labels.append(task)
                ypos.append(y)
                headers.append(y)
                y += 1
                for enc in encs:
                    labels.append(enc)
                    ypos.append(y)
                    rows.append((y, task, enc))
                    y += 1
            for ax, (mname, signed) in zip(axes, ((metric, True), (second, False))):
                sub = ga[_metric_rows(ga, mname)]
                xs = []
                for yy, task, enc in rows:
                    r = sub[(sub["task"] == task) & (sub["encoder"] == enc)]
                    if r.empty or bool(r.iloc[0]["skipped"]):
                        ax.text(0, yy, "–", ha="center", va="center", color="0.5")
                        continue
                    r = r.iloc[0]
                    if signed and pd.notna(r.get("gap_b_minus_a")):
                        x, lo, hi = r["gap_b_minus_a"], r["gap_b_minus_a_ci_low"], r["gap_b_minus_a_ci_high"]
                    else:
                        x, lo, hi = r["abs_gap"], r["abs_gap_ci_low"], r["abs_gap_ci_high"]
                    color = domain_color(encoder_domain(encoders, enc))
                    ax.errorbar([x], [yy], xerr=_err(x, lo, hi), fmt="D" if bool(r["flagged"]) else "o", ms=3.5,
                                color=color, ecolor=color, capsize=1.5, lw=0.8)
                    xs += [v for v in (x, lo, hi) if pd.notna(v)]
                for h in headers[1:]:
                    ax.axhline(h - 0.5, color="0.85", lw=0.6)
                ax.axvline(0, color="0.5", lw=0.7)
                lim = max(0.1, float(np.nanmax(np.abs(xs))) * 1.1) if xs else 1.0
                ax.set_xlim(-lim if signed else -0.03 * lim, lim)  # a gap of 0 stays visible
                if signed:
                    gtxt = f"{g0['group_b']} − {g0['group_a']}" if pd.notna(g0.get("group_a")) else "difference"
                    ax.set_xlabel(f"difference in {metric} ({gtxt})")
                else:
                    ax.set_xlabel("equalized-odds gap" if mname == "equalized_odds" else f"{mname} gap")
                ax.grid(axis="x", alpha=0.3)
            axes[0].set_yticks(ypos, labels)
            for t, yy in zip(axes[0].get_yticklabels(), ypos):
                if yy in headers:
                    t.set_fontweight("bold")
                else:
                    t.set_color(domain_color(encoder_domain(encoders, t.get_text())))
            axes[0].set_ylim(y - 0.5, -0.5)
            suptitle(fig, f"{attr}: subgroup gaps with 95% {_unit(ga)}-bootstrap CIs ({_sel_text(sel)}, threshold "
                          f"{sel['threshold']}); diamond: the signed CI excludes 0; –: not computed (see the "
                          "skipped table)")
            paths += save(fig, Path(out_dir) / f"{name}.png")
            plt.close(fig)
    return paths, skipped


# --------------------------------------------------------------------------------------------------------------
# subgroup scatter: one file per attribute with two groups (single column)
# --------------------------------------------------------------------------------------------------------------
_MARKERS = "osD^v<>p*hH8dP"


def subgroup_scatter(tables: dict, encoders: dict, out_dir, sel: dict, **_) -> tuple[list[str], list[dict]]:
    sub = _select(tables["subgroups"], sel, threshold=sel["threshold"])
    metric = sel["metric"]
    if sub.empty:
        return [], [_skip("all", f"no subgroup rows for {_sel_text(sel)}, threshold {sel['threshold']}")]
    sub = sub[_metric_rows(sub, metric)]
    paths, skipped = [], []
    datasets = sorted(sub["dataset"].unique())
    markers = {ds: _MARKERS[i % len(_MARKERS)] for i, ds in enumerate(datasets)}
    for attr in dict.fromkeys(sub["attribute"]):
        sa = sub[(sub["attribute"] == attr) & sub["value"].notna()]
        groups = list(dict.fromkeys(sa["group"].dropna()))
        empty = sub[(sub["attribute"] == attr)]
        missing = sorted(set(empty["dataset"]) - set(sa["dataset"]))
        for ds in missing:
            reasons = sorted(set(empty.loc[empty["dataset"] == ds, "reason"].dropna()) - {""})
            skipped.append(_skip(f"{attr} / {ds}", "; ".join(reasons) or "no group values"))
        if len(groups) != 2:
            skipped.append(_skip(attr, f"no panel: the scatter needs exactly two groups, found {len(groups)} "
                                       f"({', '.join(map(str, groups)) or 'none'})"))
            continue
        ga, gb = groups
        wide = sa.pivot_table(index=["dataset", "task", "encoder"], columns="group",
                              values=["value", "ci_low", "ci_high"], aggfunc="first")
        small = sa.groupby(["dataset", "task", "encoder"])["below_min_size"].any()
        fig, ax = plt.subplots(figsize=figsize(105, "single"), layout="constrained")
        n_points = 0
        for (ds, task, enc), r in wide.iterrows():
            if ("value", ga) not in r or ("value", gb) not in r:
                continue
            x, y = r[("value", ga)], r[("value", gb)]
            if not (np.isfinite(x) and np.isfinite(y)):
                continue
            color = domain_color(encoder_domain(encoders, enc))
            hollow = bool(small.get((ds, task, enc), False))
            ax.errorbar([x], [y], xerr=_err(x, r[("ci_low", ga)], r[("ci_high", ga)]),
                        yerr=_err(y, r[("ci_low", gb)], r[("ci_high", gb)]), fmt=markers[ds], ms=4,
                        color=color, mfc="white" if hollow else color, ecolor=color, elinewidth=0.5, alpha=0.9)
            n_points += 1
        if not n_points:
            plt.close(fig)
            skipped.append(_skip(attr, "no panel: no cell has values in both groups"))
            continue
        ax.plot([0, 1], [0, 1], color="0.6", lw=0.8, ls=":")
        if metric_family(metric) == "auroc":  # the chance level of each group (no group-level majority rate for AUROC)
            ax.axhline(0.5, zorder=0.5, **BASELINE_STYLE["chance"])
            ax.axvline(0.5, zorder=0.5, **BASELINE_STYLE["chance"])
        ax.set_xlim(0, 1.02)
        ax.set_ylim(0, 1.02)
        ax.set_aspect("equal", adjustable="box")
        ax.set_xlabel(f"{metric}, {attr} = {ga}")
        ax.set_ylabel(f"{metric}, {attr} = {gb}")
        handles = [Line2D([], [], marker=markers[d], ls="", color="0.3", label=d) for d in datasets
                   if d in set(sa["dataset"])]
        if metric_family(metric) == "auroc":
            handles.append(Line2D([], [], **BASELINE_STYLE["chance"], label="chance (AUROC 0.5)"))
        handles += style.domain_handles(encoders, sorted(sa["encoder"].unique()))
        fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False)
        suptitle(fig, f"Subgroup {metric} by {attr} ({_sel_text(sel)}, {sel['threshold']}); a point per task "
                      f"and encoder, 95% {_unit(sa)}-bootstrap CIs; hollow: a group below the minimum size")
        paths += save(fig, Path(out_dir) / f"{file_stem(attr)}.png")
        plt.close(fig)
    return paths, skipped


# --------------------------------------------------------------------------------------------------------------
# transfer: one file per harmonised task; one panel per target dataset
# --------------------------------------------------------------------------------------------------------------

def transfer_bars(tables: dict, encoders: dict, out_dir, sel: dict, *, groups: dict | None = None, **_
                  ) -> tuple[list[str], list[dict]]:
    m = tables["metrics"]
    if m.empty or not (m["source"] == "transfer").any():
        return [], [_skip("all", "no transfer predictions")]
    m = m[(m["source"] == "transfer") & (m["threshold"] == "none") & m["metric"].isin(metric_family_names("auroc"))
          & (m["regime"] == sel["regime"])]
    if m.empty:
        return [], [_skip("all", f"no transfer AUROC rows in regime {sel['regime']}")]
    protocol = sel["protocol"] if sel["protocol"] in set(m["protocol"]) else sorted(m["protocol"].unique())[0]
    m = m[m["protocol"] == protocol]
    m = m[m["seed"] == (sel["seed"] if sel["seed"] in set(m["seed"]) else m["seed"].min())]
    groups = dict(groups or {})
    if not groups:  # without the registry's groups: each connected set of (train task, target task) pairs
        for target in sorted(m["task"].unique()):
            groups[target] = sorted({target} | set(m.loc[m["task"] == target, "train_task"]))
    encs = _encoder_order(encoders, m["encoder"].unique())
    paths, skipped = [], []
    for group, tasks in groups.items():
        targets = [t for t in tasks if t in set(m["task"])]
        if not targets:
            skipped.append(_skip(group, f"no transfer rows for {protocol}"))
            continue
        ncols = 2 if len(encs) <= 6 and len(targets) > 1 else 1
        nrows = -(-len(targets) // ncols)
        fig, axes = plt.subplots(nrows, ncols, squeeze=False, sharey=True, layout="constrained",
                                 figsize=figsize(nrows * 62 + _CHROME_MM, "double"))
        for ax in axes.ravel()[len(targets):]:
            ax.set_visible(False)
        for ax, target in zip(axes.ravel(), targets):
            mt = m[m["task"] == target]
            sources = [target] + sorted(set(mt["train_task"]) - {target})
            width = 0.8 / len(sources)
            for si, src in enumerate(sources):
                for ei, enc in enumerate(encs):
                    r = mt[(mt["train_task"] == src) & (mt["encoder"] == enc)]
                    if r.empty:
                        continue
                    r = r.iloc[0]
                    color = domain_color(encoder_domain(encoders, enc))
                    x = ei + (si - (len(sources) - 1) / 2) * width
                    ax.bar(x, r["value"], width=width * 0.95, color=color, alpha=1.0 if src == target else 0.45,
                           hatch=None if src == target else "////", edgecolor="0.2", lw=0.4)
                    ax.errorbar([x], [r["value"]], yerr=_err(r["value"], r["ci_low"], r["ci_high"]),
                                color="0.1", lw=0.7, capsize=1.5)
            ax.set_xticks(range(len(encs)), encs, rotation=30, ha="right", rotation_mode="anchor")
            style.color_ticklabels(ax.get_xticklabels(), encoders)
            ax.axhline(0.5, zorder=0.5, **BASELINE_STYLE["chance"])
            ax.set_ylim(0, 1.05)
            ax.set_ylabel("test AUROC")
            others = ", ".join(s for s in sources if s != target) or "none"
            ax.set_title(f"target {target} (n = {int(mt['n'].max())})\nhatched: trained on {others}",
                         fontsize=FONT["base"])
        handles = [Patch(facecolor="0.5", edgecolor="0.2", label="in-distribution (trained on the target)"),
                   Patch(facecolor="0.5", alpha=0.45, hatch="////", edgecolor="0.2", label="out-of-distribution"),
                   Line2D([], [], **BASELINE_STYLE["chance"], label="chance (AUROC 0.5)")]
        handles += style.domain_handles(encoders, encs)
        fig.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False)
        suptitle(fig, f"In- vs out-of-distribution test AUROC, {group} (transfer probes, {protocol}, regime "
                      f"{sel['regime']}; 95% {_unit(m)}-bootstrap CIs)")
        paths += save(fig, Path(out_dir) / f"{file_stem(group)}.png")
        plt.close(fig)
    return paths, skipped


FIGURES = {"reliability_diagrams": reliability_diagrams, "fairness_gaps": gap_plot,
           "subgroup_scatter": subgroup_scatter, "transfer": transfer_bars}
