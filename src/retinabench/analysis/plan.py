"""Which analysis families a config produces, their output paths, inputs and Snakemake rules — decided from the
config alone (the rules, the benchmark and the tests all use it)."""
from __future__ import annotations

from pathlib import Path

from retinabench.analysis.context import (BALANCED, FAMILIES, UNBALANCED, AnalysisContext)


# --------------------------------------------------------------------------------------------------------------
# What this config can produce
# --------------------------------------------------------------------------------------------------------------

def _subset_comparisons_exist(ctx: AnalysisContext) -> bool:
    from retinabench.stats.distance import subset_comparisons
    return bool(subset_comparisons(ctx.tasks, ctx.settings["subsets"], metric=ctx.metric,
                                   protocol=ctx.focus_protocol, regime=ctx.regime))


def _figure(paths: dict, key: str, base: str) -> None:
    paths[key] = f"{base}.png"
    paths[key.replace("png", "pdf", 1)] = f"{base}.pdf"


def analysis_outputs(ctx: AnalysisContext, results: str) -> dict[str, dict[str, str]]:
    """Per family this config can produce, its named outputs (PNG keys start with ``png``, each with a ``pdf``
    twin). Families whose inputs the config does not produce are absent (no empty placeholders)."""
    from retinabench.stats.leakage import high_leakage_datasets, informative_subsets, leakage_subsets
    from retinabench.stats.subsets import task_subsets
    R, A, F = results, f"{results}/analysis", f"{results}/figures"
    k, n_tasks = len(ctx.encoders), len(ctx.tasks)
    alts = [m for m in ctx.metrics if m != ctx.metric]
    out: dict[str, dict[str, str]] = {}
    out["ranks"] = {"ranks": f"{A}/ranks.parquet", "summary": f"{A}/rank_summary.csv"}
    figs: dict[str, str] = {}
    _figure(figs, "png", f"{F}/rank_distribution")
    for m in alts:
        _figure(figs, f"png_{m}", f"{F}/rank_distribution_{m}")
    out["rank_figures"] = figs
    out["tables"] = {"appendix_csv": f"{R}/tables/appendix.csv", "appendix_tex": f"{R}/tables/appendix.tex",
                     "ranking_csv": f"{R}/tables/ranking.csv", "ranking_tex": f"{R}/tables/ranking.tex"}
    if k >= 3 and n_tasks >= 2:
        cd = {"friedman": f"{A}/friedman.csv", "nemenyi": f"{A}/nemenyi.csv"}
        _figure(cd, "png", f"{F}/cd_diagram")
        for m in alts:
            _figure(cd, f"png_{m}", f"{F}/cd_diagram_{m}")
        out["cd"] = cd
    if len(ctx.protocols) >= 2 and any(r in ctx.regimes for r in (UNBALANCED, BALANCED)):
        heat: dict[str, str] = {}
        _figure(heat, "png", f"{F}/protocol_rank_heatmap")
        out["protocol_heatmap"] = heat
    if k >= 3:
        agree = {"table": f"{A}/rank_agreement.csv"}
        if len(ctx.protocols) >= 2 and any(r in ctx.regimes for r in (UNBALANCED, BALANCED)):
            _figure(agree, "png_protocols", f"{F}/spearman_protocols")
        if len(ctx.regimes) >= 2:
            _figure(agree, "png_regimes", f"{F}/spearman_regimes")
        if len(agree) > 1:
            out["agreement"] = agree
    if k >= 2:
        dist = {"table": f"{A}/signed_rank_distance.csv", "kruskal": f"{A}/kruskal_wallis.csv"}
        if len(ctx.protocols) >= 2:
            _figure(dist, "png_protocols", f"{F}/srd_protocols")
        if _subset_comparisons_exist(ctx):
            _figure(dist, "png_subsets", f"{F}/srd_subsets")
        if len(dist) > 2:
            out["distance"] = dist
    if task_subsets(ctx.tasks, ctx.settings["subsets"]):
        sub = {"table": f"{A}/subset_ranks.csv"}
        _figure(sub, "png", f"{F}/subset_ranks")
        out["subsets"] = sub
    lsub = leakage_subsets(ctx.tasks, ctx.encoders, ctx.datasets)
    if informative_subsets(lsub, list(ctx.tasks)):
        leak = {"table": f"{A}/leakage.csv"}
        _figure(leak, "png", f"{F}/leakage_rank_change")
        out["leakage"] = leak
    high = set(high_leakage_datasets(ctx.encoders, ctx.datasets))
    if any(m["dataset"] not in high for m in ctx.tasks.values()):
        top = {"table": f"{A}/top_k.csv"}
        _figure(top, "png", f"{F}/top_k")
        out["top_k"] = top
    s = ctx.settings
    run = set(ctx.protocols) | set(ctx.ft_protocols)
    if s["finetune_protocol"] in run and s["linear_protocol"] in run and \
            (s["finetune_protocol"] not in ctx.ft_protocols or ctx.regime in ctx.ft_regimes):
        ft = {"table": f"{A}/ft_lp_gap.csv"}
        _figure(ft, "png", f"{F}/ft_lp_gap")
        out["ft_lp"] = ft
    if ctx.subgroups_path:
        fair = {"table": f"{A}/subgroup_accuracy.csv"}
        _figure(fair, "png", f"{F}/subgroup_accuracy")
        out["fairness"] = fair
    if ctx.lr_source:
        lr = {"table": f"{A}/lr_sensitivity.csv"}
        _figure(lr, "png", f"{F}/lr_sensitivity")
        if (ctx.lr_encoders or k) >= 2:  # ranks at optimal vs sub-optimal lr need two encoders
            lr["distance"] = f"{A}/lr_signed_rank_distance.csv"
            _figure(lr, "png_srd", f"{F}/srd_lr")
        out["sensitivity"] = lr
    if ctx.lr_source and ctx.lr_grid:
        tr = {"table": f"{A}/lr_transfer.csv"}
        _figure(tr, "png", f"{F}/lr_transfer")
        out["lr_transfer"] = tr
    return out


