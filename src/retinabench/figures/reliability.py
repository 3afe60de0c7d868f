"""Reliability figures: reliability diagrams (before/after temperature scaling), fairness/quality gaps with CIs,
the OcularBench subgroup scatter (metric in group a vs group b), and in- vs out-of-distribution transfer bars.

Each function takes the collected reliability tables, the encoder registry entries (colours by pretraining
domain), the PNG path and the selection (protocol, regime, seed, threshold, metric, source), and returns the
PNG and PDF paths written by figures.style.save. An empty selection draws a labelled placeholder rather than
failing, so a dataset without subgroups (e.g. TVHL has no age or sex) still gets its figure, saying why.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from retinabench.figures import style  # noqa: F401  (sets the Agg backend and rcParams before pyplot)
import matplotlib.pyplot as plt  # noqa: E402

from retinabench.figures.style import domain_color, encoder_domain, save  # noqa: E402


def _select(df: pd.DataFrame, sel: dict, *, own_task: bool = True, threshold: str | None = None,
            source: str | None = None) -> pd.DataFrame:
    if df.empty:
        return df
    m = (df["protocol"] == sel["protocol"]) & (df["regime"] == sel["regime"]) & (df["seed"] == sel["seed"])
    m &= df["source"] == (source or sel.get("source", "frozen"))
    if own_task:
        m &= df["train_task"] == df["task"]
    if threshold is not None and "threshold" in df.columns:
        m &= df["threshold"] == threshold
    return df[m]


def _err(x, lo, hi) -> list[list[float]]:
    """Error-bar half-widths; a percentile interval need not contain the point estimate, so clip at 0."""
    return [[max(0.0, x - lo)], [max(0.0, hi - x)]]


def _placeholder(png, title: str, message: str) -> list[str]:
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, fontsize=9)
    paths = save(fig, png)
    plt.close(fig)
    return paths


def _unit(df: pd.DataFrame) -> str:
    """The bootstrap resampling unit the table records (reliability.bootstrap.unit), for figure titles."""
    units = sorted(set(df["bootstrap_unit"].dropna())) if "bootstrap_unit" in df.columns and len(df) else []
    return "/".join(units) or "patient"


def _sel_text(sel: dict) -> str:
    return f"{sel.get('source', 'frozen')} {sel['protocol']}, regime {sel['regime']}, seed {sel['seed']}"


def reliability_diagrams(tables: dict, encoders: dict, png, sel: dict) -> list[str]:
    bins = _select(tables["bins"], sel)
    cal = _select(tables["calibration"], sel)
    title = f"Reliability diagrams ({_sel_text(sel)}; T fitted on validation)"
    if bins.empty:
        return _placeholder(png, title, "no predictions for this selection")
    tasks = sorted(bins["task"].unique())
    encs = [e for e in encoders if e in set(bins["encoder"])] + sorted(set(bins["encoder"]) - set(encoders))
    fig, axes = plt.subplots(len(tasks), len(encs), figsize=(2.4 * len(encs) + 0.5, 2.4 * len(tasks) + 0.6),
                             squeeze=False, sharex=True, sharey=True, layout="constrained")
    for i, task in enumerate(tasks):
        for j, enc in enumerate(encs):
            ax = axes[i, j]
            ax.plot([0, 1], [0, 1], color="0.7", lw=0.8, ls=":")
            cell = bins[(bins["task"] == task) & (bins["encoder"] == enc)]
            for stage, style_ in (("before", dict(color=domain_color(encoder_domain(encoders, enc)), ls="-")),
                                  ("after", dict(color="0.2", ls="--"))):
                b = cell[(cell["calibration"] == stage) & (cell["n"] > 0)].sort_values("bin")
                if len(b):
                    ax.plot(b["mean_prob"], b["observed"], marker="o", ms=3, lw=1.2, label=stage, **style_)
            c = cal[(cal["task"] == task) & (cal["encoder"] == enc)]
            if len(c):
                r = c.iloc[0]
                # one ECE vocabulary: binary `ece` (positive class), multi-class `ece_top_label`
                key = "ece" if pd.notna(r["ece_before"]) else "ece_top_label"
                ax.text(0.03, 0.97, f"{key} {r[f'{key}_before']:.3f}→{r[f'{key}_after']:.3f}\n"
                        f"T={r['temperature']:.2f}, n={r['n']}", transform=ax.transAxes, va="top", fontsize=7)
            if i == 0:
                ax.set_title(enc, fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{task}\nobserved frequency", fontsize=7)
            if i == len(tasks) - 1:
                ax.set_xlabel("mean predicted probability", fontsize=7)
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
    axes[0, -1].legend(loc="lower right", fontsize=7, frameon=False)
    fig.suptitle(title + "\nbinary: positive-class probability (ece); multi-class: top-label confidence "
                         "(ece_top_label)", fontsize=9)
    paths = save(fig, png)
    plt.close(fig)
    return paths


def gap_plot(tables: dict, encoders: dict, png, sel: dict) -> list[str]:
    gaps = _select(tables["gaps"], sel, threshold=sel["threshold"])
    title = (f"Subgroup gaps with 95% {_unit(gaps)}-bootstrap CIs ({_sel_text(sel)}, threshold "
             f"{sel['threshold']})")
    if gaps.empty:
        return _placeholder(png, title, "no predictions for this selection")
    attrs = list(dict.fromkeys(gaps["attribute"]))
    metric = sel["metric"]
    n_cells = gaps[["task", "encoder"]].drop_duplicates().shape[0]
    fig, axes = plt.subplots(len(attrs), 2, figsize=(10, (0.3 * n_cells + 0.9) * len(attrs) + 0.6), squeeze=False,
                             layout="constrained")
    for i, attr in enumerate(attrs):
        ga = gaps[gaps["attribute"] == attr]
        cells = ga[["task", "encoder"]].drop_duplicates().sort_values(["task", "encoder"]).to_numpy().tolist()
        # fairness attributes: equalized odds beside the metric; quality strata (FOCUS): their ECE gap
        second = "ece" if (ga["kind"] == "quality").all() else "equalized_odds"
        for j, (mname, signed) in enumerate(((metric, True), (second, False))):
            ax = axes[i, j]
            for k, (task, enc) in enumerate(cells):
                row = ga[(ga["task"] == task) & (ga["encoder"] == enc)
                         & ga["metric"].isin([mname, f"{mname}_macro", f"{mname}_top_label"])]
                color = domain_color(encoder_domain(encoders, enc))
                if row.empty or bool(row.iloc[0]["skipped"]):
                    reason = "no row" if row.empty else str(row.iloc[0]["reason"])
                    reason = reason if len(reason) <= 48 else reason[:45] + "..."
                    ax.text(0 if signed else 0.5, k, f"skipped: {reason}", va="center", ha="center", fontsize=5.5,
                            color="0.45")
                    continue
                r = row.iloc[0]
                if signed and pd.notna(r.get("difference")):
                    x, lo, hi = r["difference"], r["diff_ci_low"], r["diff_ci_high"]
                else:
                    x, lo, hi = r["gap"], r["ci_low"], r["ci_high"]
                ax.errorbar([x], [k], xerr=_err(x, lo, hi), fmt="o" if not r["flagged"] else "D", ms=4,
                            color=color, ecolor=color, capsize=2)
            ax.axvline(0, color="0.6", lw=0.8)
            ax.set_xlim(-1.0 if signed else 0.0, 1.0)
            ax.set_yticks(range(len(cells)))
            ax.set_yticklabels([f"{t} | {e}" for t, e in cells], fontsize=6)
            ax.set_ylim(-0.7, len(cells) - 0.3)
            gtxt = ""
            if len(ga) and pd.notna(ga.iloc[0].get("group_a")):
                gtxt = f" ({ga.iloc[0]['group_b']} − {ga.iloc[0]['group_a']})" if signed else ""
            label = "equalized-odds gap" if mname == "equalized_odds" else f"{mname} gap"
            ax.set_title(f"{attr}: {'difference in ' + mname if signed else label}{gtxt}", fontsize=8)
    fig.suptitle(title + "\ndiamond: signed CI excludes 0", fontsize=9)
    paths = save(fig, png)
    plt.close(fig)
    return paths


def subgroup_scatter(tables: dict, encoders: dict, png, sel: dict) -> list[str]:
    sub = _select(tables["subgroups"], sel, threshold=sel["threshold"])
    metric = sel["metric"]
    title = f"Subgroup {metric} (OcularBench scatter; {_sel_text(sel)}, threshold {sel['threshold']})"
    if not sub.empty:
        sub = sub[sub["metric"].isin([metric, f"{metric}_macro"])]
    attrs = [a for a in dict.fromkeys(sub["attribute"]) if sub.loc[sub["attribute"] == a, "group"].nunique() == 2] \
        if not sub.empty else []
    if not attrs:
        return _placeholder(png, title, "no attribute with two evaluable groups in these rows "
                                        "(reasons in reliability/coverage.parquet)")
    fig, axes = plt.subplots(1, len(attrs), figsize=(3.2 * len(attrs), 3.8), squeeze=False, layout="constrained")
    markers = "osD^v<>px*"
    tasks = sorted(sub["task"].unique())
    for ax, attr in zip(axes[0], attrs):
        sa = sub[sub["attribute"] == attr]
        ga, gb = list(dict.fromkeys(sa["group"]))[:2]
        wide = sa.pivot_table(index=["task", "encoder"], columns="group", values=["value", "ci_low", "ci_high"],
                              aggfunc="first")
        small = sa.groupby(["task", "encoder"])["below_min_size"].any()
        for (task, enc), r in wide.iterrows():
            x, y = r[("value", ga)], r[("value", gb)]
            if not (np.isfinite(x) and np.isfinite(y)):
                continue
            color = domain_color(encoder_domain(encoders, enc))
            hollow = bool(small.get((task, enc), False))
            ax.errorbar([x], [y], xerr=_err(x, r[("ci_low", ga)], r[("ci_high", ga)]),
                        yerr=_err(y, r[("ci_low", gb)], r[("ci_high", gb)]), fmt=markers[tasks.index(task) % 10],
                        ms=5, color=color, mfc="white" if hollow else color, ecolor=color, elinewidth=0.6, alpha=0.9)
        ax.plot([0, 1], [0, 1], color="0.6", lw=0.8, ls=":")
        ax.set_xlim(0, 1.02)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel(f"{metric}, {attr} {ga}")
        ax.set_ylabel(f"{metric}, {attr} {gb}")
        ax.set_title(attr, fontsize=9)
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], marker=markers[i % 10], ls="", color="0.3", label=t) for i, t in enumerate(tasks)]
    handles += style.domain_handles(encoders, sorted(sub["encoder"].unique()))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(4, len(handles)), fontsize=7, frameon=False)
    fig.suptitle(title + f"\nhollow: a group below the minimum size; bars: 95% {_unit(sub)}-bootstrap CIs",
                 fontsize=9)
    paths = save(fig, png)
    plt.close(fig)
    return paths


def transfer_bars(tables: dict, encoders: dict, png, sel: dict) -> list[str]:
    m = tables["metrics"]
    title = f"In- vs out-of-distribution test AUROC (transfer probes; regime {sel['regime']})"
    if m.empty or not (m["source"] == "transfer").any():
        return _placeholder(png, title, "no transfer predictions")
    m = m[(m["source"] == "transfer") & (m["threshold"] == "none") & m["metric"].isin(["auroc", "auroc_macro"])
          & (m["regime"] == sel["regime"])]
    protocol = sel["protocol"] if sel["protocol"] in set(m["protocol"]) else sorted(m["protocol"].unique())[0]
    m = m[m["protocol"] == protocol]
    m = m[m["seed"] == (sel["seed"] if sel["seed"] in set(m["seed"]) else m["seed"].min())]
    targets = sorted(m["task"].unique())
    encs = [e for e in encoders if e in set(m["encoder"])] + sorted(set(m["encoder"]) - set(encoders))
    fig, axes = plt.subplots(1, len(targets), figsize=(max(3.5, 1.6 * len(encs)) * len(targets), 3.6),
                             squeeze=False, layout="constrained")
    for ax, target in zip(axes[0], targets):
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
                       hatch=None if src == target else "//", edgecolor="0.2", lw=0.5)
                ax.errorbar([x], [r["value"]], yerr=_err(r["value"], r["ci_low"], r["ci_high"]),
                            color="0.1", lw=0.8, capsize=2)
        ax.set_xticks(range(len(encs)))
        ax.set_xticklabels(encs, rotation=30, ha="right", fontsize=7)
        ax.axhline(0.5, color="0.6", lw=0.8, ls=":")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("test AUROC")
        ax.set_title(f"target {target} (n={int(mt['n'].max())})\nsolid: ID; hatched: trained on "
                     + ", ".join(s for s in sources if s != target), fontsize=8)
    fig.suptitle(f"{title}, {protocol}; 95% {_unit(m)}-bootstrap CIs", fontsize=9)
    paths = save(fig, png)
    plt.close(fig)
    return paths
