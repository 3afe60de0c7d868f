"""The analysis families: plain functions ``family_x(inputs, ctx, out)``, DataFrames in, files out (``out``: the
paths :func:`retinabench.plan.family_outputs.analysis_outputs` gives the family). Every file is written atomically
(retinabench.atomic; figures through retinabench.figures.style.save)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd

from retinabench.analysis.attributes import family_attributes, read_manifests
from retinabench.analysis.common import _metric_title, _order, _role, _write_csv, _write_text
from retinabench.analysis.context import FAMILIES, OCT_PANEL, AnalysisContext
from retinabench.atomic import atomic_write
from retinabench.regimes import BALANCED, UNBALANCED

__all__ = ["family_attributes", "family_function", "read_input", "run_family"]


# --------------------------------------------------------------------------------------------------------------
# Families: DataFrames in, files out. `out` holds the paths analysis_outputs() gives the family.
# --------------------------------------------------------------------------------------------------------------

def _extended(suffix: str) -> str:
    """Title words of an extended protocol figure (the project's other probes beside the paper's protocols)."""
    return " (extended: the paper's protocols and the project's other probes)" if suffix else ""


def family_ranks(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.stats.ranks import rank_summaries, rank_tables
    ranks = rank_tables(inputs["metrics"], ctx.metrics, split=ctx.split)
    atomic_write(out["ranks"], lambda tmp: ranks.to_parquet(tmp, index=False))
    _write_csv(rank_summaries(ranks), out["summary"])
    return [out["ranks"], out["summary"]]


def family_rank_figures(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.ranks import rank_distribution_figure
    paths = []
    for m in ctx.metrics:
        key = "png" if m == ctx.metric else f"png_{m}"
        paths += rank_distribution_figure(inputs["ranks"], ctx.encoders, out[key], regime=ctx.regime, metric=m,
                                          protocols=[ctx.analysis_protocol_name],
                                          title=f"Encoder ranks by {_metric_title(ctx, m)}, {ctx.protocol_label}, "
                                                f"regime {ctx.regime}")
    if "png_linear_probe" in out:  # OcularBench Fig. 4: the ranks under its linear probe
        lp = ctx.settings["linear_protocol"]
        paths += rank_distribution_figure(inputs["ranks"], ctx.encoders, out["png_linear_probe"], regime=ctx.regime,
                                          metric=ctx.metric, protocols=[lp],
                                          title=f"Encoder ranks under linear probing ({lp}) by "
                                                f"{_metric_title(ctx, ctx.metric)}, regime {ctx.regime}")
    return paths


def family_tables(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.stats.ranks import rank_summaries
    from retinabench.stats.tables import appendix_latex, appendix_table, ranking_latex, ranking_table
    order = _order(inputs["ranks"], ctx)
    app = appendix_table(inputs["metrics"], metric=ctx.metric, split=ctx.split, baselines=inputs["baselines"])
    rank = ranking_table(rank_summaries(inputs["ranks"]), regime=ctx.regime, ranks=inputs["ranks"],
                         baselines=inputs["baselines"], split=ctx.split)
    return [_write_csv(app, out["appendix_csv"]),
            _write_text(appendix_latex(app, regime=ctx.regime, encoder_order=order), out["appendix_tex"]),
            _write_csv(rank, out["ranking_csv"]),
            _write_text(ranking_latex(rank, encoder_order=order), out["ranking_tex"])]


def family_cd(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.cd import CDPanel, cd_figure
    from retinabench.stats.friedman import block_ranks, friedman_test, nemenyi, nemenyi_long
    from retinabench.metrics.table import higher_is_better
    from retinabench.stats.ranks import score_matrix
    ranks = inputs["ranks"]
    rows, pairs, paths = [], [], []
    head = ctx.analysis_protocol
    from retinabench.progress import progress
    for m in progress(ctx.metrics, "Friedman / Nemenyi", unit="ranking metrics"):
        panels = []
        # Tables: every ranked protocol, the analysis protocol marked; the diagram: the analysis protocol.
        for protocol in [head["protocol"], *[p for p in ctx.protocols if p != head["protocol"]]]:
            scores = score_matrix(ranks, metric=m, protocol=protocol, regime=ctx.regime)
            res = friedman_test(scores, higher_is_better=higher_is_better(m), alpha=ctx.alpha)
            p = nemenyi(scores)
            mean_rank = block_ranks(scores, higher_is_better(m)).mean(axis=0)
            role = _role(ctx, protocol)
            rows.append({"metric": m, "protocol": protocol, "role": role, "regime": ctx.regime, **res.as_dict()})
            pairs.append(nemenyi_long(p, mean_rank, ctx.alpha).assign(metric=m, protocol=protocol, role=role,
                                                                       regime=ctx.regime))
            verdict = "differ" if res.p < ctx.alpha else "no evidence of a difference"
            panel = CDPanel(f"{ctx.protocol_label if protocol == head['protocol'] else protocol}: Friedman χ² = "
                            f"{res.chi2:.2f}, p = {res.p:.2g} ({verdict}); {res.n} tasks, {res.k} encoders",
                            mean_rank, p, res.cd)
            if protocol == head["protocol"]:
                panels.append(panel)
            elif m == ctx.metric and protocol == ctx.linear_probe and "png_linear_probe" in out:
                # OcularBench Fig. A.3: the critical-difference diagram under its linear probe
                paths += cd_figure([panel], ctx.encoders, out["png_linear_probe"], alpha=ctx.alpha,
                                   title=f"Critical differences under linear probing (Nemenyi, α = {ctx.alpha:g}), "
                                         f"{_metric_title(ctx, m)}, regime {ctx.regime}")
        key = "png" if m == ctx.metric else f"png_{m}"
        paths += cd_figure(panels, ctx.encoders, out[key], alpha=ctx.alpha,
                           title=f"Critical differences (Nemenyi, α = {ctx.alpha:g}), {_metric_title(ctx, m)}, "
                                 f"regime {ctx.regime}")
    return [_write_csv(pd.DataFrame(rows), out["friedman"]),
            _write_csv(pd.concat(pairs, ignore_index=True), out["nemenyi"]), *paths]


def family_protocol_heatmap(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.agreement import heatmap_panels
    from retinabench.stats.agreement import condition_rankings
    ranks = inputs["ranks"]
    paths = []
    for suffix, protocols in ctx.protocol_sets.items():
        if f"png{suffix}" not in out:
            continue
        panels = {}
        for regime, label in ((UNBALANCED, "unbalanced (u-u)"), (BALANCED, "balanced (b-b)")):
            if regime in ctx.regimes:
                m = condition_rankings(ranks, metric=ctx.metric, by="protocol", fixed={"regime": regime},
                                       keep=protocols)
                panels[label] = m[[p for p in protocols if p in m.columns]]
        n_enc = len(ctx.encoders)
        paths += heatmap_panels(panels, ctx.encoders, out[f"png{suffix}"], order=_order(ranks, ctx), vmin=1,
                                vmax=max(2, n_enc), value_label="mean rank across tasks (1 = best)",
                                title=f"Mean rank per protocol{_extended(suffix)}, {_metric_title(ctx, ctx.metric)}")
    return paths


def family_agreement(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.agreement import spearman_figure
    from retinabench.stats.agreement import agreement_table, condition_rankings, spearman_matrix
    ranks = inputs["ranks"]
    table = agreement_table(ranks, metric=ctx.metric, protocols=ctx.protocols, regimes=ctx.regimes,
                            alpha=ctx.alpha)
    paths = [_write_csv(table, out["table"])]
    for suffix, protocols in ctx.protocol_sets.items():
        if f"png_protocols{suffix}" not in out:
            continue
        mats = {}
        for regime, label in ((UNBALANCED, "unbalanced (u-u)"), (BALANCED, "balanced (b-b)")):
            if regime in ctx.regimes:
                m = condition_rankings(ranks, metric=ctx.metric, by="protocol", fixed={"regime": regime},
                                       keep=protocols)
                mats[label] = spearman_matrix(m, protocols)
        paths += spearman_figure(mats, out[f"png_protocols{suffix}"], alpha=ctx.alpha,
                                 n_encoders=int(table["n_encoders"].max()),
                                 title=f"Agreement of protocols' encoder rankings{_extended(suffix)} "
                                       f"({_metric_title(ctx, ctx.metric)})")
    if "png_regimes" in out:
        mats = {}
        for protocol in ctx.protocol_sets[""]:  # the paper's protocols when ranked (the table has every one)
            m = condition_rankings(ranks, metric=ctx.metric, by="regime", fixed={"protocol": protocol},
                                   keep=ctx.regimes)
            mats[protocol] = spearman_matrix(m, ctx.regimes)
        paths += spearman_figure(mats, out["png_regimes"], alpha=ctx.alpha, n_encoders=int(table["n_encoders"].max()),
                                 title=f"Agreement of encoder rankings between data regimes "
                                       f"({_metric_title(ctx, ctx.metric)})")
    return paths


def family_distance(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.bars import distance_bars
    from retinabench.stats.distance import (distance_table, kruskal_table, protocol_comparisons,
                                            subset_comparisons)
    ranks = inputs["ranks"]
    comps = protocol_comparisons(ctx.protocols, metric=ctx.metric, regime=ctx.regime) \
        if len(ctx.protocols) >= 2 else []
    subs = subset_comparisons(ctx.tasks, ctx.settings["subsets"], metric=ctx.metric, protocol=ctx.analysis_protocol_name,
                              regime=ctx.regime)
    table = distance_table(ranks, comps + subs, ctx.encoders)
    table["protocol"] = ["" if f == "protocols" else ctx.analysis_protocol_name for f in table["family"]]
    kw = kruskal_table(table, ctx.alpha)
    paths = [_write_csv(table, out["table"]), _write_csv(kw, out["kruskal"])]
    for suffix, protocols in ctx.protocol_sets.items():
        if f"png_protocols{suffix}" not in out:
            continue
        d = table[(table["family"] == "protocols") & table["reference"].isin(protocols)
                  & table["comparison"].isin(protocols)]
        paths += distance_bars(d, kw, ctx.encoders, out[f"png_protocols{suffix}"], group_by="domain_group",
                               title=f"Signed rank distance between protocols{_extended(suffix)} "
                                     f"({_metric_title(ctx, ctx.metric)}, regime {ctx.regime})")
    if "png_subsets" in out:
        d = table[table["family"] != "protocols"]
        paths += distance_bars(d, kw, ctx.encoders, out["png_subsets"], group_by="domain_group",
                               title=f"Signed rank distance, subset vs rest ({ctx.protocol_label}, "
                                     f"{_metric_title(ctx, ctx.metric)}, regime {ctx.regime})")
    return paths


def family_subsets(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.agreement import heatmap_panels
    from retinabench.stats.subsets import subset_rankings, task_subsets
    ranks = inputs["ranks"]
    subsets = task_subsets(ctx.tasks, ctx.settings["subsets"])
    table = subset_rankings(ranks, subsets, metric=ctx.metric, protocol=ctx.analysis_protocol_name, regime=ctx.regime)
    wide = table.pivot(index="encoder", columns="subset", values="mean_rank")[["all", *subsets]]
    wide.columns = [f"{c} ({len(subsets[c]) if c in subsets else len(ctx.tasks)})" for c in wide.columns]
    paths = [_write_csv(table, out["table"])]
    paths += heatmap_panels({f"{ctx.protocol_label}, regime {ctx.regime}": wide}, ctx.encoders, out["png"],
                            order=_order(ranks, ctx), vmin=1, vmax=max(2, len(ctx.encoders)),
                            value_label="mean rank (1 = best)",
                            title=f"Mean rank by task subset (task count), {_metric_title(ctx, ctx.metric)}")
    return paths


def family_leakage(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.bars import leakage_bars
    from retinabench.stats.leakage import (SUBSET_LABELS, exposed_datasets, exposure_assessment,
                                           informative_subsets, leakage_rerank, leakage_subsets)
    ranks = inputs["ranks"]
    subsets = informative_subsets(leakage_subsets(ctx.tasks, ctx.encoders, ctx.datasets), list(ctx.tasks))
    if not subsets:
        raise ValueError("leakage: no task subset differs from the full task set (nothing to re-rank)")
    table = leakage_rerank(ranks, subsets, metric=ctx.metric, protocol=ctx.analysis_protocol_name, regime=ctx.regime,
                           likelihood=exposure_assessment(ctx.encoders, ctx.datasets),
                           exposure=exposed_datasets(ctx.encoders, list(ctx.datasets)))
    paths = [_write_csv(table.assign(protocol_role=_role(ctx, ctx.analysis_protocol_name)), out["table"])]
    paths += leakage_bars(table, ctx.encoders, out["png"], order=_order(ranks, ctx), labels=SUBSET_LABELS,
                          title=f"Rank change without possibly leaked tasks ({ctx.protocol_label}, "
                                f"{_metric_title(ctx, ctx.metric)})")
    return paths


def family_top_k(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.bars import top_k_panels
    from retinabench.stats.leakage import high_leakage_datasets, top_k
    ranks = inputs["ranks"]
    k = int(ctx.settings["top_k"])
    paths: list[str] = []
    if "png" in out:  # the top k once high-leakage datasets are excluded: all tasks, each modality
        high = set(high_leakage_datasets(ctx.encoders, ctx.datasets))
        clean = sorted(t for t, m in ctx.tasks.items() if m["dataset"] not in high)
        modalities = list(ctx.settings["subsets"]["modality"])
        table = top_k(ranks, ctx.tasks, clean, k=k, metric=ctx.metric, protocol=ctx.analysis_protocol_name,
                      regime=ctx.regime, modalities=modalities)
        titles = {"all": "all modalities", **{m: m.upper() for m in modalities}}
        paths.append(_write_csv(table.assign(excluded_datasets=",".join(sorted(high)),
                                             protocol_role=_role(ctx, ctx.analysis_protocol_name)), out["table"]))
        excluded = ", ".join(sorted(high)) or "none"
        paths += top_k_panels(table, ctx.encoders, out["png"], titles=titles,
                              title=f"Top {k} by mean rank, high-leakage datasets excluded ({excluded}); "
                                    f"{ctx.protocol_label}, {_metric_title(ctx, ctx.metric)}")
    if "png_oct" in out:  # OcularBench's OCT panel: every OCT task, leakage not excluded
        oct_tasks = sorted(t for t, m in ctx.tasks.items() if m["modality"] == OCT_PANEL)
        oct_table = top_k(ranks, ctx.tasks, oct_tasks, k=k, metric=ctx.metric, protocol=ctx.analysis_protocol_name,
                          regime=ctx.regime, modalities=[]).assign(panel=OCT_PANEL)
        paths.append(_write_csv(oct_table.assign(protocol_role=_role(ctx, ctx.analysis_protocol_name)),
                                out["table_oct"]))
        paths += top_k_panels(oct_table, ctx.encoders, out["png_oct"],
                              titles={OCT_PANEL: f"all {OCT_PANEL.upper()} tasks"},
                              title=f"Top {k} by mean rank over every {OCT_PANEL.upper()} task (leakage not excluded); "
                                    f"{ctx.protocol_label}, {_metric_title(ctx, ctx.metric)}")
    return paths


def family_ft_lp(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.scatter import ft_lp_gap_figure
    from retinabench.stats.protocols import ft_lp_gap
    s = ctx.settings
    table = ft_lp_gap(inputs["metrics"], ctx.encoders, finetune=s["finetune_protocol"], linear=s["linear_protocol"],
                      regime=ctx.regime, metric=ctx.metric, split=ctx.split)
    return [_write_csv(table, out["table"]),
            *ft_lp_gap_figure(table, ctx.encoders, out["png"], finetune=s["finetune_protocol"],
                              linear=s["linear_protocol"],
                              title=f"{s['finetune_protocol']} − {s['linear_protocol']} gap vs size "
                                    f"(regime {ctx.regime}; mean ± sd over tasks)")]


def family_fairness(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.scatter import subgroup_figure
    from retinabench.stats.fairness import subgroup_pairs
    table = subgroup_pairs(inputs["subgroups"], ctx.settings["subgroup_pairs"], metric=ctx.metric,
                           protocol=ctx.analysis_protocol_name, regime=ctx.regime, split=ctx.split)
    return [_write_csv(table.assign(protocol_role=_role(ctx, ctx.analysis_protocol_name)), out["table"]),
            *subgroup_figure(table, ctx.encoders, out["png"],
                             title=f"Subgroup {_metric_title(ctx, ctx.metric)} per encoder and dataset "
                                   f"({ctx.protocol_label}, regime {ctx.regime})")]


def family_sensitivity(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.bars import distance_bars, sensitivity_bars
    from retinabench.stats.distance import distance_rows, kruskal_table, with_groups
    from retinabench.stats.sensitivity import choices_from_sweep, lr_mean_ranks, lr_sensitivity
    s = ctx.settings
    sweep_task = (ctx.sweep_tasks or {}).get("sweep")
    choices = choices_from_sweep(inputs["lr_sweep"], metric=ctx.metric, regime=ctx.regime,
                                 reference_lr=s["lr_reference"], tasks=[sweep_task] if sweep_task else None)
    sens, frames = [], []
    meaning = ("positive = better relative rank at the sub-optimal lr than at the optimal one (less lr-sensitive "
               "than the other encoders)")
    for protocol, c in choices.groupby("protocol", sort=True):
        sens.append(lr_sensitivity(c).assign(protocol=protocol))
        if c["encoder"].nunique() >= 2:
            r_opt, r_sub = lr_mean_ranks(c)
            frames.append(distance_rows(f"optimal vs sub-optimal lr ({protocol})", "lr", "optimal lr",
                                        "sub-optimal lr", r_opt, r_sub, meaning))
    sens = pd.concat(sens, ignore_index=True)
    sens["size_class"] = [ctx.encoders.get(e, {}).get("size_class") for e in sens["encoder"]]
    order = [e for e in _order(inputs["ranks"], ctx) if e in set(sens["encoder"])]
    where = f"sweep task {sweep_task}" if sweep_task else "every swept task"
    paths = [_write_csv(sens, out["table"])]
    paths += sensitivity_bars(sens, ctx.encoders, out["png"], order=order,
                              xlabel=f"test {ctx.metric} drop: optimal − sub-optimal lr",
                              title=f"Learning-rate sensitivity on {where} (regime {ctx.regime})")
    if "png_srd" in out:
        if not frames:
            raise ValueError("learning-rate sensitivity: no protocol of the sweep has two or more encoders to rank")
        groups = ("size_class", "domain_group", "method_group")
        dist = with_groups(pd.concat(frames, ignore_index=True), ctx.encoders, groups)
        kw = kruskal_table(dist, ctx.alpha, groups)
        paths.append(_write_csv(dist, out["distance"]))
        paths += distance_bars(dist, kw, ctx.encoders, out["png_srd"], group_by="size_class",
                               title=f"Signed rank distance, optimal vs sub-optimal learning rate ({where})")
    return paths


def family_lr_transfer(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.scatter import lr_transfer_figure
    from retinabench.stats.sensitivity import lr_transfer_table
    tasks = ctx.sweep_tasks or {}
    if not tasks.get("sweep") or not tasks.get("check"):
        raise ValueError(f"learning-rate transfer needs a sweep task and a check task, got {tasks}")
    check_regime = tasks.get("check_regime") or ctx.regime
    table = lr_transfer_table(inputs["lr_grid"], inputs["lr_sweep"], metric=ctx.metric, regime=ctx.regime,
                              sweep_task=tasks["sweep"], check_task=tasks["check"], check_regime=check_regime)
    from retinabench.stats.baselines import select
    # each task's majority-class level in its own regime (the check task may be swept balanced)
    base = pd.concat([b[b["task"] == t] for t, r in ((tasks["sweep"], ctx.regime), (tasks["check"], check_regime))
                      for b in [select(inputs["baselines"], ctx.metric, "val", r)]], ignore_index=True)
    regimes = ctx.regime if check_regime == ctx.regime else f"{ctx.regime} / {check_regime}"
    pages = [out["png"]] + [out[k] for k in sorted((k for k in out if k.startswith("png_part")),
                                                   key=lambda k: int(k[len("png_part"):]))]
    return [_write_csv(table, out["table"]),
            *lr_transfer_figure(table, ctx.encoders, pages, baselines=base,
                                title=f"Transfer of the chosen learning rate: validation {ctx.metric} over the lr "
                                      f"grid, sweep task {tasks['sweep']} vs {tasks['check']} (regime {regimes})")]


def read_input(kind: str, path) -> pd.DataFrame:
    """One input table of a family (``path``: a file, or for ``manifests`` the list of the datasets' files)."""
    from retinabench.schemas import read_table
    if kind == "metrics":
        return read_table(path, "metrics")
    if kind == "ranks":
        return pd.read_parquet(path)
    if kind == "subgroups":
        from retinabench.stats.fairness import check_subgroups
        df = read_table(path)
        check_subgroups(df)
        return df
    if kind == "lr_sweep":
        from retinabench.stats.sensitivity import check_sweep
        df = read_table(path)
        check_sweep(df)
        return df
    if kind == "lr_grid":
        return read_table(path, "metrics")
    if kind == "manifests":
        return read_manifests(path)
    if kind == "baselines":
        from retinabench.stats.baselines import check_baselines
        return check_baselines(pd.read_csv(path, keep_default_na=False, na_values={"majority": [""],
                                                                                 "chance": [""]}))
    raise KeyError(f"unknown analysis input kind {kind!r}")


def family_function(family: str) -> Callable[[dict, AnalysisContext, dict], list[str]]:
    """The function of a family's record (FAMILIES[family].function), defined in this module."""
    return globals()[FAMILIES[family].function]


def run_family(family: str, inputs: dict[str, pd.DataFrame], ctx: AnalysisContext, out: dict[str, str]) -> list[str]:
    """Run one family on in-memory tables; returns the files written (each must be one of ``out``'s paths)."""
    if family not in FAMILIES:
        raise KeyError(f"unknown analysis family {family!r}; known: {sorted(FAMILIES)}")
    missing = [k for k in FAMILIES[family].inputs if k not in inputs]
    if missing:
        raise KeyError(f"analysis family {family!r} needs input(s) {missing}")
    from retinabench.progress import Progress
    bar = Progress(1, f"analysis {family}", unit="family")
    written = family_function(family)(inputs, ctx, out)
    bar.update(note=f"{len(written)} files: {', '.join(Path(p).name for p in written)}")
    unexpected = sorted(set(written) - set(out.values()))
    if unexpected:
        raise RuntimeError(f"analysis family {family!r} wrote files it did not declare: {unexpected}")
    not_written = sorted(set(out.values()) - set(written))
    if not_written:
        raise RuntimeError(f"analysis family {family!r} did not write {not_written}")
    return written