def family_inputs(family: str, results: str, ctx: AnalysisContext) -> dict[str, str]:
    """Input paths of a family's job."""
    paths = {"metrics": f"{results}/metrics.parquet", "ranks": f"{results}/analysis/ranks.parquet"}
    if ctx.subgroups_path:
        paths["subgroups"] = str(Path(results) / ctx.subgroups_path)
    if ctx.lr_source:
        paths["lr_sweep"] = str(Path(results) / ctx.lr_source)
    if ctx.lr_grid:
        paths["lr_grid"] = str(Path(results) / ctx.lr_grid)
    return {k: paths[k] for k in FAMILIES[family].inputs}


def targets(outputs: dict[str, dict[str, str]]) -> list[str]:
    return [p for fam in outputs.values() for p in fam.values()]


# family -> (rule name, {output key: (caption, report category, subcategory)}). Keys "png_<metric>" of the
# ranking families reuse the caption of "png" with a metric label.
RANKING, PROTOCOLS, SUBSETS, LEAKAGE, FAIRNESS, SENSITIVITY = (
    "1. Ranking",
    "2. Protocols",
    "3. Subsets",
    "4. Leakage",
    "5. Fairness",
    "6. Sensitivity",
)
FAMILY_RULES = {
    "ranks": ("ranks", {}),
    "rank_figures": ("figure_rank_distribution", {"png": ("rank_distribution", RANKING, "Rank distributions")}),
    "tables": (
        "analysis_tables",
        {"ranking_csv": ("ranking_table", RANKING, "Tables"), "appendix_csv": ("appendix_table", RANKING, "Tables")},
    ),
    "cd": ("critical_difference", {"png": ("cd_diagram", RANKING, "Critical difference")}),
    "protocol_heatmap": ("protocol_heatmap", {"png": ("protocol_rank_heatmap", PROTOCOLS, "Mean rank per protocol")}),
    "agreement": (
        "rank_agreement",
        {
            "png_protocols": ("spearman_protocols", PROTOCOLS, "Spearman correlation"),
            "png_regimes": ("spearman_regimes", PROTOCOLS, "Spearman correlation"),
        },
    ),
    "distance": (
        "signed_rank_distance",
        {
            "png_protocols": ("srd_protocols", PROTOCOLS, "Signed rank distance"),
            "png_subsets": ("srd_subsets", SUBSETS, "Signed rank distance"),
        },
    ),
    "ft_lp": ("ft_lp_gap", {"png": ("ft_lp_gap", PROTOCOLS, "Fine-tuning vs linear probe")}),
    "subsets": ("subset_ranks", {"png": ("subset_ranks", SUBSETS, "Mean rank by subset")}),
    "leakage": ("leakage", {"png": ("leakage_rank_change", LEAKAGE, "Rank change")}),
    "top_k": ("top_k", {"png": ("top_k", LEAKAGE, "Top encoders")}),
    "fairness": ("fairness", {"png": ("subgroup_accuracy", FAIRNESS, "Subgroups")}),
    "sensitivity": (
        "lr_sensitivity",
        {"png": ("lr_sensitivity", SENSITIVITY, "Learning rate"), "png_srd": ("srd_lr", SENSITIVITY, "Learning rate")},
    ),
    "lr_transfer": ("lr_transfer", {"png": ("lr_transfer", SENSITIVITY, "Learning rate")}),
}


def family_of_rule(rule: str) -> str:
    """The analysis family a Snakemake rule runs (the inverse of :data:`FAMILY_RULES`)."""
    for family, (name, _) in FAMILY_RULES.items():
        if name == rule:
            return family
    raise KeyError(f"no analysis family for rule {rule!r}")
