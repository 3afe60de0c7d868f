"""Which analysis families a config produces, their output paths, inputs and Snakemake rules — decided from the
config alone (the rules, the benchmark and the tests all use it)."""
from __future__ import annotations

from pathlib import Path

from retinabench.analysis.context import FAMILIES, OCT_PANEL, AnalysisContext
from retinabench.plan.paths import Paths
from retinabench.regimes import BALANCED, UNBALANCED


# --------------------------------------------------------------------------------------------------------------
# What this config can produce
# --------------------------------------------------------------------------------------------------------------

def _subset_comparisons_exist(ctx: AnalysisContext) -> bool:
    from retinabench.stats.distance import subset_comparisons
    return bool(subset_comparisons(ctx.tasks, ctx.settings["subsets"], metric=ctx.metric,
                                   protocol=ctx.analysis_protocol_name, regime=ctx.regime))


def _figure(paths: dict, key: str, table: Paths, name: str) -> None:
    """A figure's PNG under ``key`` and its PDF twin (``png...`` -> ``pdf...``)."""
    paths[key] = table.path("figure", figure=name, ext="png")
    paths[key.replace("png", "pdf", 1)] = table.path("figure", figure=name, ext="pdf")


def analysis_outputs(ctx: AnalysisContext, results: str, skipped: list | None = None) -> dict[str, dict[str, str]]:
    """Per family this config can produce, its named outputs (PNG keys start with ``png``, each with a ``pdf``
    twin). Families whose inputs the config does not produce are absent (no empty placeholders); each figure or
    table left out is appended to ``skipped`` (rows of :mod:`retinabench.skipped`) with the reason."""
    from retinabench.skipped import record
    from retinabench.stats.leakage import high_leakage_datasets, informative_subsets, leakage_subsets
    from retinabench.stats.subsets import task_subsets
    skipped = [] if skipped is None else skipped

    def skip(output: str, reason: str) -> None:
        skipped.append(record(output, reason))

    P = Paths(results)

    def A(name: str, ext: str = "csv") -> str:
        return P.path("analysis_table", table=name, ext=ext)

    k, n_tasks = len(ctx.encoders), len(ctx.tasks)
    alts = [m for m in ctx.metrics if m != ctx.metric]
    out: dict[str, dict[str, str]] = {}
    out["ranks"] = {"ranks": A("ranks", "parquet"), "summary": A("rank_summary")}
    figs: dict[str, str] = {}
    _figure(figs, "png", P, "rank_distribution")
    for m in alts:
        _figure(figs, f"png_{m}", P, f"rank_distribution_{m}")
    lp = ctx.settings["linear_protocol"]
    no_lp = (f"the paper's linear probe (analysis.linear_protocol {lp}) is not ranked"
             if lp not in ctx.protocols else f"{lp} is the analysis protocol: the main figure shows it")
    if ctx.linear_probe:  # OcularBench Fig. 4: ranks under linear probing
        _figure(figs, "png_linear_probe", P, "rank_distribution_linear_probe")
    else:
        skip("rank_distribution_linear_probe", no_lp)
    out["rank_figures"] = figs
    out["tables"] = {f"{t}_{ext}": P.path("report_table", table=t, ext=ext) for t in ("appendix", "ranking")
                     for ext in ("csv", "tex")}
    if k >= 3 and n_tasks >= 2:
        cd = {"friedman": A("friedman"), "nemenyi": A("nemenyi")}
        _figure(cd, "png", P, "cd_diagram")
        for m in alts:
            _figure(cd, f"png_{m}", P, f"cd_diagram_{m}")
        if ctx.linear_probe:  # OcularBench Fig. A.3: the CD diagram under linear probing
            _figure(cd, "png_linear_probe", P, "cd_diagram_linear_probe")
        else:
            skip("cd_diagram_linear_probe", no_lp)
        out["cd"] = cd
    else:
        for name in ("cd_diagram", "cd_diagram_linear_probe"):
            skip(name, f"Friedman test, Nemenyi post-hoc and critical-difference diagrams need >= 3 encoders "
                       f"and >= 2 tasks; this run has {k} encoder(s) and {n_tasks} task(s)")
    paired_regime = any(r in ctx.regimes for r in (UNBALANCED, BALANCED))
    # Figures comparing protocols: the paper's protocols, and an `_extended` twin with the project's other probes
    # (AnalysisContext.protocol_sets).
    # (no skip row for an absent `_extended` twin: without other probes the main figure shows every protocol)
    sets = ctx.protocol_sets

    def protocol_figures(target: dict, key: str, name: str) -> None:
        """One figure per protocol set (paper's, `_extended`) comparing >= 2 ranked protocols in a paired regime."""
        for suffix, prots in sets.items():
            if len(prots) >= 2 and paired_regime:
                _figure(target, f"{key}{suffix}", P, f"{name}{suffix}")
            else:
                skip(f"{name}{suffix}", f"needs >= 2 ranked protocols (has {len(prots)}) and regime "
                                        f"{UNBALANCED} or {BALANCED}")

    heat: dict[str, str] = {}
    protocol_figures(heat, "png", "protocol_rank_heatmap")
    if heat:
        out["protocol_heatmap"] = heat
    if k >= 3:
        agree = {"table": A("rank_agreement")}
        protocol_figures(agree, "png_protocols", "spearman_protocols")
        if len(ctx.regimes) >= 2:
            _figure(agree, "png_regimes", P, "spearman_regimes")
        else:
            skip("spearman_regimes", f"needs >= 2 data regimes (has {len(ctx.regimes)})")
        if len(agree) > 1:
            out["agreement"] = agree
    else:
        for name in ("spearman_protocols", "spearman_regimes", *(["spearman_protocols_extended"]
                                                                 if "_extended" in sets else [])):
            skip(name, f"Spearman correlation between encoder rankings needs >= 3 encoders; this run has {k}")
    if k >= 2:
        dist = {"table": A("signed_rank_distance"), "kruskal": A("kruskal_wallis")}
        for suffix, prots in sets.items():
            if len(prots) >= 2:
                _figure(dist, f"png_protocols{suffix}", P, f"srd_protocols{suffix}")
            else:
                skip(f"srd_protocols{suffix}", f"signed rank distances between protocols need >= 2 ranked "
                                               f"protocols (has {len(prots)})")
        if _subset_comparisons_exist(ctx):
            _figure(dist, "png_subsets", P, "srd_subsets")
        else:
            skip("srd_subsets", "no task subset (analysis.subsets) leaves tasks on both sides of the comparison")
        if len(dist) > 2:
            out["distance"] = dist
    else:
        for name in ("srd_protocols", "srd_subsets", *(["srd_protocols_extended"] if "_extended" in sets else [])):
            skip(name, f"signed rank distances need >= 2 encoders; this run has {k}")
    if task_subsets(ctx.tasks, ctx.settings["subsets"]):
        sub = {"table": A("subset_ranks")}
        _figure(sub, "png", P, "subset_ranks")
        out["subsets"] = sub
    else:
        skip("subset_ranks", f"no task matches a subset of analysis.subsets {ctx.settings['subsets']}")
    lsub = leakage_subsets(ctx.tasks, ctx.encoders, ctx.datasets)
    if informative_subsets(lsub, list(ctx.tasks)):
        leak = {"table": A("leakage")}
        _figure(leak, "png", P, "leakage_rank_change")
        out["leakage"] = leak
    else:
        skip("leakage_rank_change", "no leakage subset differs from the full task set (no encoder's pretraining "
                                    "data includes a benchmark dataset and no dataset has a high web-exposure risk)")
    high = set(high_leakage_datasets(ctx.encoders, ctx.datasets))
    top: dict[str, str] = {}
    if any(m["dataset"] not in high for m in ctx.tasks.values()):
        top["table"] = A("top_k")
        _figure(top, "png", P, "top_k")
    else:
        skip("top_k", f"every task is from a high-leakage dataset ({', '.join(sorted(high))})")
    if any(m["modality"] == OCT_PANEL for m in ctx.tasks.values()):  # every OCT task, leakage not excluded
        top["table_oct"] = A(f"top_k_{OCT_PANEL}")
        _figure(top, f"png_{OCT_PANEL}", P, f"top_k_{OCT_PANEL}")
    else:
        skip(f"top_k_{OCT_PANEL}", f"no {OCT_PANEL.upper()} task")
    if top:
        out["top_k"] = top
    if ctx.attributes and ctx.datasets:  # OcularBench Table 1: sensitive attributes per dataset
        out["attributes"] = {f"attributes_{ext}": P.path("report_table", table="attribute_distribution", ext=ext)
                             for ext in ("csv", "tex")}
    else:
        skip("attribute_distribution", "no fairness attribute of reliability.attributes is named in "
                                       "analysis.subgroup_pairs" if ctx.datasets else "no dataset")
    s = ctx.settings
    run = set(ctx.protocols) | set(ctx.ft_protocols)
    ft, lp = s["finetune_protocol"], s["linear_protocol"]
    if ft in run and lp in run and (ft not in ctx.ft_protocols or ctx.regime in ctx.ft_regimes):
        gap = {"table": A("ft_lp_gap")}
        _figure(gap, "png", P, "ft_lp_gap")
        out["ft_lp"] = gap
    else:
        why = (f"{ft} and {lp} were not both run (finetune.enabled false, or a protocol missing)"
               if not (ft in run and lp in run) else f"fine-tuning does not cover the ranking regime {ctx.regime}")
        skip("ft_lp_gap", why)
    if ctx.subgroups_path:
        fair = {"table": A("subgroup_accuracy")}
        _figure(fair, "png", P, "subgroup_accuracy")
        out["fairness"] = fair
    else:
        skip("subgroup_accuracy", "no subgroup table (analysis.subgroup_metrics)")
    if ctx.lr_source:
        lr = {"table": A("lr_sensitivity")}
        _figure(lr, "png", P, "lr_sensitivity")
        if (ctx.lr_encoders or k) >= 2:  # ranks at optimal vs sub-optimal lr need two encoders
            lr["distance"] = A("lr_signed_rank_distance")
            _figure(lr, "png_srd", P, "srd_lr")
        else:
            skip("srd_lr", "ranks at the optimal vs sub-optimal learning rate need >= 2 swept encoders")
        out["sensitivity"] = lr
    else:
        for name in ("lr_sensitivity", "srd_lr"):
            skip(name, "no learning-rate sweep in the ranking regime (finetune.enabled / sweep.enabled false, or "
                       f"{ctx.regime} not in sweep.regimes)")
    if ctx.lr_source and ctx.lr_grid:
        from retinabench.figures import lr_transfer_pages
        tr = {"table": A("lr_transfer")}
        _figure(tr, "png", P, "lr_transfer")
        checked = len(ctx.sweep_tasks.get("check_encoders") or []) or ctx.lr_encoders or k
        for part in range(2, lr_transfer_pages(checked) + 1):  # one page per 10 encoders swept on both tasks
            _figure(tr, f"png_part{part}", P, f"lr_transfer_part{part}")
        out["lr_transfer"] = tr
    else:
        skip("lr_transfer", "needs the learning-rate sweep and a second fine-tuned task to check the chosen rate "
                            "on (sweep.sensitivity_task)" if ctx.lr_source else
                            "no learning-rate sweep (finetune.enabled / sweep.enabled false)")
    return out


def family_inputs(family: str, results: str, ctx: AnalysisContext) -> dict[str, str | list[str]]:
    """Input paths of a family's job (``manifests``: the config's datasets' manifests, a list)."""
    P = Paths(results)
    paths: dict[str, str | list[str]] = {
        "metrics": P.path("metrics"), "ranks": P.path("analysis_table", table="ranks", ext="parquet"),
        "baselines": baselines_path(results), "manifests": [P.path("manifest", dataset=d) for d in ctx.datasets]}
    if ctx.subgroups_path:
        paths["subgroups"] = str(Path(results) / ctx.subgroups_path)
    if ctx.lr_source:
        paths["lr_sweep"] = str(Path(results) / ctx.lr_source)
    if ctx.lr_grid:
        paths["lr_grid"] = str(Path(results) / ctx.lr_grid)
    return {k: paths[k] for k in FAMILIES[family].inputs}


def baselines_path(results: str) -> str:
    """The majority-class / chance table (rule ``baselines``, from the splits; stats.baselines)."""
    return Paths(results).path("baselines")


def targets(outputs: dict[str, dict[str, str]]) -> list[str]:
    return [p for fam in outputs.values() for p in fam.values()]
