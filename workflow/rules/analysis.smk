# Analysis stage: one tidy metrics table -> encoder ranks -> statistics, figures and tables, one job per figure
# family (never one per task). Which families run is decided from the config alone by
# retinabench.stages_analysis.analysis_outputs(): a family whose inputs this config does not produce (fewer than
# three encoders for a Friedman test, no augmented linear probe for the FT-LP gap, no sweep, ...) has no rule and
# no target. Single-protocol analyses run on fine-tuning when it is ranked, else on analysis.fallback_protocol. Figures are report() outputs with a caption (workflow/report/*.rst), grouped by section.
from retinabench.stages_analysis import AnalysisContext, analysis_outputs, family_inputs

ANALYSIS = AnalysisContext.from_config(config, REG, encoders=PLAN.encoders, tasks=PLAN.tasks,
                                       datasets=PLAN.datasets)
AOUT = analysis_outputs(ANALYSIS, R)
ANALYSIS_CODE = code_hash(*[f"stats/{m}.py" for m in ("ranks", "friedman", "agreement", "distance", "subsets",
                                                       "leakage", "protocols", "sensitivity", "fairness", "tables")],
                          *[f"figures/{m}.py" for m in ("style", "ranks", "cd", "agreement", "bars", "scatter")],
                          "stages_analysis.py")
# What the captions say the figures come from (the provenance sidecars hold the file-level chain).
ANALYSIS_RUNS = (f"{len(PLAN.encoders)} encoders ({', '.join(PLAN.encoders)}); {len(PLAN.tasks)} tasks "
                 f"({', '.join(PLAN.tasks)}); protocols {', '.join(config['protocols'])}; seeds "
                 f"{', '.join(map(str, config['seeds']))}; regimes {', '.join(config['regimes'])}; "
                 f"{ANALYSIS.split} split")

# family -> (rule name, {output key: (caption, report category, subcategory)}). Keys "png_<metric>" of the
# ranking families reuse the caption of "png" with a metric label.
RANKING, PROTOCOLS, SUBSETS, LEAKAGE, FAIRNESS, SENSITIVITY = ("1. Ranking", "2. Protocols", "3. Subsets",
                                                              "4. Leakage", "5. Fairness", "6. Sensitivity")
ANALYSIS_RULES = {
    "ranks": ("ranks", {}),
    "rank_figures": ("figure_rank_distribution", {"png": ("rank_distribution", RANKING, "Rank distributions")}),
    "tables": ("analysis_tables", {"ranking_csv": ("ranking_table", RANKING, "Tables"),
                                   "appendix_csv": ("appendix_table", RANKING, "Tables")}),
    "cd": ("critical_difference", {"png": ("cd_diagram", RANKING, "Critical difference")}),
    "protocol_heatmap": ("protocol_heatmap", {"png": ("protocol_rank_heatmap", PROTOCOLS, "Mean rank per protocol")}),
    "agreement": ("rank_agreement", {"png_protocols": ("spearman_protocols", PROTOCOLS, "Spearman correlation"),
                                     "png_regimes": ("spearman_regimes", PROTOCOLS, "Spearman correlation")}),
    "distance": ("signed_rank_distance",
                 {"png_protocols": ("srd_protocols", PROTOCOLS, "Signed rank distance"),
                  "png_subsets": ("srd_subsets", SUBSETS, "Signed rank distance")}),
    "ft_lp": ("ft_lp_gap", {"png": ("ft_lp_gap", PROTOCOLS, "Fine-tuning vs linear probe")}),
    "subsets": ("subset_ranks", {"png": ("subset_ranks", SUBSETS, "Mean rank by subset")}),
    "leakage": ("leakage", {"png": ("leakage_rank_change", LEAKAGE, "Rank change")}),
    "top_k": ("top_k", {"png": ("top_k", LEAKAGE, "Top encoders")}),
    "fairness": ("fairness", {"png": ("subgroup_accuracy", FAIRNESS, "Subgroups")}),
    "sensitivity": ("lr_sensitivity", {"png": ("lr_sensitivity", SENSITIVITY, "Learning rate"),
                                       "png_srd": ("srd_lr", SENSITIVITY, "Learning rate")}),
    "lr_transfer": ("lr_transfer", {"png": ("lr_transfer", SENSITIVITY, "Learning rate")}),
}


def analysis_targets():
    """Analysis outputs requested by `all` (only those whose inputs this config produces)."""
    return [path for outputs in AOUT.values() for path in outputs.values()]


def _reported_outputs(family):
    """The family's named outputs, figures (and report tables) wrapped in report() with caption and section."""
    spec = ANALYSIS_RULES[family][1]
    out = {}
    for key, path in AOUT[family].items():
        metric = key[len("png_"):] if key.startswith("png_") and key not in spec else None
        entry = spec.get(key) or (spec.get("png") if metric else None)
        if entry is None:
            out[key] = path
            continue
        caption, category, subcategory = entry
        out[key] = report(path, caption=f"../report/{caption}.rst", category=category, subcategory=subcategory,
                          labels={"figure": caption.replace("_", " "), "metric": metric or ANALYSIS.metric})
    return out


rule collect_metrics:
    input:
        metrics=all_metrics_files(),
    output:
        metrics=f"{R}/metrics.parquet",
        csv=f"{R}/metrics.csv",
    params:
        stage="collect_metrics",
    log:
        f"{R}/logs/collect_metrics.log",
    script:
        STAGE


for _family, (_rule_name, _spec) in ANALYSIS_RULES.items():
    if _family not in AOUT:
        continue

    rule:
        name:
            _rule_name
        input:
            **family_inputs(_family, R, ANALYSIS),
        output:
            **_reported_outputs(_family),
        params:
            stage=f"analysis_{_family}",
            code=ANALYSIS_CODE,
            runs=ANALYSIS_RUNS,
            **ANALYSIS.params_for(_family),
        log:
            f"{R}/logs/analysis/{_family}.log",
        script:
            STAGE
